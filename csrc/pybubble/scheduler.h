// The bubble scheduler: packs encoder kernel tasks into the idle windows of an LLM step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pybubble/problem.h"

namespace pybubble {

class FreeIntervals;

/// How tasks are placed.
enum class Policy : uint8_t {
  /// Every forward task before the LLM starts (packed as late as possible before 0), every
  /// backward task after it ends (as early as possible from the horizon).
  kCoarse = 0,
  /// Coarse, then each encoder microbatch moved into the windows inside the step, whole when it
  /// fits there, else the longest run of its kernels that fits (forward: the last kernels, in
  /// microbatch order; backward: the first kernels, in decreasing order of grad_ready).
  kGreedy = 1,
  /// The greedy's rules with every cursor replaced by the free intervals left on its lane and
  /// resource (FreeIntervals): a task goes into the earliest (forward) or latest (backward) free
  /// interval that holds it, so later microbatches use the time earlier ones passed over; the parts
  /// outside the step too. Five orders (numbered 0-4), the shortest step kept (ties: the first):
  /// the greedy's; forwards by decreasing forward_needed, each its longest suffix that fits as late
  /// as possible; that and backwards by increasing grad_ready, each its longest prefix as early as
  /// possible; that with the tasks outside the step interleaved across microbatches (whichever can
  /// end latest before the step, start earliest after it, next; a chain's run of kernels between
  /// two collectives kept together; a microbatch's phase inside the step only whole), so one
  /// microbatch's kernels run while another's collectives do (only where some lane runs a kernel
  /// after its own collective);
  /// and by pieces (only where a microbatch's phase holds several chains: holes.cc).
  kHoles = 2,
};

/// Parses "coarse", "greedy" or "holes"; throws std::invalid_argument for anything else.
Policy parse_policy(const std::string& name);

/// A pybubble.schedule/1: task start times in the LLM frame and the microbatch assignment.
struct Schedule {
  std::vector<double> start;          ///< start of each task (us)
  std::vector<int64_t> assignment;    ///< encoder microbatch j -> LLM microbatch it feeds
  double step_time = 0.0;             ///< max(horizon, last end) - min(0, first start)
  double shift_front = 0.0;           ///< how far the step grows before 0
  double shift_back = 0.0;            ///< how far the step grows after the horizon
};

/// A vector whose new elements are default-initialised (left as they are for numbers): the
/// scheduler's buffers are written before they are read, so sizing them costs no pass over memory.
template <typename T>
struct DefaultInit : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInit<U>;
  };
  DefaultInit() = default;
  template <typename U>
  DefaultInit(const DefaultInit<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <typename T>
using Buffer = std::vector<T, DefaultInit<T>>;

/// Schedules one problem, many times if needed (online rescheduling with new durations).
/// All memory is allocated in the constructor; `run` allocates nothing per task.
class Scheduler {
 public:
  /// Keeps a reference to `problem`, which must outlive the scheduler.
  explicit Scheduler(const Problem& problem);
  /// Hands its largest buffers to the next scheduler made on this thread (a search makes one per
  /// candidate: their memory is reused, not allocated and faulted in again).
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Schedules with the problem's own durations, or with `durations` (num_tasks values, each
  /// finite and >= 0, else std::invalid_argument). The result stays valid until the next run.
  /// `fixed_assignment`: encoder microbatch j feeds LLM microbatch j (its data belongs to that
  /// microbatch, so its tasks' durations are those of its own data); otherwise the scheduler may
  /// feed the LLM microbatches in the order the encoder's forwards finish. `orders` (Policy::kHoles
  /// only): which of the holes filler's kHolesOrders orders to try, bit i for order i (holes.cc; an
  /// order that does not apply to the problem runs as order 2), the shortest kept; 1..kAllOrders,
  /// else std::invalid_argument.
  const Schedule& run(Policy policy, const std::vector<double>* durations = nullptr, bool fixed_assignment = false,
                      unsigned orders = kAllOrders);

  /// `schedule` (a valid schedule of the problem with its own durations, of any policy) justified
  /// (justify.cc): each phase's tasks packed towards the end of the step away from the one it grows,
  /// then back, each in turn by where the last pass put it, which closes the gaps a one-pass
  /// placement leaves; a phase kept moved only where the step shrinks, so never longer. The result
  /// stays valid until the next run. std::invalid_argument when `schedule` does not match the
  /// problem's sizes or is not valid (the validator's first violation).
  const Schedule& justify(const Schedule& schedule);

  /// The holes order (0..kHolesOrders - 1) that gave the last run's schedule; -1 after a run of
  /// another policy.
  int holes_order() const { return holes_order_; }

  /// The number of the holes filler's orders, and the mask of all of them.
  static constexpr int kHolesOrders = 5;
  static constexpr unsigned kAllOrders = (1u << kHolesOrders) - 1;

 private:
  friend class ReplicaScheduler;
  /// run() on `durations` already checked (num_tasks values, each finite, >= 0 and <= kMaxTime),
  /// the starts written to `start` (num_tasks values) instead of the result's `start`, which it
  /// leaves as it was; the rest of the result as run() gives it.
  void place(Policy policy, const double* durations, bool fixed_assignment, double* start);

  struct Cursor {
    double time;
    int64_t window;
  };
  void checkpoint();
  bool roll_back(int32_t j, int ph);
  bool place_forward_in_step(int32_t j, int64_t first);
  int64_t forward_suffix(int32_t j);
  void place_forward_front(int32_t j);
  void choose_assignment(bool fixed);
  void build_backward_windows();
  bool place_backward_in_step(int32_t j, int64_t last);
  int64_t backward_prefix(int32_t j);
  void place_backward_back(int32_t j);
  void finish();
  // Policy::kHoles (holes.cc): each order into `alt_`, the shortest step kept in `start_`.
  void place_holes(bool fixed_assignment);
  double fill_holes(bool forward_late, bool backward_early, bool interleaved, bool pieces, bool fixed_assignment);
  void holes_front(bool interleaved);
  template <typename F>
  void for_rest(int ph, F&& f);
  template <typename Queue, typename Key, typename Put>
  void interleave(int ph, Key&& key_of, Put&& put);
  void holes_forward(int32_t j, bool late, bool whole = false);
  bool holes_forward_in_step(int32_t j, int64_t first);
  int64_t holes_forward_suffix(int32_t j, bool keep, bool whole = false);
  void holes_backward(int32_t j, bool early, bool whole = false);
  bool holes_backward_in_step(int32_t j, int64_t last);
  int64_t holes_backward_prefix(int32_t j, bool keep, bool whole = false);
  void holes_forward_pieces(int32_t j);
  void holes_backward_pieces(int32_t j);
  void holes_outside(bool interleaved);
  void holes_place(int32_t t, int64_t w, double s);
  bool holes_drop(int32_t j, int ph, size_t mark);
  void make_free();
  // justify() (justify.cc): the passes on start_ and out_.assignment.
  void justify_phases();
  void justify_forward();
  void justify_backward();
  void phase_tasks(int ph);
  void occupy_phase(int ph);
  template <typename Value>
  void sort_phase(Value&& value, bool descending);

  const Problem& p_;
  const double* dur_ = nullptr;
  double* start_ = nullptr;  // where the starts go: the result's or a caller's (place)
  int32_t keys_ = 0;  // 2 * num_lanes: one cursor per (lane, resource)
  Buffer<int32_t> key_;  // per task: 2 lane + resource
  std::vector<uint8_t> local_pred_, local_succ_;  // per task: its predecessors / successors all on its key
  double first_start_ = 0.0, last_end_ = 0.0;  // min(0, starts) and max(horizon, ends) so far
  Buffer<double> end_;
  std::vector<Cursor> cursor_, saved_;
  std::vector<uint8_t> inside_;           // task placed inside the step
  std::vector<int64_t> fwd_first_;        // forward positions >= this run inside the step
  std::vector<int64_t> bwd_last_;         // backward positions < this run inside the step
  std::vector<double> probe_time_;        // per key, during a probe
  Buffer<double> probe_mark_;            // per task, during a probe (start or end)
  std::vector<double> finish_;
  std::vector<int32_t> order_;
  // Windows for backward tasks: the problem's windows less the forward tasks placed in them.
  // CSR over keys (2 l + r).
  std::vector<int64_t> bw_off_;
  Buffer<double> bw_start_, bw_end_;
  std::vector<int64_t> fwd_key_off_;  // forward tasks per key, (microbatch, id) order: CSR
  Buffer<int32_t> fwd_key_;
  Schedule out_;
  std::unique_ptr<FreeIntervals> free_;  // made on the first run of Policy::kHoles
  Buffer<double> alt_;                   // kHoles: the starts of the order being tried; justify: of its last pass
  std::vector<int64_t> alt_assignment_;
  std::vector<uint8_t> rest_;     // kHoles, interleaved: task not inside the step, placed after it
  std::vector<int32_t> waiting_;  // kHoles, interleaved: its neighbours of rest_ not yet placed
  bool collectives_ = false;      // kHoles: some lane runs a kernel after its own collective
  bool pieces_ = false;           // kHoles: some microbatch's phase holds several chains
  unsigned orders_ = kAllOrders;  // kHoles: the orders run() was asked to try
  int holes_order_ = -1;          // kHoles: the order that gave the last schedule
  std::vector<uint8_t> skipped_;  // kHoles, by pieces: task left out of the step by its microbatch's probe
  std::vector<int32_t> phase_;    // justify: the tasks of one phase
  std::vector<std::pair<double, int32_t>> sorting_;  // justify: phase_ with its sort keys
  Buffer<double> packed_;         // justify: per task, its start in the first pass
  Buffer<double> limit_;          // justify: per task, the first start of a backward task after it
};

/// The floor the scheduler's speed is measured against: one pass over the tasks in id order, each
/// placed first-fit, in the first window of its lane and resource that holds it after its
/// predecessors and the lane's previous task (after the horizon if none does). Writes the starts
/// into `start` (resized to num_tasks) and returns the last end. Ignores deadlines and
/// microbatches: not a valid schedule in general, only the least work that a scheduler filling the
/// same windows with the same tasks does.
double first_fit_floor(const Problem& problem, std::vector<double>& start);

/// One-shot convenience: Scheduler(problem).run(policy).
Schedule schedule(const Problem& problem, Policy policy);

}  // namespace pybubble
