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
  }
}

int64_t FreeIntervals::earliest(int32_t k, double ready, double d, double limit, double* start) const {
  const double* const S = s_.data() + base_[static_cast<size_t>(k)];
  const double* const E = e_.data() + base_[static_cast<size_t>(k)];
  const int64_t n = count_[static_cast<size_t>(k)];
  for (int64_t i = std::lower_bound(E, E + n, ready) - E; i < n; ++i) {
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
  const double* const S = s_.data() + base_[static_cast<size_t>(k)];
  const double* const E = e_.data() + base_[static_cast<size_t>(k)];
  const int64_t n = count_[static_cast<size_t>(k)];
  for (int64_t i = (std::upper_bound(S, S + n, late) - S) - 1; i >= 0; --i) {
    const double s = std::min(late, E[i]) - d;
    if (s < floor) return -1;
    if (s >= S[i]) {
      *start = s;
      return i;
    }
  }
  return -1;
}

void FreeIntervals::insert(int32_t k, int64_t i, double a, double b) {
  const size_t kk = static_cast<size_t>(k);
  const int64_t n = count_[kk];
  if (base_[kk] + n >= base_[kk + 1]) throw std::logic_error("FreeIntervals: more intervals than room");
  double* const S = s_.data() + base_[kk];
  double* const E = e_.data() + base_[kk];
  std::copy_backward(S + i, S + n, S + n + 1);
  std::copy_backward(E + i, E + n, E + n + 1);
  S[i] = a;
  E[i] = b;
  count_[kk] = n + 1;
}

void FreeIntervals::erase(int32_t k, int64_t i) {
  const size_t kk = static_cast<size_t>(k);
  const int64_t n = count_[kk];
  double* const S = s_.data() + base_[kk];
  double* const E = e_.data() + base_[kk];
  std::copy(S + i + 1, S + n, S + i);
  std::copy(E + i + 1, E + n, E + i);
  count_[kk] = n - 1;
}

void FreeIntervals::take(int32_t k, int64_t i, double start, double d) {
  if (!(d > 0.0)) return;
  const size_t at = static_cast<size_t>(base_[static_cast<size_t>(k)] + i);
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

void FreeIntervals::undo(size_t mark) {
  while (log_.size() > mark) {
    const Change c = log_.back();
    log_.pop_back();
    const size_t at = static_cast<size_t>(base_[static_cast<size_t>(c.key)] + c.i);
    switch (c.op) {
      case kSetStart: s_[at] = c.a; break;
      case kSetEnd: e_[at] = c.a; break;
      case kInserted: erase(c.key, c.i); break;
      case kErased: insert(c.key, c.i, c.a, c.b); break;
    }
  }
}

void FreeIntervals::open_front() {
  for (int32_t k = 0; k < static_cast<int32_t>(count_.size()); ++k) {
    const size_t at = static_cast<size_t>(base_[static_cast<size_t>(k)]);
    if (count_[static_cast<size_t>(k)] > 0 && s_[at] <= 0.0) {
      s_[at] = -kInf;
    } else {
      insert(k, 0, -kInf, 0.0);
    }
  }
}

void FreeIntervals::close_front() {
  for (int32_t k = 0; k < static_cast<int32_t>(count_.size()); ++k) {
    const size_t at = static_cast<size_t>(base_[static_cast<size_t>(k)]);
    if (count_[static_cast<size_t>(k)] > 0 && s_[at] == -kInf) {
      if (e_[at] > 0.0) {
        s_[at] = 0.0;
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
    const size_t last = static_cast<size_t>(base_[static_cast<size_t>(k)] + n - 1);
    if (n > 0 && e_[last] >= horizon) {
      e_[last] = kInf;
    } else {
      insert(k, n, horizon, kInf);
    }
  }
}

}  // namespace pybubble
