// Policy::kHoles: the greedy's rules (scheduler.cc) with every cursor replaced by the free intervals
// left on its lane and resource. The same algorithm in plain Python: pybubble/testing/holes.py.
#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "pybubble/cancel.h"
#include "pybubble/free_intervals.h"
#include "pybubble/scheduler.h"

namespace pybubble {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// A task ready to be placed outside the step in an interleaved order: its priority (its time bound,
// or that of the run of kernels it continues), its time bound (latest end of a forward task,
// earliest start of a backward one), its microbatch and id.
struct Ready {
  double prio, time;
  int32_t j, t;
  bool operator<(const Ready& o) const { return std::tie(prio, j, t) < std::tie(o.prio, o.j, o.t); }
  bool operator>(const Ready& o) const { return o < *this; }
};
}  // namespace

// The holes filler's state, made on its first use (a run of Policy::kHoles, or justify()).
void Scheduler::make_free() {
  const size_t n = static_cast<size_t>(p_.num_tasks());
  if (!free_) {
    std::vector<int64_t> per_key(static_cast<size_t>(keys_), 0);
    for (size_t t = 0; t < n; ++t) ++per_key[static_cast<size_t>(key_[t])];
    free_ = std::make_unique<FreeIntervals>(p_, per_key);
    alt_.resize(n);
    alt_assignment_.resize(static_cast<size_t>(p_.num_microbatches()));
    waiting_.assign(n, 0);
    rest_.assign(n, 0);
    collectives_ = false;  // a lane's kernel after its own collective: what the interleaved order is for
    for (int32_t t = 0; t < p_.num_tasks() && !collectives_; ++t) {
      if (p_.resource(t) != kComm) continue;
      for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) {
        if (p_.resource(*q) == kCompute && p_.lane(*q) == p_.lane(t)) collectives_ = true;
      }
    }
    pieces_ = false;  // a microbatch's phase of several chains: what the order by pieces is for
    skipped_.assign(n, 0);
    for (int32_t j = 0; j < p_.num_microbatches() && !pieces_; ++j) {
      for (int ph = kFwd; ph <= kBwd && !pieces_; ++ph) {
        int roots = 0;
        for (const int32_t* it = p_.tasks_begin(j, ph); it != p_.tasks_end(j, ph); ++it) {
          bool root = true;
          for (const int32_t* q = p_.pred_begin(*it); q != p_.pred_end(*it); ++q) root = root && p_.phase(*q) != ph;
          roots += root ? 1 : 0;
        }
        pieces_ = roots > 1;
      }
    }
  }
}

void Scheduler::place_holes(bool fixed_assignment) {
  make_free();
  double* const out = start_;
  start_ = alt_.data();
  double best = kInf, first = 0.0, last = 0.0;  // the shortest order's step and extremes
  const bool orders[kHolesOrders][4] = {{false, false, false, false}, {true, false, false, false},
                                        {true, true, false, false}, {true, true, true, false}, {true, true, false, true}};
  unsigned ran = 0;
  for (int i = 0; i < kHolesOrders; ++i) {
    if ((orders_ >> i & 1u) == 0) continue;
    const bool* order = orders[i];
    // no collective to overlap, or one chain per microbatch and phase: the third order again
    const int as = (order[2] && !collectives_) || (order[3] && !pieces_) ? 2 : i;
    if (ran >> as & 1u) continue;
    ran |= 1u << as;
    order = orders[as];
    const double step = fill_holes(order[0], order[1], order[2], order[3], fixed_assignment);
    if (step < best) {
      best = step;
      holes_order_ = as;
      std::copy(alt_.begin(), alt_.end(), out);
      std::copy(out_.assignment.begin(), out_.assignment.end(), alt_assignment_.begin());
      first = first_start_;
      last = last_end_;
    }
  }
  start_ = out;
  std::copy(alt_assignment_.begin(), alt_assignment_.end(), out_.assignment.begin());
  first_start_ = first;
  last_end_ = last;
  finish();
}

