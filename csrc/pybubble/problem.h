// The bubble-filling problem (pybubble.problem/1) as flat arrays, checked before it is trusted.
#pragma once

#include <cstddef>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "pybubble/limits.h"

namespace pybubble {

/// Which unit of a lane a task occupies: the compute units or the network link.
enum Resource : uint8_t { kCompute = 0, kComm = 1 };
/// Whether a task belongs to the encoder's forward or backward pass.
enum Phase : uint8_t { kFwd = 0, kBwd = 1 };

/// Free windows of one resource over all lanes, in CSR layout: the windows of lane l are
/// indices [offset[l], offset[l + 1]) of `start`/`end`, sorted and disjoint.
struct WindowSet {
  std::vector<int64_t> offset;  ///< size num_lanes + 1
  std::vector<double> start;    ///< window starts (us)
  std::vector<double> end;      ///< window ends (us)
};

/// The raw fields of a pybubble.problem/1, as the Python loader (or a C++ caller) hands them in.
/// Nothing here is trusted: `Problem::Problem` checks every field.
struct ProblemInput {
  double horizon = 0.0;             ///< the LLM-only step time (us)
  int64_t num_lanes = 0;            ///< number of lanes
  WindowSet compute_free;           ///< windows where the LLM leaves the compute units idle
  WindowSet link_free;              ///< windows where the LLM leaves the network idle
  std::vector<double> forward_needed;  ///< F_k per LLM microbatch k
  std::vector<double> grad_ready;      ///< B_k per LLM microbatch k
  std::vector<int64_t> lane;        ///< lane of each task
  std::vector<int64_t> microbatch;  ///< encoder microbatch of each task
  std::vector<double> duration;     ///< duration of each task (us)
  std::vector<int64_t> resource;    ///< Resource of each task (0 compute, 1 comm)
  std::vector<int64_t> phase;       ///< Phase of each task (0 fwd, 1 bwd)
  std::vector<int64_t> after_offset;  ///< CSR offsets into `after`, size num_tasks + 1
  std::vector<int64_t> after;         ///< predecessor ids
};

/// Every array of a ProblemInput, once: X(group, name, element type, member, limit, limit name,
/// extra). `group` is empty for a top-level array; the array holds at most limit + extra entries
/// (limits.h). The bindings read `arrays.group.name` (or `arrays.name`) into `member`, check its
/// dtype and length and write it back through this list.
#define PYBUBBLE_PROBLEM_ARRAYS(X)                                                               \
  X(compute_free, offset, int64_t, compute_free.offset, kMaxLanes, "lanes", 1)                   \
  X(compute_free, start, double, compute_free.start, kMaxWindows, "windows", 0)                  \
  X(compute_free, end, double, compute_free.end, kMaxWindows, "windows", 0)                      \
  X(link_free, offset, int64_t, link_free.offset, kMaxLanes, "lanes", 1)                         \
  X(link_free, start, double, link_free.start, kMaxWindows, "windows", 0)                        \
  X(link_free, end, double, link_free.end, kMaxWindows, "windows", 0)                            \
  X(, forward_needed, double, forward_needed, kMaxMicrobatches, "microbatches", 0)               \
  X(, grad_ready, double, grad_ready, kMaxMicrobatches, "microbatches", 0)                       \
  X(tasks, lane, int64_t, lane, kMaxTasks, "tasks", 0)                                           \
  X(tasks, microbatch, int64_t, microbatch, kMaxTasks, "tasks", 0)                               \
  X(tasks, resource, int64_t, resource, kMaxTasks, "tasks", 0)                                   \
  X(tasks, phase, int64_t, phase, kMaxTasks, "tasks", 0)                                         \
  X(tasks, after_offset, int64_t, after_offset, kMaxTasks, "tasks", 1)                           \
  X(tasks, after, int64_t, after, kMaxPredecessors, "predecessors", 0)                           \
  X(tasks, duration, double, duration, kMaxTasks, "tasks", 0)

/// A checked problem plus the indexes the scheduler and validator walk. All fields are read-only
/// after construction.
class Problem {
 public:
  /// Checks `in` and builds the indexes. Throws std::invalid_argument naming the first bad field
  /// in the JSON's terms, e.g. "tasks[17].after[0]: 23 is not < 17".
  explicit Problem(ProblemInput in);
  /// `like`'s horizon, lanes, windows and microbatches with the tasks of `tasks` (its other fields
  /// are ignored): the windows are shared, not copied or checked again, the tasks checked as the
  /// constructor above checks them. For many problems on the same bubbles (a search's candidates).
  Problem(const Problem& like, ProblemInput tasks);
  /// `like`'s bubbles with the tasks of `blocks` one after another: block b, a problem on the same
  /// bubbles (made `like` them) whose tasks all belong to microbatch 0, repeated counts[b] times,
  /// each copy a microbatch of its own, numbered from 0 in order, its task ids and predecessors
  /// shifted into place. The blocks' tasks were checked when they were made, so a joined problem
  /// costs copying them alone (a search's candidates, each a partition of the same microbatches).
  /// Throws std::invalid_argument when a block is on other bubbles or holds another microbatch, a
  /// count is negative, or the copies exceed the microbatches or the limits on tasks.
  Problem(const Problem& like, const std::vector<const Problem*>& blocks, const std::vector<int64_t>& counts);

