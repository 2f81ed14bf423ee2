#include "pybubble/scheduler.h"

#include "pybubble/cancel.h"
#include "pybubble/checks.h"
#include "pybubble/free_intervals.h"
#include "pybubble/message.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace pybubble {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

Policy parse_policy(const std::string& name) {
  if (name == "greedy") return Policy::kGreedy;
  if (name == "coarse") return Policy::kCoarse;
  if (name == "holes") return Policy::kHoles;
  throw std::invalid_argument("policy: " + quote_capped(name) + " is not one of greedy, coarse, holes");
}

namespace {
/// The buffers of the last scheduler destroyed on this thread, for the next one made here.
struct SpareBuffers {
  bool held = false;
  Buffer<int32_t> key, fwd_key;
  Buffer<double> end, probe_mark, bw_start, bw_end;
};
thread_local SpareBuffers spare;
}  // namespace

Scheduler::~Scheduler() {
  if (spare.held) return;
  spare.key = std::move(key_);
  spare.fwd_key = std::move(fwd_key_);
  spare.end = std::move(end_);
  spare.probe_mark = std::move(probe_mark_);
  spare.bw_start = std::move(bw_start_);
  spare.bw_end = std::move(bw_end_);
  spare.held = true;
}

Scheduler::Scheduler(const Problem& problem) : p_(problem) {
  if (spare.held) {  // sized below: only growth touches new memory
    key_ = std::move(spare.key);
    fwd_key_ = std::move(spare.fwd_key);
    end_ = std::move(spare.end);
    probe_mark_ = std::move(spare.probe_mark);
    bw_start_ = std::move(spare.bw_start);
    bw_end_ = std::move(spare.bw_end);
    spare.held = false;
  }
  const size_t n = static_cast<size_t>(p_.num_tasks());
  const size_t m = static_cast<size_t>(p_.num_microbatches());
  keys_ = 2 * p_.num_lanes();
  key_.resize(n);
  for (size_t t = 0; t < n; ++t) {
    key_[t] = 2 * p_.lane(static_cast<int32_t>(t)) + p_.resource(static_cast<int32_t>(t));
  }
  // Dependencies that never bind inside the step: every predecessor (forward) or successor
  // (backward) of t on t's own lane and resource, so placed earlier in the same try on t's cursor.
  local_pred_.resize(n);
  local_succ_.resize(n);
  for (size_t t = 0; t < n; ++t) {
    const int32_t id = static_cast<int32_t>(t);
    local_pred_[t] = std::all_of(p_.pred_begin(id), p_.pred_end(id), [&](int32_t q) { return key_[static_cast<size_t>(q)] == key_[t]; });
    local_succ_[t] = std::all_of(p_.succ_begin(id), p_.succ_end(id), [&](int32_t q) { return key_[static_cast<size_t>(q)] == key_[t]; });
  }
  end_.resize(n);
  cursor_.resize(static_cast<size_t>(keys_));
  saved_.resize(static_cast<size_t>(keys_));
  inside_.resize(n);
  fwd_first_.resize(m);
  bwd_last_.resize(m);
  probe_time_.resize(static_cast<size_t>(keys_));
  probe_mark_.resize(n);
  finish_.resize(m);
  order_.resize(m);
  bw_off_.resize(static_cast<size_t>(keys_) + 1);
  // Each forward task placed inside a window splits it into at most one more piece.
  const size_t windows = p_.windows(kCompute).start.size() + p_.windows(kComm).start.size();
  bw_start_.resize(windows + n);
  bw_end_.resize(windows + n);
  // Forward tasks per key in (microbatch, id) order, as CSR.
  fwd_key_off_.assign(static_cast<size_t>(keys_) + 1, 0);
  for (int32_t j = 0; j < static_cast<int32_t>(m); ++j) {
    for (const int32_t* it = p_.tasks_begin(j, kFwd); it != p_.tasks_end(j, kFwd); ++it) {
      ++fwd_key_off_[static_cast<size_t>(key_[static_cast<size_t>(*it)]) + 1];
    }
  }
  for (int32_t k = 0; k < keys_; ++k) fwd_key_off_[static_cast<size_t>(k) + 1] += fwd_key_off_[static_cast<size_t>(k)];
  fwd_key_.resize(static_cast<size_t>(fwd_key_off_.back()));
  std::vector<int64_t> at(fwd_key_off_.begin(), fwd_key_off_.end() - 1);
  for (int32_t j = 0; j < static_cast<int32_t>(m); ++j) {
    for (const int32_t* it = p_.tasks_begin(j, kFwd); it != p_.tasks_end(j, kFwd); ++it) {
      fwd_key_[static_cast<size_t>(at[static_cast<size_t>(key_[static_cast<size_t>(*it)])]++)] = *it;
    }
  }
  out_.start.resize(n);
  out_.assignment.resize(m);
}