// One order into start_: forwards (`forward_late`: by decreasing forward_needed, each its longest
// suffix that fits as late as possible; else by increasing forward_needed, each whole as early as
// possible, else its longest suffix that fits), the rest of them before; the assignment; backwards
// (`backward_early`: by increasing grad_ready, each its longest prefix that fits as early as
// possible; else by decreasing grad_ready, each whole as late as possible, else its longest prefix),
// the rest after (`interleaved`: a microbatch's phase inside the step only whole, and the rest of
// every microbatch at once, holes_front and holes_outside). `pieces`: forwards by decreasing
// forward_needed and backwards by decreasing grad_ready, each microbatch's tasks that fit as the
// probes place them, a task that does not fit left out with those that depend on it only
// (holes_forward_pieces, holes_backward_pieces): one piece's chain that does not fit leaves the
// microbatch's other pieces in the step. Returns the step.
double Scheduler::fill_holes(bool forward_late, bool backward_early, bool interleaved, bool pieces,
                             bool fixed_assignment) {
  const int32_t m = p_.num_microbatches();
  const int32_t n = p_.num_tasks();
  const auto& fn = p_.fields().forward_needed;
  const auto& gr = p_.fields().grad_ready;
  free_->reset();
  std::fill(inside_.begin(), inside_.end(), 0);
  for (int32_t j = 0; j < m; ++j) {
    out_.assignment[static_cast<size_t>(j)] = j;
    order_[static_cast<size_t>(j)] = j;
  }
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const double fa = fn[static_cast<size_t>(a)], fb = fn[static_cast<size_t>(b)];
    return forward_late ? (fa > fb || (fa == fb && a > b)) : (fa < fb || (fa == fb && a < b));
  });
  for (int32_t i = 0; i < m; ++i) {
    const int32_t j = order_[static_cast<size_t>(i)];
    const int64_t count = p_.tasks_end(j, kFwd) - p_.tasks_begin(j, kFwd);
    poll_cancel(1 + 4 * count);  // up to two tries and two probes
    if (count > 0 && pieces) holes_forward_pieces(j);
    else if (count > 0) holes_forward(j, forward_late, interleaved);
  }
  free_->open_front();
  holes_front(interleaved);
  free_->close_front();
  free_->forget();
  choose_assignment(fixed_assignment);
  for (int32_t j = 0; j < m; ++j) order_[static_cast<size_t>(j)] = j;
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const double ga = gr[static_cast<size_t>(out_.assignment[static_cast<size_t>(a)])];
    const double gb = gr[static_cast<size_t>(out_.assignment[static_cast<size_t>(b)])];
    return backward_early && !pieces ? (ga < gb || (ga == gb && a < b)) : (ga > gb || (ga == gb && a > b));
  });
  for (int32_t i = 0; i < m; ++i) {
    const int32_t j = order_[static_cast<size_t>(i)];
    const int64_t count = p_.tasks_end(j, kBwd) - p_.tasks_begin(j, kBwd);
    poll_cancel(1 + 4 * count);
    if (count > 0 && pieces) holes_backward_pieces(j);
    else if (count > 0) holes_backward(j, backward_early, interleaved);
  }
  holes_outside(interleaved);
  first_start_ = 0.0;
  last_end_ = p_.horizon();
  for (int32_t t = 0; t < n; ++t) {
    first_start_ = std::min(first_start_, start_[t]);
    last_end_ = std::max(last_end_, end_[static_cast<size_t>(t)]);
  }
  return last_end_ - first_start_;
}