  double horizon() const { return in_.horizon; }
  int32_t num_lanes() const { return static_cast<int32_t>(in_.num_lanes); }
  int32_t num_tasks() const { return static_cast<int32_t>(in_.duration.size()); }
  int32_t num_microbatches() const { return static_cast<int32_t>(in_.forward_needed.size()); }
  /// The windows of resource r (kCompute -> compute_free, kComm -> link_free).
  const WindowSet& windows(int r) const { return r == kCompute ? *compute_free_ : *link_free_; }
  /// The horizon, lanes, microbatches and tasks as given; its compute_free and link_free are
  /// empty (the windows are windows(r), shared between the problems made `like` this one).
  const ProblemInput& fields() const { return in_; }
  /// A copy of every field, the windows included (to build a changed problem from).
  ProblemInput input() const;

  int32_t lane(int32_t t) const { return lane_[t]; }
  int32_t microbatch(int32_t t) const { return microbatch_[t]; }
  uint8_t resource(int32_t t) const { return resource_[t]; }
  uint8_t phase(int32_t t) const { return phase_[t]; }
  double duration(int32_t t) const { return in_.duration[t]; }

  /// Predecessors of task t: [pred_begin(t), pred_end(t)) of pred_ids().
  const int32_t* pred_begin(int32_t t) const { return pred_.data() + pred_off_[t]; }
  const int32_t* pred_end(int32_t t) const { return pred_.data() + pred_off_[t + 1]; }
  /// Successors of the same phase as t, in increasing id order.
  const int32_t* succ_begin(int32_t t) const { return succ_.data() + succ_off_[t]; }
  const int32_t* succ_end(int32_t t) const { return succ_.data() + succ_off_[t + 1]; }
  /// Tasks of encoder microbatch j and phase ph, in increasing id order.
  const int32_t* tasks_begin(int32_t j, int ph) const {
    return mb_tasks_.data() + mb_off_[static_cast<size_t>(2 * j + ph)];
  }
  const int32_t* tasks_end(int32_t j, int ph) const {
    return mb_tasks_.data() + mb_off_[static_cast<size_t>(2 * j + ph + 1)];
  }

 private:
  /// Checks the tasks of in_ against its lanes and microbatches and builds their indexes.
  void index_tasks();

  ProblemInput in_;  // windows moved out into compute_free_ and link_free_
  std::shared_ptr<const WindowSet> compute_free_, link_free_;
  std::vector<int32_t> lane_, microbatch_;
  std::vector<uint8_t> resource_, phase_;
  std::vector<int64_t> pred_off_, succ_off_, mb_off_;
  std::vector<int32_t> pred_, succ_, mb_tasks_;
};

/// The longest dependency paths by duration through `p`'s forward tasks and through its backward
/// tasks (a predecessor of the other phase does not count): counting every task, then counting
/// compute tasks only (communication as 0). Returns {forward, backward, forward compute, backward
/// compute} (us).
std::array<double, 4> longest_paths(const Problem& p);

}  // namespace pybubble