// Remembers every lane's cursor before a microbatch is tried inside the step.
void Scheduler::checkpoint() { std::copy(cursor_.begin(), cursor_.end(), saved_.begin()); }

// Undoes a failed try of microbatch j's tasks of phase ph inside the step: the cursors as they
// were at the checkpoint, none of those tasks inside. Returns false (the try's result).
bool Scheduler::roll_back(int32_t j, int ph) {
  std::copy(saved_.begin(), saved_.end(), cursor_.begin());
  for (const int32_t* q = p_.tasks_begin(j, ph); q != p_.tasks_end(j, ph); ++q) inside_[static_cast<size_t>(*q)] = 0;
  return false;
}

// Forward tasks of microbatch j from position `first` on, inside the step: as early as possible,
// each in the first window of its lane and resource (after the lane's previous task) that holds
// it whole, and every task ending by forward_needed[j]. Returns false, with nothing kept, when
// that is impossible.
bool Scheduler::place_forward_in_step(int32_t j, int64_t first) {
  const double deadline = p_.fields().forward_needed[static_cast<size_t>(j)];
  checkpoint();
  double* const start = start_;
  double* const end = end_.data();
  uint8_t* const inside = inside_.data();
  const int32_t* it = p_.tasks_begin(j, kFwd) + first;
  const int32_t* const stop = p_.tasks_end(j, kFwd);
  while (it != stop) {
    // A run of consecutive tasks on one lane and resource, its cursor kept in registers.
    const int32_t k = key_[static_cast<size_t>(*it)];
    const WindowSet& ws = p_.windows(k & 1);
    const double* const wstart = ws.start.data();
    const double* const wend = ws.end.data();
    const int64_t last = ws.offset[static_cast<size_t>(k >> 1) + 1];
    double time = cursor_[static_cast<size_t>(k)].time;
    int64_t w = cursor_[static_cast<size_t>(k)].window;
    bool placed = false;  // a task of the run placed: then time >= wstart[w]
    do {
      const int32_t t = *it;
      const double d = dur_[t];
      double s = time;
      // Right after the run's previous task in its window: what the search below gives when
      // nothing else holds t back (time >= wstart[w], so max(time, wstart[w]) is time).
      if (!(placed && local_pred_[static_cast<size_t>(t)] && !(s + d > deadline) && s + d <= wend[w])) {
        double ready = time;
        // A predecessor on this lane and resource placed in this try ends by `time`: only the
        // others can delay t.
        if (!local_pred_[static_cast<size_t>(t)]) {
          for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
            if (inside[*q]) ready = std::max(ready, end[*q]);
          }
        }
        for (;; ++w) {
          if (w == last) return roll_back(j, kFwd);
          s = std::max(ready, wstart[w]);
          if (s + d > deadline) return roll_back(j, kFwd);
          if (s + d <= wend[w]) break;
        }
      }
      placed = true;
      start[t] = s;
      end[t] = s + d;
      inside[t] = 1;
      time = s + d;
    } while (++it != stop && key_[static_cast<size_t>(*it)] == k);
    cursor_[static_cast<size_t>(k)] = {time, w};
  }
  return true;
}

