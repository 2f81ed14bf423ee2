#include "pybubble/free_intervals.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace pybubble {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

FreeIntervals::FreeIntervals(const Problem& problem, const std::vector<int64_t>& tasks_per_key) : p_(problem) {
  const size_t keys = 2 * static_cast<size_t>(p_.num_lanes());
  if (tasks_per_key.size() != keys) throw std::logic_error("FreeIntervals: one task count per key");
  base_.resize(keys + 1);
  count_.assign(keys, 0);
  gap_.assign(keys, 0);
  base_[0] = 0;
  for (size_t k = 0; k < keys; ++k) {
    const WindowSet& ws = p_.windows(static_cast<int>(k % 2));
    const int64_t windows = ws.offset[k / 2 + 1] - ws.offset[k / 2];
    base_[k + 1] = base_[k] + windows + tasks_per_key[k] + 2;
  }
  s_.resize(static_cast<size_t>(base_[keys]));
  e_.resize(static_cast<size_t>(base_[keys]));
}

void FreeIntervals::reset() {
  log_.clear();
  const size_t keys = count_.size();
  for (size_t k = 0; k < keys; ++k) {
    const WindowSet& ws = p_.windows(static_cast<int>(k % 2));
    double* const S = s_.data() + base_[k];
    double* const E = e_.data() + base_[k];
    int64_t n = 0;
    for (int64_t w = ws.offset[k / 2]; w < ws.offset[k / 2 + 1]; ++w) {
      const double a = ws.start[static_cast<size_t>(w)], b = ws.end[static_cast<size_t>(w)];
      if (n > 0 && a <= E[n - 1]) {
        E[n - 1] = std::max(E[n - 1], b);
      } else {
        S[n] = a;
        E[n] = b;
        ++n;
      }
    }
    count_[k] = n;
    gap_[k] = n;
  }
}

namespace {
// A key's intervals as two sorted runs of the slab, before the gap (`lo`, g of them) and after it
// (`hi`, n - g): interval i is lo[i] below g, hi[i - g] from g.
struct Runs {
  const double* lo;
  const double* hi;
  int64_t g, n;
  double operator[](int64_t i) const { return i < g ? lo[i] : hi[i - g]; }
  // The first index whose value is >= x (`strict`: > x).
  int64_t first_from(double x, bool strict) const {
    const auto past = [&](double v) { return strict ? v > x : v >= x; };
    if (g > 0 && past(lo[g - 1])) {
      return (strict ? std::upper_bound(lo, lo + g, x) : std::lower_bound(lo, lo + g, x)) - lo;
    }
    return g + ((strict ? std::upper_bound(hi, hi + (n - g), x) : std::lower_bound(hi, hi + (n - g), x)) - hi);
  }
};
}  // namespace

int64_t FreeIntervals::earliest(int32_t k, double ready, double d, double limit, double* start) const {
  const size_t kk = static_cast<size_t>(k);
  const int64_t n = count_[kk], g = gap_[kk], skip = base_[kk + 1] - base_[kk] - n;
  const Runs S{s_.data() + base_[kk], s_.data() + base_[kk] + g + skip, g, n};
  const Runs E{e_.data() + base_[kk], e_.data() + base_[kk] + g + skip, g, n};
  for (int64_t i = E.first_from(ready, false); i < n; ++i) {
    const double s = std::max(ready, S[i]);
    if (s + d > limit) return -1;
    if (s + d <= E[i]) {
      *start = s;
      return i;
    }
  }
  return -1;
}

int64_t FreeIntervals::latest(int32_t k, double late, double d, double floor, double* start) const {
  const size_t kk = static_cast<size_t>(k);
  const int64_t n = count_[kk], g = gap_[kk], skip = base_[kk + 1] - base_[kk] - n;
  const Runs S{s_.data() + base_[kk], s_.data() + base_[kk] + g + skip, g, n};
  const Runs E{e_.data() + base_[kk], e_.data() + base_[kk] + g + skip, g, n};
  for (int64_t i = S.first_from(late, true) - 1; i >= 0; --i) {
    const double s = std::min(late, E[i]) - d;
    if (s < floor) return -1;
    if (s >= S[i]) {
      *start = s;
      return i;
    }
  }
  return -1;
}

