// Rescheduling one problem for every data-parallel replica of a step at once: replica k's encoder
// microbatch j costs scale[k][j] times what the problem holds. The replicas are split over threads
// inside the core, and a problem made of twin lanes (twins.h) is scheduled as one copy.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pybubble/problem.h"
#include "pybubble/scheduler.h"

namespace pybubble {

/// Every replica's schedule of one call, in compact rows: replica k's task t starts at
/// start[k * tasks + t / copies].
struct ReplicaSchedules {
  int64_t replicas = 0;
  int32_t copies = 1;                ///< twin copies of the problem (twins.h): tasks per row entry
  int32_t tasks = 0;                 ///< entries per row: the problem's tasks / copies
  int32_t microbatches = 0;          ///< entries per row of `assignment`
  std::vector<double> start;         ///< replicas x tasks (us)
  std::vector<int64_t> assignment;   ///< replicas x microbatches
  std::vector<double> step_time;     ///< per replica (us), as Schedule
  std::vector<double> shift_front;   ///< per replica (us)
  std::vector<double> shift_back;    ///< per replica (us)
  std::vector<double> seconds;       ///< per replica: the wall seconds of its reschedule

  /// Replica k's schedule with one start per task of the problem (the row expanded).
  Schedule schedule(int64_t k) const;
};

/// Keeps one problem's structure and reschedules it for many replicas, each with encoder
/// microbatch j's tasks scaled: replica k's task t lasts duration[t] * scale[k][microbatch(t)],
/// the product as Scheduler::run would be handed it. Each replica's schedule is exactly
/// Scheduler(problem).run(policy, &those durations, fixed_assignment). Memory is allocated in the
/// constructor (one Scheduler per thread) and reused by every call.
class ReplicaScheduler {
 public:
  /// Keeps a reference to `problem`, which must outlive the scheduler. `threads` >= 1 (else
  /// std::invalid_argument naming it): replica k runs on thread k % threads, the calling thread
  /// being thread 0.
  ReplicaScheduler(const Problem& problem, int32_t threads, Policy policy, bool fixed_assignment);
  ~ReplicaScheduler();

  /// The twin copies the problem is scheduled as one of (1: none).
  int32_t copies() const { return copies_; }
  int32_t threads() const { return threads_; }
  /// Columns of `scale`: the problem's microbatches.
  int32_t microbatches() const { return problem_.num_microbatches(); }

  /// Reschedules `replicas` replicas: `scale` is replicas x num_microbatches, row-major, each
  /// value finite, >= 0 and keeping every duration <= kMaxTime (std::invalid_argument naming
  /// scale[k, j] otherwise, before any is scheduled). Fills `out`, reusing its memory.
  void run(const double* scale, int64_t replicas, ReplicaSchedules& out);

 private:
  void run_part(int32_t part, const double* scale, ReplicaSchedules& out);

  const Problem& problem_;
  int32_t threads_;
  Policy policy_;
  bool fixed_;
  int32_t copies_ = 1;
  std::unique_ptr<Problem> folded_;  // one copy's problem, when copies_ > 1
  const Problem* target_;            // what the schedulers run: folded_ or problem_
  std::vector<double> longest_;      // per microbatch, its longest task
  struct Span {
    int32_t begin, end, microbatch;
  };
  std::vector<Span> spans_;          // runs of consecutive tasks of one microbatch
  std::vector<std::unique_ptr<Scheduler>> schedulers_;  // one per thread
  std::vector<std::vector<double>> durations_;          // one buffer per thread
};

}  // namespace pybubble