// The first position of the longest suffix of microbatch j's forward tasks that fits inside the
// step: a probe takes the tasks backwards, each as late as possible (by forward_needed[j], before
// its successors and the probe's later task on the lane), after the lane's placed work. Changes
// no placement.
int64_t Scheduler::forward_suffix(int32_t j) {
  const double deadline = p_.fields().forward_needed[static_cast<size_t>(j)];
  std::fill(probe_time_.begin(), probe_time_.end(), kInf);
  const int32_t* b = p_.tasks_begin(j, kFwd);
  for (const int32_t* it = p_.tasks_end(j, kFwd); it != b;) {
    --it;
    const int32_t t = *it;
    const size_t k = static_cast<size_t>(key_[static_cast<size_t>(t)]);
    const int32_t l = static_cast<int32_t>(k >> 1);
    const WindowSet& ws = p_.windows(static_cast<int>(k & 1));
    double latest = std::min(deadline, probe_time_[k]);
    for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) {
      latest = std::min(latest, probe_mark_[static_cast<size_t>(*q)]);
    }
    const double d = dur_[t];
    const auto lo = ws.start.begin() + ws.offset[static_cast<size_t>(l)];
    const auto hi = ws.start.begin() + ws.offset[static_cast<size_t>(l) + 1];
    int64_t w = (std::lower_bound(lo, hi, latest) - ws.start.begin()) - 1;
    bool placed = false;
    double s = 0.0;
    for (; w >= cursor_[k].window; --w) {
      s = std::min(latest, ws.end[static_cast<size_t>(w)]) - d;
      if (s < cursor_[k].time) break;
      if (s >= ws.start[static_cast<size_t>(w)]) {
        placed = true;
        break;
      }
    }
    if (!placed) return (it - b) + 1;
    probe_mark_[static_cast<size_t>(t)] = s;
    probe_time_[k] = s;
  }
  return 0;
}

// Forward tasks of microbatch j before its first in-step position, before the step: as late as
// possible, below the lane's cursor and before every successor, in decreasing id order.
void Scheduler::place_forward_front(int32_t j) {
  const int32_t* b = p_.tasks_begin(j, kFwd);
  for (const int32_t* it = b + fwd_first_[static_cast<size_t>(j)]; it != b;) {
    const int32_t t = *--it;
    Cursor& c = cursor_[static_cast<size_t>(key_[static_cast<size_t>(t)])];
    double latest = c.time;
    for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) {
      latest = std::min(latest, start_[*q]);
    }
    const double s = latest - dur_[t];
    start_[t] = s;
    end_[static_cast<size_t>(t)] = s + dur_[t];
    c.time = s;
    first_start_ = std::min(first_start_, s);
  }
}

// The k-th encoder microbatch to finish its forward feeds LLM microbatch k, when that meets every
// forward_needed; otherwise microbatch j feeds LLM microbatch j (which the placement guarantees).
void Scheduler::choose_assignment(bool fixed) {
  const int32_t m = p_.num_microbatches();
  if (fixed) {
    for (int32_t j = 0; j < m; ++j) out_.assignment[static_cast<size_t>(j)] = j;
    return;
  }
  const auto& fn = p_.fields().forward_needed;
  for (int32_t j = 0; j < m; ++j) {
    double f = -kInf;
    for (const int32_t* it = p_.tasks_begin(j, kFwd); it != p_.tasks_end(j, kFwd); ++it) {
      f = std::max(f, end_[static_cast<size_t>(*it)]);
    }
    finish_[static_cast<size_t>(j)] = f;
    order_[static_cast<size_t>(j)] = j;
  }
  std::stable_sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    return finish_[static_cast<size_t>(a)] < finish_[static_cast<size_t>(b)];
  });
  bool ok = true;
  for (int32_t k = 0; k < m; ++k) {
    const int32_t j = order_[static_cast<size_t>(k)];
    out_.assignment[static_cast<size_t>(j)] = k;
    if (finish_[static_cast<size_t>(j)] > fn[static_cast<size_t>(k)]) ok = false;
  }
  if (!ok) {
    for (int32_t j = 0; j < m; ++j) out_.assignment[static_cast<size_t>(j)] = j;
  }
}