void FreeIntervals::move_gap(int32_t k, int64_t i) {
  const size_t kk = static_cast<size_t>(k);
  const int64_t g = gap_[kk], skip = base_[kk + 1] - base_[kk] - count_[kk];
  double* const S = s_.data() + base_[kk];
  double* const E = e_.data() + base_[kk];
  if (i < g) {  // intervals [i, g) go after the gap
    std::copy_backward(S + i, S + g, S + g + skip);
    std::copy_backward(E + i, E + g, E + g + skip);
  } else if (i > g) {  // intervals [g, i) go before it
    std::copy(S + g + skip, S + i + skip, S + g);
    std::copy(E + g + skip, E + i + skip, E + g);
  }
  gap_[kk] = i;
}

void FreeIntervals::insert(int32_t k, int64_t i, double a, double b) {
  const size_t kk = static_cast<size_t>(k);
  if (base_[kk] + count_[kk] >= base_[kk + 1]) throw std::logic_error("FreeIntervals: more intervals than room");
  move_gap(k, i);  // the new interval takes the gap's first slot
  s_[static_cast<size_t>(base_[kk] + i)] = a;
  e_[static_cast<size_t>(base_[kk] + i)] = b;
  gap_[kk] = i + 1;
  ++count_[kk];
}

void FreeIntervals::erase(int32_t k, int64_t i) {
  const size_t kk = static_cast<size_t>(k);
  move_gap(k, i);  // interval i is the first after the gap: the gap takes its slot
  --count_[kk];
}

void FreeIntervals::take(int32_t k, int64_t i, double start, double d) {
  if (!(d > 0.0)) return;
  const size_t at = this->at(k, i);
  const double a = s_[at], b = e_[at], end = start + d;
  const bool left = start - a > kSliver, right = b - end > kSliver;
  if (left) {
    log_.push_back({k, kSetEnd, i, b, 0.0});
    e_[at] = start;
    if (right) {
      insert(k, i + 1, end, b);
      log_.push_back({k, kInserted, i + 1, 0.0, 0.0});
    }
  } else if (right) {
    log_.push_back({k, kSetStart, i, a, 0.0});
    s_[at] = end;
  } else {
    erase(k, i);
    log_.push_back({k, kErased, i, a, b});
  }
}

void FreeIntervals::occupy(int32_t k, double start, double d) {
  if (!(d > 0.0)) return;
  const double end = start + d;
  int64_t lo = 0, hi = count_[static_cast<size_t>(k)];  // the first interval starting after `start`
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (this->start(k, mid) <= start) lo = mid + 1;
    else hi = mid;
  }
  for (int64_t i = std::max<int64_t>(lo - 1, 0); i < count_[static_cast<size_t>(k)] && this->start(k, i) < end;) {
    const double a = std::max(start, this->start(k, i)), b = std::min(end, this->end(k, i));
    if (b > a) {
      const int64_t before = count_[static_cast<size_t>(k)];
      take(k, i, a, b - a);
      i += 1 + count_[static_cast<size_t>(k)] - before;  // past what is left of interval i
    } else {
      ++i;
    }
  }
}

void FreeIntervals::undo(size_t mark) {
  while (log_.size() > mark) {
    const Change c = log_.back();
    log_.pop_back();
    switch (c.op) {
      case kSetStart: s_[at(c.key, c.i)] = c.a; break;
      case kSetEnd: e_[at(c.key, c.i)] = c.a; break;
      case kInserted: erase(c.key, c.i); break;
      case kErased: insert(c.key, c.i, c.a, c.b); break;
    }
  }
}

void FreeIntervals::open_front() {
  for (int32_t k = 0; k < static_cast<int32_t>(count_.size()); ++k) {
    const size_t first = at(k, 0);
    if (count_[static_cast<size_t>(k)] > 0 && s_[first] <= 0.0) {
      s_[first] = -kInf;
    } else {
      insert(k, 0, -kInf, 0.0);
    }
  }
}

void FreeIntervals::close_front() {
  for (int32_t k = 0; k < static_cast<int32_t>(count_.size()); ++k) {
    const size_t first = at(k, 0);
    if (count_[static_cast<size_t>(k)] > 0 && s_[first] == -kInf) {
      if (e_[first] > 0.0) {
        s_[first] = 0.0;
      } else {
        erase(k, 0);
      }
    }
  }
}

void FreeIntervals::open_back() {
  const double horizon = p_.horizon();
  for (int32_t k = 0; k < static_cast<int32_t>(count_.size()); ++k) {
    const int64_t n = count_[static_cast<size_t>(k)];
    if (n > 0 && e_[at(k, n - 1)] >= horizon) {
      e_[at(k, n - 1)] = kInf;
    } else {
      insert(k, n, horizon, kInf);
    }
  }
}

}  // namespace pybubble
