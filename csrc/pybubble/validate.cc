#include "pybubble/validate.h"

#include "pybubble/cancel.h"
#include "pybubble/message.h"

#include "pybubble/intervals.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

namespace pybubble {
namespace {

const char* resource_name(int r) { return r == kCompute ? "compute" : "comm"; }

// The free intervals of one lane and resource: (-inf, 0), the windows, [horizon, inf), with
// touching intervals merged.
std::vector<Interval> free_intervals(const Problem& p, int32_t lane, int r) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Interval> out{{-inf, 0.0}};
  const WindowSet& ws = p.windows(r);
  for (int64_t w = ws.offset[static_cast<size_t>(lane)]; w < ws.offset[static_cast<size_t>(lane) + 1]; ++w) {
    out.push_back({ws.start[static_cast<size_t>(w)], ws.end[static_cast<size_t>(w)]});
  }
  out.push_back({p.horizon(), inf});
  merge_intervals(out);
  return out;
}

}  // namespace

std::vector<std::string> validate(const Problem& p, const Schedule& s) {
  const int32_t n = p.num_tasks(), m = p.num_microbatches();
  if (s.start.size() != static_cast<size_t>(n)) {
    throw std::invalid_argument("start: " + format_number(s.start.size()) +
                                " entries, the problem has " + format_number(n) + " tasks");
  }
  if (s.assignment.size() != static_cast<size_t>(m)) {
    throw std::invalid_argument("assignment: " + format_number(s.assignment.size()) +
                                " entries, the problem has " + format_number(m) + " microbatches");
  }
  std::vector<std::string> v;
  const auto& f = p.fields();
  // a <= b up to kTimeTolerance, plus the rounding of times as large as the problem allows: its
  // horizon plus all its durations (tasks packed back to back before 0 or after the horizon). From
  // the problem only: a schedule must not widen its own tolerance with a far-away start.
  double scale = p.horizon();
  for (int32_t t = 0; t < n; ++t) scale += f.duration[static_cast<size_t>(t)];
  const double tol = kTimeTolerance + kRelativeTolerance * scale;
  auto leq = [tol](double a, double b) { return a <= b + tol; };
  auto task_end = [&](int32_t t) { return s.start[static_cast<size_t>(t)] + f.duration[static_cast<size_t>(t)]; };

  bool times_finite = true;
  for (int32_t t = 0; t < n; ++t) {
    if (!std::isfinite(s.start[static_cast<size_t>(t)])) {
      v.push_back("task " + format_number(t) + ": start " + format_number(s.start[static_cast<size_t>(t)]) +
                  " is not finite");
      times_finite = false;
    }
  }

  // Assignment: a permutation of the LLM microbatches.
  std::vector<int32_t> fed_by(static_cast<size_t>(m), -1);
  bool perm = true;
  for (int32_t j = 0; j < m; ++j) {
    const int64_t k = s.assignment[static_cast<size_t>(j)];
    if (k < 0 || k >= m) {
      v.push_back("assignment[" + format_number(j) + "]: " + format_number(k) +
                  " is not an LLM microbatch in [0, " + format_number(m) + ")");
      perm = false;
    } else if (fed_by[static_cast<size_t>(k)] >= 0) {
      v.push_back("assignment[" + format_number(j) + "]: LLM microbatch " + format_number(k) +
                  " is already fed by encoder microbatch " + format_number(fed_by[static_cast<size_t>(k)]));
      perm = false;
    } else {
      fed_by[static_cast<size_t>(k)] = j;
    }
  }
  if (!times_finite) return v;

  // Dependencies.
  for (int32_t t = 0; t < n; ++t) {
    const auto b = f.after_offset[static_cast<size_t>(t)], e = f.after_offset[static_cast<size_t>(t) + 1];
    poll_cancel(1 + e - b);
    for (auto q = b; q < e; ++q) {
      const int32_t pr = static_cast<int32_t>(f.after[static_cast<size_t>(q)]);
      if (!leq(task_end(pr), s.start[static_cast<size_t>(t)])) {
        v.push_back("task " + format_number(t) + " starts at " + format_number(s.start[static_cast<size_t>(t)]) +
                    " before its predecessor " + format_number(pr) + " ends at " + format_number(task_end(pr)));
      }
    }
  }

  // Free intervals and overlaps, per lane and resource.
  std::vector<std::vector<int32_t>> by_key(static_cast<size_t>(2 * p.num_lanes()));
  for (int32_t t = 0; t < n; ++t) by_key[static_cast<size_t>(2 * p.lane(t) + p.resource(t))].push_back(t);
  for (int32_t l = 0; l < p.num_lanes(); ++l) {
    for (int r = 0; r < 2; ++r) {
      auto& ts = by_key[static_cast<size_t>(2 * l + r)];
      if (ts.empty()) continue;
      const auto iv = free_intervals(p, l, r);
      for (int32_t t : ts) {
        const double st = s.start[static_cast<size_t>(t)], en = task_end(t);
        // The last interval starting at or before st (within tol) must hold the whole task.
        auto it = std::upper_bound(iv.begin(), iv.end(), st,
                                   [&](double x, const Interval& a) { return !leq(a.start, x); });
        const bool inside = it != iv.begin() && leq(en, std::prev(it)->end);
        if (!inside) {
          v.push_back("task " + format_number(t) + " [" + format_number(st) + ", " + format_number(en) + ") on lane " +
                      format_number(l) + " lies outside every free " + resource_name(r) + " interval");
        }
      }
      std::sort(ts.begin(), ts.end(), [&](int32_t a, int32_t b) {
        return s.start[static_cast<size_t>(a)] < s.start[static_cast<size_t>(b)] ||
               (s.start[static_cast<size_t>(a)] == s.start[static_cast<size_t>(b)] && a < b);
      });
      int32_t open = -1;  // the task reaching furthest so far
      for (int32_t t : ts) {
        // A task occupies [start, start + duration) as computed: one whose duration vanishes in the
        // sum (2.5e-195 us at 74 us) occupies nothing, as the scheduler counts it (issue 23).
        if (open >= 0 && !leq(task_end(open), s.start[static_cast<size_t>(t)]) &&
            task_end(t) > s.start[static_cast<size_t>(t)]) {
          v.push_back("tasks " + format_number(open) + " and " + format_number(t) + " overlap on lane " +
                      format_number(l) + " (" + resource_name(r) + ")");
        }
        if (open < 0 || task_end(t) > task_end(open)) open = t;
      }
    }
  }

  // Microbatch deadlines.
  if (perm) {
    for (int32_t t = 0; t < n; ++t) {
      const int32_t j = p.microbatch(t);
      const int64_t k = s.assignment[static_cast<size_t>(j)];
      if (p.phase(t) == kFwd && !leq(task_end(t), f.forward_needed[static_cast<size_t>(k)])) {
        v.push_back("forward task " + format_number(t) + " of encoder microbatch " + format_number(j) +
                    " ends at " + format_number(task_end(t)) + ", after LLM microbatch " + format_number(k) +
                    " needs it at " + format_number(f.forward_needed[static_cast<size_t>(k)]));
      }
      if (p.phase(t) == kBwd && !leq(f.grad_ready[static_cast<size_t>(k)], s.start[static_cast<size_t>(t)])) {
        v.push_back("backward task " + format_number(t) + " of encoder microbatch " + format_number(j) +
                    " starts at " + format_number(s.start[static_cast<size_t>(t)]) + ", before LLM microbatch " +
                    format_number(k) + " has its gradient at " + format_number(f.grad_ready[static_cast<size_t>(k)]));
      }
    }
  }

  // Step time and shifts.
  double first = 0.0, last = p.horizon();
  for (int32_t t = 0; t < n; ++t) {
    first = std::min(first, s.start[static_cast<size_t>(t)]);
    last = std::max(last, task_end(t));
  }
  auto close = [&](double a, double b) { return leq(a, b) && leq(b, a); };
  if (!close(s.step_time, last - first)) {
    v.push_back("step_time " + format_number(s.step_time) + " is not max(horizon, last end) - min(0, first start) = " +
                format_number(last - first));
  }
  if (!close(s.shift_front, -first)) {
    v.push_back("shift_front " + format_number(s.shift_front) + " is not -min(0, first start) = " + format_number(-first));
  }
  if (!close(s.shift_back, last - p.horizon())) {
    v.push_back("shift_back " + format_number(s.shift_back) + " is not max(horizon, last end) - horizon = " +
                format_number(last - p.horizon()));
  }
  return v;
}

}  // namespace pybubble