// Backward windows per (lane, resource): the problem's windows minus the intervals taken by
// forward tasks placed inside the step (which lie inside windows, in increasing time per key).
void Scheduler::build_backward_windows() {
  // Per key, the forward tasks placed inside the step that take time, in placement order
  // (increasing microbatch, increasing id: increasing time); the windows up to the next one copied
  // whole (the problem's windows are not empty), the window holding it cut around it.
  double* const bs = bw_start_.data();
  double* const be_ = bw_end_.data();
  int64_t out = 0;
  const auto emit = [&](double a, double z) {
    bs[out] = a;
    be_[out] = z;
    ++out;
  };
  const auto copy = [&](const WindowSet& ws, int64_t from, int64_t to) {
    std::copy(ws.start.begin() + from, ws.start.begin() + to, bs + out);
    std::copy(ws.end.begin() + from, ws.end.begin() + to, be_ + out);
    out += to - from;
  };
  for (int32_t k = 0; k < keys_; ++k) {
    bw_off_[static_cast<size_t>(k)] = out;
    const WindowSet& ws = p_.windows(k % 2);
    const double* const S = ws.start.data();
    const double* const E = ws.end.data();
    const int32_t l = k / 2;
    int64_t w = ws.offset[static_cast<size_t>(l)];
    const int64_t wl = ws.offset[static_cast<size_t>(l) + 1];
    if (w == wl) continue;
    double cur = S[w];
    for (int64_t b = fwd_key_off_[static_cast<size_t>(k)]; b < fwd_key_off_[static_cast<size_t>(k) + 1]; ++b) {
      const int32_t t = fwd_key_[static_cast<size_t>(b)];
      if (!inside_[static_cast<size_t>(t)] || !(dur_[t] > 0.0)) continue;  // not in the step, or takes no time
      const double s = start_[t];
      if (s >= E[w]) {
        // Window w ends before t: its rest, then the whole windows before the one t starts in.
        if (cur < E[w]) emit(cur, E[w]);
        const int64_t next = std::upper_bound(E + w + 1, E + wl, s) - E;
        copy(ws, w + 1, next);
        w = next;
        if (w == wl) break;
        cur = S[w];
      }
      if (s > cur) emit(cur, s);
      cur = std::max(cur, end_[static_cast<size_t>(t)]);
    }
    if (w < wl) {
      if (cur < E[w]) emit(cur, E[w]);
      copy(ws, w + 1, wl);
    }
  }
  bw_off_[static_cast<size_t>(keys_)] = out;
}

// Backward tasks of microbatch j before position `last`, inside the step: the mirror of the
// forward, as late as possible from the horizon down, every task starting at or after grad_ready
// of the LLM microbatch it feeds. Returns false, with nothing kept, when that is impossible.
bool Scheduler::place_backward_in_step(int32_t j, int64_t last) {
  const double ready = p_.fields().grad_ready[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
  checkpoint();
  double* const start = start_;
  double* const end = end_.data();
  uint8_t* const inside = inside_.data();
  const double* const bstart = bw_start_.data();
  const double* const bend = bw_end_.data();
  const int32_t* const b = p_.tasks_begin(j, kBwd);
  const int32_t* it = b + last;
  double reach = -kInf;  // the furthest end of this try: rounding may carry it past a window's end
  while (it != b) {
    // A run of consecutive tasks on one lane and resource, its cursor kept in registers.
    const int32_t k = key_[static_cast<size_t>(it[-1])];
    const int64_t first = bw_off_[static_cast<size_t>(k)];
    double time = cursor_[static_cast<size_t>(k)].time;
    int64_t w = cursor_[static_cast<size_t>(k)].window;
    bool placed = false;  // a task of the run placed: then time <= bend[w]
    do {
      const int32_t t = *--it;
      const double d = dur_[t];
      double s = time - d;
      // Right before the run's previous task in its window: what the search below gives when
      // nothing else holds t earlier (time <= bend[w], so min(time, bend[w]) is time).
      if (!(placed && local_succ_[static_cast<size_t>(t)] && !(s < ready) && s >= bstart[w])) {
        double latest = time;
        // A successor on this lane and resource placed in this try starts at or after `time`:
        // only the others can hold t earlier.
        if (!local_succ_[static_cast<size_t>(t)]) {
          for (const int32_t* q = p_.succ_begin(t); q != p_.succ_end(t); ++q) {
            if (inside[*q]) latest = std::min(latest, start[*q]);
          }
        }
        for (;; --w) {
          if (w < first) return roll_back(j, kBwd);
          s = std::min(latest, bend[w]) - d;
          if (s < ready) return roll_back(j, kBwd);
          if (s >= bstart[w]) break;
        }
      }
      placed = true;
      start[t] = s;
      end[t] = s + d;
      inside[t] = 1;
      time = s;
      reach = std::max(reach, s + d);
    } while (it != b && key_[static_cast<size_t>(it[-1])] == k);
    cursor_[static_cast<size_t>(k)] = {time, w};
  }
  last_end_ = std::max(last_end_, reach);
  return true;
}

// The length of the longest prefix of microbatch j's backward tasks that fits inside the step: a
// probe takes the tasks forwards, each as early as possible (from grad_ready, after its
// predecessors and the probe's earlier task on the lane), ending before the lane's placed work.
int64_t Scheduler::backward_prefix(int32_t j) {
  const double ready = p_.fields().grad_ready[static_cast<size_t>(out_.assignment[static_cast<size_t>(j)])];
  std::fill(probe_time_.begin(), probe_time_.end(), -kInf);
  const int32_t* b = p_.tasks_begin(j, kBwd);
  for (const int32_t* it = b; it != p_.tasks_end(j, kBwd); ++it) {
    const int32_t t = *it;
    const size_t k = static_cast<size_t>(key_[static_cast<size_t>(t)]);
    double early = std::max(ready, probe_time_[k]);
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
      if (p_.phase(*q) == kBwd) early = std::max(early, probe_mark_[static_cast<size_t>(*q)]);
    }
    const double d = dur_[t];
    const auto lo = bw_end_.begin() + bw_off_[k];
    const auto hi = bw_end_.begin() + bw_off_[k + 1];
    int64_t w = std::upper_bound(lo, hi, early) - bw_end_.begin();
    bool placed = false;
    double s = 0.0;
    for (; w <= cursor_[k].window; ++w) {
      s = std::max(early, bw_start_[static_cast<size_t>(w)]);
      if (s + d > cursor_[k].time) break;
      if (s + d <= bw_end_[static_cast<size_t>(w)]) {
        placed = true;
        break;
      }
    }
    if (!placed) return it - b;
    probe_mark_[static_cast<size_t>(t)] = s + d;
    probe_time_[k] = s + d;
  }
  return p_.tasks_end(j, kBwd) - b;
}

