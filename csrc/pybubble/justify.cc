// Scheduler::justify: a schedule justified. A filler places each task once, in one pass; a task
// placed early in it (one microbatch's chain, a piece's collectives) can hold a free interval that
// a later task of a longer chain needed, leaving gaps (the holes filler's interleaved order on the
// dual settings' pieces of two encoders: kernels of one encoder idle through its collectives while
// the other's wait their turn). Double justification
// (as for resource-constrained project schedules) packs each phase's tasks towards the end of the
// step away from the one it grows, then back, each task in turn by where the last pass put it, so
// that every task keeps its place in the lane's order and the gaps close:
//   - the forward: each task as early as possible from the first start, by increasing start; then
//     each as late as possible (by forward_needed of the LLM microbatch it feeds and its
//     successors' starts), by decreasing end of the first pass;
//   - the backward: each as late as possible up to the last end, by decreasing end; then each as
//     early as possible (from grad_ready and its predecessors' ends), by increasing start.
// The other phase stays where it is. A pass never moves a task past where it was (its old
// place is free when its turn comes: every task placed before it in the pass lay wholly on the
// side it moves to), so the step can only shrink; a phase's result is kept only where it does (a
// place a rounding error off can move a task further). The same algorithm in plain Python:
// pybubble/testing/justify.py (reference_justified).
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pybubble/free_intervals.h"
#include "pybubble/scheduler.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

const Schedule& Scheduler::justify(const Schedule& schedule) {
  const std::vector<std::string> wrong = validate(p_, schedule);  // sizes first: std::invalid_argument
  if (!wrong.empty()) throw std::invalid_argument("schedule: not valid for the problem: " + wrong.front());
  make_free();
  dur_ = p_.fields().duration.data();
  std::copy(schedule.start.begin(), schedule.start.end(), out_.start.begin());
  std::copy(schedule.assignment.begin(), schedule.assignment.end(), out_.assignment.begin());
  start_ = out_.start.data();
  justify_phases();
  finish();
  return out_;
}

void Scheduler::justify_phases() {
  const int32_t n = p_.num_tasks();
  if (packed_.size() != static_cast<size_t>(n)) packed_.resize(static_cast<size_t>(n));
  if (limit_.size() != static_cast<size_t>(n)) limit_.resize(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    end_[static_cast<size_t>(t)] = start_[t] + dur_[t];
    limit_[static_cast<size_t>(t)] = kInf;
  }
  for (int32_t t = 0; t < n; ++t) {  // a forward task ends before the backward tasks that follow it start
    if (p_.phase(t) != kBwd) continue;
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
      limit_[static_cast<size_t>(*q)] = std::min(limit_[static_cast<size_t>(*q)], start_[t]);
    }
  }
  justify_forward();
  justify_backward();
  first_start_ = 0.0;  // the extremes of what the phases kept
  last_end_ = p_.horizon();
  for (int32_t t = 0; t < n; ++t) {
    first_start_ = std::min(first_start_, start_[t]);
    last_end_ = std::max(last_end_, end_[static_cast<size_t>(t)]);
  }
}

// phase_: the tasks of phase ph, microbatch by microbatch. Every microbatch's tasks move, those
// inside the step too: they make room for the ones outside (on dual_2, moving only the microbatches with a
// task outside the step left it 3.6 ms longer, on weak_b 2.2 ms).
void Scheduler::phase_tasks(int ph) {
  phase_.clear();
  for (int32_t j = 0; j < p_.num_microbatches(); ++j) phase_.insert(phase_.end(), p_.tasks_begin(j, ph), p_.tasks_end(j, ph));
}

// phase_ by increasing (value(t), t), or (`descending`) by decreasing: as (key, id) pairs side by
// side, which sort far faster than ids compared through their values.
template <typename Value>
void Scheduler::sort_phase(Value&& value, bool descending) {
  sorting_.resize(phase_.size());
  for (size_t i = 0; i < phase_.size(); ++i) {
    const int32_t t = phase_[i];
    sorting_[i] = descending ? std::make_pair(-value(t), -t) : std::make_pair(value(t), t);
  }
  std::sort(sorting_.begin(), sorting_.end());
  for (size_t i = 0; i < phase_.size(); ++i) phase_[i] = descending ? -sorting_[i].second : sorting_[i].second;
}

