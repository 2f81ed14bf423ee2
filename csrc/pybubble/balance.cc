#include "pybubble/balance.h"

#include "pybubble/cancel.h"
#include "pybubble/checks.h"
#include "pybubble/message.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace pybubble {
namespace {

void check(const double* costs, int64_t n, int64_t m) {
  if (n < 1) throw std::invalid_argument("costs: no samples");
  check_count(n, kMaxSamples, "samples", "costs");
  if (m < 1 || m > n) {
    throw std::invalid_argument("num_microbatches: " + format_number(m) + " is not in [1, " +
                                format_number(n) + "] (the number of samples)");
  }
  // Times, so that every sum of up to kMaxSamples of them stays finite.
  for (int64_t i = 0; i < 2 * n; ++i) {
    check_duration(costs[i], [i] { return "costs[" + format_number(i / 2) + ", " + format_number(i % 2) + "]"; });
  }
}

}  // namespace

double balance_lower_bound(const double* costs, int64_t n, int64_t m) {
  check(costs, n, m);
  double sum[2] = {0.0, 0.0}, largest = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (int d = 0; d < 2; ++d) {
      sum[d] += costs[2 * i + d];
      largest = std::max(largest, costs[2 * i + d]);
    }
  }
  return std::max({sum[0] / static_cast<double>(m), sum[1] / static_cast<double>(m), largest});
}

double max_microbatch_cost(const double* costs, int64_t n, const int64_t* assignment, int64_t m) {
  check(costs, n, m);
  std::vector<double> load(static_cast<size_t>(2 * m), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (assignment[i] < 0 || assignment[i] >= m) {
      throw std::invalid_argument("assignment[" + format_number(i) + "]: " + format_number(assignment[i]) +
                                  " is not in [0, " + format_number(m) + ")");
    }
    for (int d = 0; d < 2; ++d) load[static_cast<size_t>(2 * assignment[i] + d)] += costs[2 * i + d];
  }
  return *std::max_element(load.begin(), load.end());
}

std::vector<int64_t> balance_microbatches(const double* costs, int64_t n, int64_t m) {
  check(costs, n, m);
  // Normalise each part by its own lower bound, so both parts are balanced, whichever dominates.
  double scale[2];
  for (int d = 0; d < 2; ++d) {
    double sum = 0.0, largest = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      sum += costs[2 * i + d];
      largest = std::max(largest, costs[2 * i + d]);
    }
    const double lb = std::max(sum / static_cast<double>(m), largest);
    scale[d] = lb > 0.0 ? 1.0 / lb : 0.0;
  }
  auto nc = [&](int64_t i, int d) { return costs[2 * i + d] * scale[d]; };  // normalised
  auto c = [&](int64_t i, int d) { return costs[2 * i + d]; };               // raw
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::max(nc(a, 0), nc(a, 1)) > std::max(nc(b, 0), nc(b, 1));
  });
  std::vector<double> load(static_cast<size_t>(2 * m), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(m), 0), out(static_cast<size_t>(n), 0);
  // Largest first: each sample to the microbatch where it raises the larger normalised part least
  // (empty microbatches first, so none stays empty). Loads are kept raw.
  for (int64_t i : order) {
    poll_cancel(m);
    int64_t best = 0;
    double best_key = INFINITY, best_sum = INFINITY;
    for (int64_t k = 0; k < m; ++k) {
      const double e = (load[static_cast<size_t>(2 * k)] + c(i, 0)) * scale[0];
      const double l = (load[static_cast<size_t>(2 * k + 1)] + c(i, 1)) * scale[1];
      const double key = count[static_cast<size_t>(k)] == 0 ? -1.0 : std::max(e, l);
      if (key < best_key || (key == best_key && e + l < best_sum)) {
        best = k;
        best_key = key;
        best_sum = e + l;
      }
    }
    out[static_cast<size_t>(i)] = best;
    load[static_cast<size_t>(2 * best)] += c(i, 0);
    load[static_cast<size_t>(2 * best + 1)] += c(i, 1);
    ++count[static_cast<size_t>(best)];
  }
  // Improve the raw objective: move a sample out of the bottleneck microbatch, or swap it with one
  // elsewhere, while that lowers the larger of the two microbatches' loads. Bounded rounds.
  auto peak = [&](int64_t k) { return std::max(load[static_cast<size_t>(2 * k)], load[static_cast<size_t>(2 * k + 1)]); };
  // With one microbatch there is nowhere to move a sample: skip the rounds (they would find
  // nothing, after n * n pair checks).
  for (int round = 0; m > 1 && round < 4 * m; ++round) {
    int64_t top = 0;
    for (int64_t k = 1; k < m; ++k) {
      if (peak(k) > peak(top)) top = k;
    }
    const double now = peak(top);
    bool improved = false;
    for (int64_t i = 0; i < n && !improved; ++i) {
      if (out[static_cast<size_t>(i)] != top || count[static_cast<size_t>(top)] < 2) continue;
      poll_cancel(m);
      for (int64_t k = 0; k < m && !improved; ++k) {
        if (k == top) continue;
        const double te = load[static_cast<size_t>(2 * top)] - c(i, 0), tl = load[static_cast<size_t>(2 * top + 1)] - c(i, 1);
        const double ke = load[static_cast<size_t>(2 * k)] + c(i, 0), kl = load[static_cast<size_t>(2 * k + 1)] + c(i, 1);
        if (std::max({te, tl, ke, kl}) < now * (1.0 - 1e-12)) {
          out[static_cast<size_t>(i)] = k;
          load[static_cast<size_t>(2 * top)] = te;
          load[static_cast<size_t>(2 * top + 1)] = tl;
          load[static_cast<size_t>(2 * k)] = ke;
          load[static_cast<size_t>(2 * k + 1)] = kl;
          --count[static_cast<size_t>(top)];
          ++count[static_cast<size_t>(k)];
          improved = true;
        }
      }
    }
    for (int64_t i = 0; i < n && !improved; ++i) {
      if (out[static_cast<size_t>(i)] != top) continue;
      poll_cancel(n);
      for (int64_t q = 0; q < n && !improved; ++q) {
        const int64_t k = out[static_cast<size_t>(q)];
        if (k == top) continue;
        const double de = c(q, 0) - c(i, 0), dl = c(q, 1) - c(i, 1);
        const double te = load[static_cast<size_t>(2 * top)] + de, tl = load[static_cast<size_t>(2 * top + 1)] + dl;
        const double ke = load[static_cast<size_t>(2 * k)] - de, kl = load[static_cast<size_t>(2 * k + 1)] - dl;
        if (std::max({te, tl, ke, kl}) < now * (1.0 - 1e-12)) {
          std::swap(out[static_cast<size_t>(i)], out[static_cast<size_t>(q)]);
          load[static_cast<size_t>(2 * top)] = te;
          load[static_cast<size_t>(2 * top + 1)] = tl;
          load[static_cast<size_t>(2 * k)] = ke;
          load[static_cast<size_t>(2 * k + 1)] = kl;
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
  return out;
}

}  // namespace pybubble