// Backward tasks of microbatch j from its first position after the step on: as early as possible
// from the horizon.
void Scheduler::place_backward_back(int32_t j) {
  for (const int32_t* it = p_.tasks_begin(j, kBwd) + bwd_last_[static_cast<size_t>(j)];
       it != p_.tasks_end(j, kBwd); ++it) {
    const int32_t t = *it;
    Cursor& c = cursor_[static_cast<size_t>(key_[static_cast<size_t>(t)])];
    double s = c.time;
    for (const int32_t* q = p_.pred_begin(t); q != p_.pred_end(t); ++q) {
      s = std::max(s, end_[static_cast<size_t>(*q)]);
    }
    start_[t] = s;
    end_[static_cast<size_t>(t)] = s + dur_[t];
    c.time = s + dur_[t];
    last_end_ = std::max(last_end_, s + dur_[t]);
  }
}

// Step time and shifts from the extremes kept while placing: only tasks before the step start
// before 0, and only tasks after it (or a backward task inside it, by rounding) end after the
// horizon.
void Scheduler::finish() {
  out_.shift_front = -first_start_;
  out_.shift_back = last_end_ - p_.horizon();
  out_.step_time = last_end_ - first_start_;
}

const Schedule& Scheduler::run(Policy policy, const std::vector<double>* durations, bool fixed_assignment,
                               unsigned orders) {
  const int32_t n = p_.num_tasks();
  if (orders == 0 || orders > kAllOrders) {
    throw std::invalid_argument("orders: " + format_number(orders) + " is not a mask of the holes orders (1.." +
                                format_number(kAllOrders) + ")");
  }
  if (durations != nullptr) {
    if (durations->size() != static_cast<size_t>(n)) {
      throw std::invalid_argument("durations: " + format_number(durations->size()) + " values for " +
                                  format_number(n) + " tasks");
    }
    for (int32_t t = 0; t < n; ++t) {
      check_duration((*durations)[static_cast<size_t>(t)], [t] { return "durations[" + format_number(t) + "]"; });
    }
  }
  orders_ = orders;
  place(policy, durations != nullptr ? durations->data() : p_.fields().duration.data(), fixed_assignment,
        out_.start.data());
  orders_ = kAllOrders;
  return out_;
}