// The free intervals: the windows, both ends of the step open, less the tasks of phase ph.
void Scheduler::occupy_phase(int ph) {
  free_->reset();
  free_->open_front();
  free_->open_back();
  for (int32_t j = 0; j < p_.num_microbatches(); ++j) {
    for (const int32_t* it = p_.tasks_begin(j, ph); it != p_.tasks_end(j, ph); ++it) {
      free_->occupy(key_[static_cast<size_t>(*it)], start_[*it], dur_[*it]);
    }
  }
}

// The forward justified (see above), kept where its first start moved later.
void Scheduler::justify_forward() {
  phase_tasks(kFwd);
  double first = 0.0;
  for (const int32_t t : phase_) first = std::min(first, start_[t]);
  if (!(first < 0.0)) return;  // the step does not grow before 0
  occupy_phase(kBwd);
  const size_t mark = free_->mark();
  sort_phase([&](int32_t t) { return start_[t]; }, false);
  for (const int32_t t : phase_) {  // as early as possible from the first start
    double ready = first, s = 0.0;
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
      ready = std::max(ready, packed_[static_cast<size_t>(*q)] + dur_[*q]);  // a forward task's are forward
    }
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->earliest(k, ready, dur_[t], kInf, &s);
    if (w < 0) return;
    free_->take(k, w, s, dur_[t]);
    packed_[static_cast<size_t>(t)] = s;
  }
  free_->undo(mark);
  sort_phase([&](int32_t t) { return packed_[static_cast<size_t>(t)] + dur_[t]; }, true);
  const auto& fn = p_.fields().forward_needed;
  double moved = 0.0;  // the new first start
  for (const int32_t t : phase_) {  // as late as possible: alt_ holds the new starts
    double late = std::min(fn[static_cast<size_t>(out_.assignment[static_cast<size_t>(p_.microbatch(t))])],
                           limit_[static_cast<size_t>(t)]), s = 0.0;
    for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) late = std::min(late, alt_[static_cast<size_t>(*q)]);
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->latest(k, late, dur_[t], -kInf, &s);
    if (w < 0) return;
    free_->take(k, w, s, dur_[t]);
    alt_[static_cast<size_t>(t)] = s;
    moved = std::min(moved, s);
  }
  free_->forget();
  if (!(moved > first)) return;
  for (const int32_t t : phase_) {
    start_[t] = alt_[static_cast<size_t>(t)];
    end_[static_cast<size_t>(t)] = start_[t] + dur_[t];
  }
}

// The backward justified (see above), kept where its last end moved earlier.
void Scheduler::justify_backward() {
  phase_tasks(kBwd);
  const double horizon = p_.horizon();
  double last = horizon;
  for (const int32_t t : phase_) last = std::max(last, end_[static_cast<size_t>(t)]);
  if (!(last > horizon)) return;  // the step does not grow after the horizon
  occupy_phase(kFwd);
  const size_t mark = free_->mark();
  const auto& gr = p_.fields().grad_ready;
  const auto ready_of = [&](int32_t t) { return gr[static_cast<size_t>(out_.assignment[static_cast<size_t>(p_.microbatch(t))])]; };
  sort_phase([&](int32_t t) { return end_[static_cast<size_t>(t)]; }, true);
  for (const int32_t t : phase_) {  // as late as possible up to the last end
    double late = last, s = 0.0;
    for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) {
      late = std::min(late, packed_[static_cast<size_t>(*q)]);  // successors of its own phase
    }
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->latest(k, late, dur_[t], ready_of(t), &s);
    if (w < 0) return;
    free_->take(k, w, s, dur_[t]);
    packed_[static_cast<size_t>(t)] = s;
  }
  free_->undo(mark);
  sort_phase([&](int32_t t) { return packed_[static_cast<size_t>(t)]; }, false);
  double moved = horizon;  // the new last end
  for (const int32_t t : phase_) {  // as early as possible: alt_ holds the new starts
    double ready = ready_of(t), s = 0.0;
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
      ready = std::max(ready, p_.phase(*q) == kBwd ? alt_[static_cast<size_t>(*q)] + dur_[*q] : end_[static_cast<size_t>(*q)]);
    }
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->earliest(k, ready, dur_[t], kInf, &s);
    if (w < 0) return;
    free_->take(k, w, s, dur_[t]);
    alt_[static_cast<size_t>(t)] = s;
    moved = std::max(moved, s + dur_[t]);
  }
  free_->forget();
  if (!(moved < last)) return;
  for (const int32_t t : phase_) {
    start_[t] = alt_[static_cast<size_t>(t)];
    end_[static_cast<size_t>(t)] = start_[t] + dur_[t];
  }
}

}  // namespace pybubble
