// The free time of each (lane, resource) of a problem as sorted, disjoint intervals, cut as tasks
// take time out of them: the state of the holes filler (Policy::kHoles). A log undoes a trial.
#pragma once

#include <cstdint>
#include <vector>

#include "pybubble/problem.h"
#include "pybubble/scheduler.h"

namespace pybubble {

/// Free pieces shorter than this (us) are dropped when a task cuts an interval.
constexpr double kSliver = 1e-9;

/// Per key (2 lane + resource), the free intervals [start, end) left, in increasing time. Each key's
/// intervals sit in a slab of their own with a gap where the last one was cut: the tasks of a chain
/// cut intervals near each other, so an insertion or erasure moves only what lies between the gap
/// and it, not the rest of the lane.
class FreeIntervals {
 public:
  /// Room for `problem`'s windows and, per key, one more interval for each of its
  /// `tasks_per_key[key]` tasks and for each end of the step. Keeps a reference to `problem`.
  FreeIntervals(const Problem& problem, const std::vector<int64_t>& tasks_per_key);

  /// The problem's windows, those that touch merged; an empty log.
  void reset();
  /// The first interval of key k holding a task of length d that starts at or after `ready` and
  /// ends by `limit`: its index, the start written to `*start`; -1 when there is none.
  int64_t earliest(int32_t k, double ready, double d, double limit, double* start) const;
  /// The last interval of key k holding a task of length d that ends by `late` and starts at or
  /// after `floor`: its index, the start written to `*start`; -1 when there is none.
  int64_t latest(int32_t k, double late, double d, double floor, double* start) const;
  /// Takes [start, start + d) out of interval i of key k (nothing when d is not > 0); the pieces
  /// left shorter than kSliver go.
  void take(int32_t k, int64_t i, double start, double d);
  /// Takes [start, start + d) out of whatever intervals of key k it overlaps: a task placed before,
  /// put back where it was. A place found in another order of takes can lie a rounding error past
  /// its interval's end, which take() at a found start would not allow.
  void occupy(int32_t k, double start, double d);

  /// Where the log stands: undo(mark()) later gives back everything taken since.
  size_t mark() const { return log_.size(); }
  /// Undoes every change logged after `mark`, latest first.
  void undo(size_t mark);
  /// Keeps what was taken: the log emptied.
  void forget() { log_.clear(); }

  /// Adds (-inf, 0) to every key (merged into a first interval that starts at 0).
  void open_front();
  /// Removes it again: a first interval from -inf ends at 0 or before (gone) or starts at 0.
  void close_front();
  /// Adds (horizon, inf) to every key (merged into a last interval that reaches the horizon).
  void open_back();

  int64_t size(int32_t k) const { return count_[static_cast<size_t>(k)]; }
  double start(int32_t k, int64_t i) const { return s_[at(k, i)]; }
  double end(int32_t k, int64_t i) const { return e_[at(k, i)]; }

 private:
  enum Op : uint8_t { kSetStart, kSetEnd, kInserted, kErased };
  struct Change {
    int32_t key;
    Op op;
    int64_t i;
    double a, b;  // the old start or end; an erased interval's start and end
  };
  /// Where interval i of key k lies in the slabs.
  size_t at(int32_t k, int64_t i) const {
    const size_t kk = static_cast<size_t>(k);
    return static_cast<size_t>(base_[kk] + (i < gap_[kk] ? i : i + base_[kk + 1] - base_[kk] - count_[kk]));
  }
  void move_gap(int32_t k, int64_t i);
  void insert(int32_t k, int64_t i, double a, double b);
  void erase(int32_t k, int64_t i);

  const Problem& p_;
  std::vector<int64_t> base_;   // per key: its first slot; base_[k + 1] - base_[k] slots
  std::vector<int64_t> count_;  // per key: intervals held
  std::vector<int64_t> gap_;    // per key: the intervals before its gap (the gap fills the free slots)
  Buffer<double> s_, e_;
  std::vector<Change> log_;
};

}  // namespace pybubble