// Calls f(j, t) on every task of phase ph not inside the step after marking them in rest_ and
// setting waiting_[t] to the count of those among its same-phase neighbours placed before it (the
// successors of a forward task, the predecessors of a backward one).
template <typename F>
void Scheduler::for_rest(int ph, F&& f) {
  const int32_t m = p_.num_microbatches();
  std::fill(rest_.begin(), rest_.end(), 0);
  for (int32_t j = 0; j < m; ++j) {
    for (const int32_t* it = p_.tasks_begin(j, ph); it != p_.tasks_end(j, ph); ++it) {
      rest_[static_cast<size_t>(*it)] = !inside_[static_cast<size_t>(*it)];
    }
  }
  const auto each = [&](auto&& g) {
    for (int32_t j = 0; j < m; ++j) {
      for (const int32_t* it = p_.tasks_begin(j, ph); it != p_.tasks_end(j, ph); ++it) {
        if (rest_[static_cast<size_t>(*it)]) g(j, *it);
      }
    }
  };
  each([&](int32_t, int32_t t) {  // rest_ holds tasks of phase ph only
    int32_t count = 0;
    const int32_t* q = ph == kFwd ? p_.succ_begin(t) : p_.pred_begin(t);
    for (const int32_t* const e = ph == kFwd ? p_.succ_end(t) : p_.pred_end(t); q != e; ++q) {
      count += rest_[static_cast<size_t>(*q)];
    }
    waiting_[static_cast<size_t>(t)] = count;
  });
  each(f);
}

// The tasks of phase ph not inside the step, each once its neighbours placed before it are
// (for_rest), the first of `Queue` (a priority queue of Ready, by key_of(j, t)) next, by put(t, key).
template <typename Queue, typename Key, typename Put>
void Scheduler::interleave(int ph, Key&& key_of, Put&& put) {
  Queue ready;
  for_rest(ph, [&](int32_t j, int32_t t) {
    if (waiting_[static_cast<size_t>(t)] == 0) {
      const double time = key_of(j, t);
      ready.push({time, time, j, t});
    }
  });
  while (!ready.empty()) {
    const Ready r = ready.top();
    ready.pop();
    put(r.t, r.time);
    const bool kernel = p_.resource(r.t) == kCompute;
    const int32_t* q = ph == kFwd ? p_.pred_begin(r.t) : p_.succ_begin(r.t);
    const int32_t* const e = ph == kFwd ? p_.pred_end(r.t) : p_.succ_end(r.t);
    for (; q != e; ++q) {
      if (rest_[static_cast<size_t>(*q)] && --waiting_[static_cast<size_t>(*q)] == 0) {
        const double time = key_of(r.j, *q);
        // a kernel next to a kernel on its lane continues that run: its priority (so that one
        // chain's run of kernels between two collectives is not cut by another's kernels)
        const bool run = kernel && p_.resource(*q) == kCompute && key_[static_cast<size_t>(*q)] == key_[static_cast<size_t>(r.t)];
        ready.push({run ? r.prio : time, time, r.j, *q});
      }
    }
  }
}

// The forward tasks not inside the step, each in the latest free interval ending by forward_needed
// and its successors' starts, (-inf, 0) free: microbatches in decreasing order, tasks in decreasing
// id order; `interleaved`: whichever task has its successors placed and the latest such end next
// (ties: the larger microbatch, then id), so that microbatches share the time before the step; a
// kernel after which a kernel on its lane was placed last takes that one's priority (interleave), so
// that a chain's run of kernels between two collectives stays together.
void Scheduler::holes_front(bool interleaved) {
  const int32_t m = p_.num_microbatches();
  const auto& fn = p_.fields().forward_needed;
  const auto late_of = [&](int32_t j, int32_t t) {
    double late = fn[static_cast<size_t>(j)];
    for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) late = std::min(late, start_[*q]);
    return late;
  };
  const auto put = [&](int32_t t, double late) {
    double s = 0.0;
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->latest(k, late, dur_[t], -kInf, &s);
    if (w < 0) throw std::logic_error("holes: no free time before a forward task's successors");
    free_->take(k, w, s, dur_[t]);
    start_[t] = s;
    end_[static_cast<size_t>(t)] = s + dur_[t];
    inside_[static_cast<size_t>(t)] = s >= 0.0;
  };
  if (!interleaved) {
    for (int32_t j = m - 1; j >= 0; --j) {
      const int32_t* b = p_.tasks_begin(j, kFwd);
      for (const int32_t* it = p_.tasks_end(j, kFwd); it != b;) {
        const int32_t t = *--it;
        if (!inside_[static_cast<size_t>(t)]) put(t, late_of(j, t));  // put sets it: t is not read again
      }
    }
    return;
  }
  interleave<std::priority_queue<Ready>>(kFwd, late_of, put);  // the latest end first
}