void Scheduler::place(Policy policy, const double* durations, bool fixed_assignment, double* start) {
  const int32_t m = p_.num_microbatches();
  dur_ = durations;
  start_ = start;
  holes_order_ = -1;
  if (policy == Policy::kHoles) {
    place_holes(fixed_assignment);
    return;
  }
  const bool greedy = policy == Policy::kGreedy;
  first_start_ = 0.0;
  last_end_ = p_.horizon();
  const WindowSet* ws[2] = {&p_.windows(kCompute), &p_.windows(kComm)};
  std::fill(inside_.begin(), inside_.end(), 0);

  // Forward: inside the step where it fits (greedy), whole or its longest fitting suffix; the rest
  // before 0.
  for (int32_t k = 0; k < keys_; ++k) {
    cursor_[static_cast<size_t>(k)] = {0.0, ws[k % 2]->offset[static_cast<size_t>(k / 2)]};
  }
  for (int32_t j = 0; j < m; ++j) {
    const int64_t count = p_.tasks_end(j, kFwd) - p_.tasks_begin(j, kFwd);
    poll_cancel(1 + 3 * count);  // up to two tries and a probe
    int64_t first = count;
    if (greedy) {
      if (place_forward_in_step(j, 0)) {
        first = 0;
      } else {
        const int64_t f = forward_suffix(j);
        if (f < count && place_forward_in_step(j, f)) first = f;
      }
    }
    fwd_first_[static_cast<size_t>(j)] = first;
  }
  for (int32_t k = 0; k < keys_; ++k) cursor_[static_cast<size_t>(k)].time = 0.0;
  for (int32_t j = m - 1; j >= 0; --j) place_forward_front(j);
  choose_assignment(fixed_assignment);

  // Backward: inside the step where it fits (greedy), latest grad_ready first, whole or its
  // longest fitting prefix; the rest after the horizon.
  const auto& gr = p_.fields().grad_ready;
  for (int32_t j = 0; j < m; ++j) bwd_last_[static_cast<size_t>(j)] = 0;
  if (greedy) {
    build_backward_windows();
    for (int32_t k = 0; k < keys_; ++k) {
      cursor_[static_cast<size_t>(k)] = {p_.horizon(), bw_off_[static_cast<size_t>(k) + 1] - 1};
    }
    for (int32_t j = 0; j < m; ++j) order_[static_cast<size_t>(j)] = j;
    std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
      const double ga = gr[static_cast<size_t>(out_.assignment[static_cast<size_t>(a)])];
      const double gb = gr[static_cast<size_t>(out_.assignment[static_cast<size_t>(b)])];
      return ga > gb || (ga == gb && a > b);
    });
    for (int32_t i = 0; i < m; ++i) {
      const int32_t j = order_[static_cast<size_t>(i)];
      const int64_t count = p_.tasks_end(j, kBwd) - p_.tasks_begin(j, kBwd);
      poll_cancel(1 + 3 * count);
      int64_t last = 0;
      if (place_backward_in_step(j, count)) {
        last = count;
      } else {
        const int64_t l = backward_prefix(j);
        if (l > 0 && place_backward_in_step(j, l)) last = l;
      }
      bwd_last_[static_cast<size_t>(j)] = last;
    }
  }
  for (int32_t k = 0; k < keys_; ++k) cursor_[static_cast<size_t>(k)].time = p_.horizon();
  for (int32_t j = 0; j < m; ++j) place_backward_back(j);
  finish();
}

double first_fit_floor(const Problem& p, std::vector<double>& start) {
  const int32_t n = p.num_tasks(), keys = 2 * p.num_lanes();
  start.resize(static_cast<size_t>(n));
  std::vector<double> end(static_cast<size_t>(n)), time(static_cast<size_t>(keys), 0.0);
  std::vector<int64_t> window(static_cast<size_t>(keys));
  for (int32_t k = 0; k < keys; ++k) window[static_cast<size_t>(k)] = p.windows(k % 2).offset[static_cast<size_t>(k / 2)];
  double last_end = p.horizon();
  for (int32_t t = 0; t < n; ++t) {
    const int r = p.resource(t);
    const int32_t l = p.lane(t);
    const size_t k = static_cast<size_t>(2 * l + r);
    const WindowSet& ws = p.windows(r);
    double ready = time[k];
    for (const int32_t* q = p.pred_begin(t); q != p.pred_end(t); ++q) ready = std::max(ready, end[static_cast<size_t>(*q)]);
    const double d = p.duration(t);
    const int64_t last = ws.offset[static_cast<size_t>(l) + 1];
    int64_t w = window[k];
    double s = std::max(ready, p.horizon());
    for (; w < last; ++w) {
      const double at = std::max(ready, ws.start[static_cast<size_t>(w)]);
      if (at + d <= ws.end[static_cast<size_t>(w)]) {
        s = at;
        break;
      }
    }
    start[static_cast<size_t>(t)] = s;
    end[static_cast<size_t>(t)] = s + d;
    time[k] = s + d;
    window[k] = w;
    last_end = std::max(last_end, s + d);
  }
  return last_end;
}

Schedule schedule(const Problem& problem, Policy policy) {
  Scheduler s(problem);
  return s.run(policy);
}

}  // namespace pybubble