// Task t inside the step from `s`, taken out of free interval w of its key.
void Scheduler::holes_place(int32_t t, int64_t w, double s) {
  free_->take(key_[static_cast<size_t>(t)], w, s, dur_[t]);
  start_[t] = s;
  end_[static_cast<size_t>(t)] = s + dur_[t];
  inside_[static_cast<size_t>(t)] = 1;
}

// Undoes a failed try of microbatch j's tasks of phase ph: the free intervals as at `mark`, none of
// those tasks inside. Returns false (the try's result).
bool Scheduler::holes_drop(int32_t j, int ph, size_t mark) {
  free_->undo(mark);
  for (const int32_t* q = p_.tasks_begin(j, ph); q != p_.tasks_end(j, ph); ++q) inside_[static_cast<size_t>(*q)] = 0;
  return false;
}

// Microbatch j's forward inside the step (see fill_holes): whole, else the longest suffix that fits
// (late: the probe's own placement of it).
void Scheduler::holes_forward(int32_t j, bool late, bool whole) {
  const int64_t count = p_.tasks_end(j, kFwd) - p_.tasks_begin(j, kFwd);
  if (late) {
    holes_forward_suffix(j, true, whole);
    return;
  }
  if (holes_forward_in_step(j, 0)) return;
  const int64_t f = holes_forward_suffix(j, false);
  if (f == count || holes_forward_in_step(j, f)) return;
  holes_forward_suffix(j, true);  // the probe's own placement: it fits
}

// Forward tasks of microbatch j from position `first` on, in id order, each in the earliest free
// interval after its predecessors inside the step (and 0), ending by forward_needed[j]. Returns
// false, with nothing kept, when one does not fit.
bool Scheduler::holes_forward_in_step(int32_t j, int64_t first) {
  const double deadline = p_.fields().forward_needed[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
  const size_t mark = free_->mark();
  for (const int32_t* it = p_.tasks_begin(j, kFwd) + first; it != p_.tasks_end(j, kFwd); ++it) {
    const int32_t t = *it;
    double ready = 0.0;
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
      if (inside_[static_cast<size_t>(*q)]) ready = std::max(ready, end_[static_cast<size_t>(*q)]);
    }
    double s = 0.0;
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->earliest(k, ready, dur_[t], deadline, &s);
    if (w < 0) return holes_drop(j, kFwd, mark);
    holes_place(t, w, s);
  }
  free_->forget();
  return true;
}

// The first position of the longest suffix of microbatch j's forward that fits inside the step: the
// tasks backwards, each in the latest free interval from 0 that ends by forward_needed[j] and by
// its successors' starts. `keep`: that suffix placed so (nothing when none fits); else nothing kept.
int64_t Scheduler::holes_forward_suffix(int32_t j, bool keep, bool whole) {
  const double deadline = p_.fields().forward_needed[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
  const size_t mark = free_->mark();
  const int32_t* const b = p_.tasks_begin(j, kFwd);
  const int32_t* const e = p_.tasks_end(j, kFwd);
  const int32_t* it = e;
  while (it != b) {
    const int32_t t = it[-1];
    double late = deadline;
    for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) {
      late = std::min(late, probe_mark_[static_cast<size_t>(*q)]);
    }
    double s = 0.0;
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->latest(k, late, dur_[t], 0.0, &s);
    if (w < 0) break;
    free_->take(k, w, s, dur_[t]);
    probe_mark_[static_cast<size_t>(t)] = s;
    --it;
  }
  const int64_t first = it - b;
  if (!keep || it == e || (whole && it != b)) {
    free_->undo(mark);
    return first;
  }
  free_->forget();
  for (; it != e; ++it) {
    const int32_t t = *it;
    start_[t] = probe_mark_[static_cast<size_t>(t)];
    end_[static_cast<size_t>(t)] = start_[t] + dur_[t];
    inside_[static_cast<size_t>(t)] = 1;
  }
  return first;
}

// Microbatch j's backward inside the step (see fill_holes): whole, else the longest prefix that fits
// (early: the probe's own placement of it).
void Scheduler::holes_backward(int32_t j, bool early, bool whole) {
  const int64_t count = p_.tasks_end(j, kBwd) - p_.tasks_begin(j, kBwd);
  if (early) {
    holes_backward_prefix(j, true, whole);
    return;
  }
  if (holes_backward_in_step(j, count)) return;
  const int64_t last = holes_backward_prefix(j, false);
  if (last == 0 || holes_backward_in_step(j, last)) return;
  holes_backward_prefix(j, true);
}

// Backward tasks of microbatch j before position `last`, in decreasing id order, each in the latest
// free interval before its successors inside the step (and the horizon), starting at or after the
// grad_ready of the LLM microbatch it feeds. Returns false, with nothing kept, when one does not fit.
bool Scheduler::holes_backward_in_step(int32_t j, int64_t last) {
  const double ready = p_.fields().grad_ready[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
  const size_t mark = free_->mark();
  const int32_t* const b = p_.tasks_begin(j, kBwd);
  for (const int32_t* it = b + last; it != b;) {
    const int32_t t = *--it;
    double late = p_.horizon();
    for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) {
      if (inside_[static_cast<size_t>(*q)]) late = std::min(late, start_[*q]);
    }
    double s = 0.0;
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->latest(k, late, dur_[t], ready, &s);
    if (w < 0) return holes_drop(j, kBwd, mark);
    holes_place(t, w, s);
  }
  free_->forget();
  return true;
}

// The length of the longest prefix of microbatch j's backward that fits inside the step: the tasks
// forwards, each in the earliest free interval from grad_ready and its backward predecessors' ends,
// ending by the horizon. `keep`: that prefix placed so; else nothing kept.
int64_t Scheduler::holes_backward_prefix(int32_t j, bool keep, bool whole) {
  const double ready = p_.fields().grad_ready[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
  const size_t mark = free_->mark();
  const int32_t* const b = p_.tasks_begin(j, kBwd);
  const int32_t* const e = p_.tasks_end(j, kBwd);
  const int32_t* it = b;
  for (; it != e; ++it) {
    const int32_t t = *it;
    double early = ready;
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
      if (p_.phase(*q) == kBwd) early = std::max(early, probe_mark_[static_cast<size_t>(*q)]);
    }
    double s = 0.0;
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->earliest(k, early, dur_[t], p_.horizon(), &s);
    if (w < 0) break;
    free_->take(k, w, s, dur_[t]);
    probe_mark_[static_cast<size_t>(t)] = s + dur_[t];
  }
  const int64_t count = it - b;
  if (!keep || count == 0 || (whole && it != e)) {
    free_->undo(mark);
    return count;
  }
  free_->forget();
  for (const int32_t* q = b; q != it; ++q) {
    const int32_t t = *q;
    start_[t] = probe_mark_[static_cast<size_t>(t)] - dur_[t];
    end_[static_cast<size_t>(t)] = start_[t] + dur_[t];
    inside_[static_cast<size_t>(t)] = 1;
  }
  return count;
}

// Microbatch j's forward tasks that fit inside the step, by pieces: the tasks backwards, each in the
// latest free interval from 0 that ends by forward_needed[j] and by its successors' starts; a task
// that does not fit, or one of whose successors was left out, is left out (skipped_), and the
// others go on. What fits stays placed so.
void Scheduler::holes_forward_pieces(int32_t j) {
  const double deadline = p_.fields().forward_needed[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
  const int32_t* const b = p_.tasks_begin(j, kFwd);
  for (const int32_t* it = p_.tasks_end(j, kFwd); it != b;) {
    const int32_t t = *--it;
    double late = deadline;
    bool out = false;
    for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) {
      out = out || skipped_[static_cast<size_t>(*q)];
      late = std::min(late, start_[*q]);
    }
    double s = 0.0;
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = out ? -1 : free_->latest(k, late, dur_[t], 0.0, &s);
    skipped_[static_cast<size_t>(t)] = w < 0;
    if (w >= 0) holes_place(t, w, s);
  }
  free_->forget();
  for (const int32_t* it = b; it != p_.tasks_end(j, kFwd); ++it) skipped_[static_cast<size_t>(*it)] = 0;
}

// Microbatch j's backward tasks that fit inside the step, by pieces: the tasks forwards, each in the
// earliest free interval from grad_ready and its backward predecessors' ends that ends by the
// horizon; a task that does not fit, or one of whose backward predecessors was left out, is left
// out, and the others go on. What fits stays placed so.
void Scheduler::holes_backward_pieces(int32_t j) {
  const double ready = p_.fields().grad_ready[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
  for (const int32_t* it = p_.tasks_begin(j, kBwd); it != p_.tasks_end(j, kBwd); ++it) {
    const int32_t t = *it;
    double early = ready;
    bool out = false;
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
      if (p_.phase(*q) != kBwd) continue;
      out = out || skipped_[static_cast<size_t>(*q)];
      early = std::max(early, end_[static_cast<size_t>(*q)]);
    }
    double s = 0.0;
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = out ? -1 : free_->earliest(k, early, dur_[t], p_.horizon(), &s);
    skipped_[static_cast<size_t>(t)] = w < 0;
    if (w >= 0) holes_place(t, w, s);
  }
  free_->forget();
  for (const int32_t* it = p_.tasks_begin(j, kBwd); it != p_.tasks_end(j, kBwd); ++it) {
    skipped_[static_cast<size_t>(*it)] = 0;
  }
}

// The backward tasks not inside the step, each in the earliest free interval after its predecessors
// and grad_ready, the time after the horizon free: microbatches in increasing order, tasks in
// increasing id order; `interleaved`: whichever task has its predecessors placed and the earliest such
// start next (ties: the smaller microbatch, then id), so that microbatches share the time after it.
void Scheduler::holes_outside(bool interleaved) {
  const auto& gr = p_.fields().grad_ready;
  const auto early_of = [&](int32_t j, int32_t t) {
    double early = gr[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) early = std::max(early, end_[static_cast<size_t>(*q)]);
    return early;
  };
  const auto put = [&](int32_t t, double early) {
    double s = 0.0;
    const int32_t k = key_[static_cast<size_t>(t)];
    const int64_t w = free_->earliest(k, early, dur_[t], kInf, &s);
    if (w < 0) throw std::logic_error("holes: no free time after a backward task's predecessors");
    free_->take(k, w, s, dur_[t]);
    start_[t] = s;
    end_[static_cast<size_t>(t)] = s + dur_[t];
  };
  free_->open_back();
  if (!interleaved) {
    for (int32_t j = 0; j < p_.num_microbatches(); ++j) {
      for (const int32_t* it = p_.tasks_begin(j, kBwd); it != p_.tasks_end(j, kBwd); ++it) {
        if (!inside_[static_cast<size_t>(*it)]) put(*it, early_of(j, *it));
      }
    }
  } else {  // the earliest start first
    interleave<std::priority_queue<Ready, std::vector<Ready>, std::greater<Ready>>>(kBwd, early_of, put);
  }
  free_->forget();
}

}  // namespace pybubble
