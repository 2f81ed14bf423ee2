#include "pybubble/balance.h"

#include "pybubble/cancel.h"
#include "pybubble/checks.h"
#include "pybubble/message.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>
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

namespace {

// One greedy pass of balance_replicas: the images ids[bounds[k]:bounds[k + 1]] of replica k (by
// cost ascending, with `costs` alongside) even out `load` (per replica); fits(image, taker, cost)
// says whether a taker may take an image, update(image, giver, taker, cost) is told of each move.
// A taker that may take none of a giver's images that would help sits out until the next giver.
template <typename Fits, typename Update>
void even_out(const std::vector<int64_t>& ids, const std::vector<double>& costs, const std::vector<int64_t>& bounds,
              std::vector<double>& load, std::vector<int64_t>& moves, Fits&& fits, Update&& update) {
  const int64_t r = static_cast<int64_t>(load.size());
  double total = 0.0;
  for (const double x : load) total += x;
  const double mean = total / static_cast<double>(r);
  using Taker = std::pair<double, int64_t>;  // (load, replica): the least first, ties by index
  std::vector<Taker> takers;
  for (int64_t k = 0; k < r; ++k) {
    if (load[static_cast<size_t>(k)] < mean) takers.emplace_back(load[static_cast<size_t>(k)], k);
  }
  const auto later = std::greater<Taker>();
  std::make_heap(takers.begin(), takers.end(), later);
  const auto pop = [&] {
    std::pop_heap(takers.begin(), takers.end(), later);
    const Taker t = takers.back();
    takers.pop_back();
    return t;
  };
  const auto push = [&](Taker t) {
    takers.push_back(t);
    std::push_heap(takers.begin(), takers.end(), later);
  };
  std::vector<int64_t> givers(static_cast<size_t>(r));
  std::iota(givers.begin(), givers.end(), 0);
  std::stable_sort(givers.begin(), givers.end(),
                   [&](int64_t a, int64_t b) { return load[static_cast<size_t>(a)] > load[static_cast<size_t>(b)]; });
  std::vector<double> mine;
  std::vector<int64_t> images;
  std::vector<Taker> waiting;
  for (const int64_t giver : givers) {
    poll_cancel(1 + bounds[static_cast<size_t>(giver) + 1] - bounds[static_cast<size_t>(giver)]);
    if (!(load[static_cast<size_t>(giver)] > mean) || takers.empty()) break;
    const int64_t lo = bounds[static_cast<size_t>(giver)], hi = bounds[static_cast<size_t>(giver) + 1];
    mine.assign(costs.begin() + lo, costs.begin() + hi);
    images.assign(ids.begin() + lo, ids.begin() + hi);
    double have = load[static_cast<size_t>(giver)];
    waiting.clear();
    while (have > mean && !takers.empty() && !mine.empty()) {
      double room = takers.front().first;
      const int64_t taker = takers.front().second;
      int64_t k = (std::upper_bound(mine.begin(), mine.end(), std::min(have - mean, mean - room)) - mine.begin()) - 1;
      if (k < 0) {
        if (room + mine[0] >= have) break;
        k = 0;
      }
      while (k >= 0 && !fits(images[static_cast<size_t>(k)], taker, mine[static_cast<size_t>(k)])) --k;
      if (k < 0) {
        waiting.push_back(pop());
        continue;
      }
      const double c = mine[static_cast<size_t>(k)];
      const int64_t image = images[static_cast<size_t>(k)];
      mine.erase(mine.begin() + k);
      images.erase(images.begin() + k);
      moves.insert(moves.end(), {image, giver, taker});
      update(image, giver, taker, c);
      have = have - c;
      room = room + c;
      load[static_cast<size_t>(taker)] = room;
      pop();
      if (room < mean) push({room, taker});
    }
    load[static_cast<size_t>(giver)] = have;
    for (const Taker& t : waiting) push(t);
  }
}

// `order` (images by cost, then index) grouped stably by key(image): sorted by (key, cost, index).
// Keys in [0, keys) are counted when there are few of them; otherwise `less` compares them.
template <typename Key, typename Less>
std::vector<int64_t> grouped(const std::vector<int64_t>& order, int64_t keys, Key&& key, Less&& less) {
  std::vector<int64_t> out(order.size());
  if (keys > 4 * static_cast<int64_t>(order.size()) + 1024) {
    out = order;
    std::stable_sort(out.begin(), out.end(), less);
    return out;
  }
  std::vector<int64_t> at(static_cast<size_t>(keys) + 1, 0);
  for (const int64_t i : order) ++at[static_cast<size_t>(key(i)) + 1];
  for (size_t k = 0; k + 1 < at.size(); ++k) at[k + 1] += at[k];
  for (const int64_t i : order) out[static_cast<size_t>(at[static_cast<size_t>(key(i))]++)] = i;
  return out;
}

}  // namespace

std::vector<int64_t> balance_replicas(const double* cost, const int64_t* owner, const int64_t* slot, int64_t n,
                                      int64_t replicas) {
  if (replicas < 1) throw std::invalid_argument("replicas: " + format_number(replicas) + " is not >= 1");
  check_count(replicas, kMaxReplicas, "replicas", "replicas");
  check_count(n, kMaxSamples, "samples", "image_cost");
  for (int64_t i = 0; i < n; ++i) {
    check_duration(cost[i], [i] { return "image_cost[" + format_number(i) + "]"; });
    if (owner[i] < 0 || owner[i] >= replicas) {
      throw std::invalid_argument("image_owner[" + format_number(i) + "]: " + format_number(owner[i]) +
                                  " is not in [0, " + format_number(replicas) + ")");
    }
    if (slot != nullptr && slot[i] < 0) {
      throw std::invalid_argument("image_slot[" + format_number(i) + "]: " + format_number(slot[i]) + " is negative");
    }
  }
  const size_t r = static_cast<size_t>(replicas);
  std::vector<int64_t> moves;
  std::vector<int64_t> eligible;
  for (int64_t i = 0; i < n; ++i) {
    if (cost[i] > 0.0) eligible.push_back(i);
  }
  if (eligible.empty()) return moves;  // nothing to move
  // The images with a cost, by cost then index, once; each pass groups them stably.
  std::vector<int64_t> by_cost = eligible;
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](int64_t a, int64_t b) { return cost[a] < cost[b]; });
  std::vector<double> total(r, 0.0);
  for (int64_t i = 0; i < n; ++i) total[static_cast<size_t>(owner[i])] += cost[i];
  std::vector<int64_t> ids;
  std::vector<double> costs;
  std::vector<int64_t> bounds(r + 1);
  // ids and costs: `order` by owner (then cost, index); bounds: where each replica's images begin.
  const auto by_owner = [&](const std::vector<int64_t>& order) {
    ids = grouped(order, replicas, [&](int64_t i) { return owner[i]; },
                  [&](int64_t a, int64_t b) { return owner[a] < owner[b]; });
    costs.clear();
    for (const int64_t i : ids) costs.push_back(cost[i]);
    int64_t at = 0;
    for (size_t q = 0; q <= r; ++q) {
      while (at < static_cast<int64_t>(ids.size()) && owner[ids[static_cast<size_t>(at)]] < static_cast<int64_t>(q)) ++at;
      bounds[q] = at;
    }
  };
  if (slot == nullptr) {
    by_owner(by_cost);
    even_out(ids, costs, bounds, total, moves, [](int64_t, int64_t, double) { return true; },
             [](int64_t, int64_t, int64_t, double) {});
    return moves;
  }
  // The slots that occur, each once, as dense indices.
  const int64_t top = *std::max_element(slot, slot + n);
  std::vector<int64_t> dense(static_cast<size_t>(n));
  int64_t width = 0;
  if (top < 4 * n) {  // a table over the slots' values
    std::vector<int64_t> index(static_cast<size_t>(top) + 1, -1);
    for (int64_t i = 0; i < n; ++i) index[static_cast<size_t>(slot[i])] = 0;
    for (int64_t& x : index) x = x < 0 ? -1 : width++;
    for (int64_t i = 0; i < n; ++i) dense[static_cast<size_t>(i)] = index[static_cast<size_t>(slot[i])];
  } else {
    std::vector<int64_t> slots(slot, slot + n);
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    for (int64_t i = 0; i < n; ++i) dense[static_cast<size_t>(i)] = std::lower_bound(slots.begin(), slots.end(), slot[i]) - slots.begin();
    width = static_cast<int64_t>(slots.size());
  }
  // A pass per slot, each taker taking only while its total stays within the largest total.
  const int64_t groups = width <= (std::numeric_limits<int64_t>::max() / 2) / replicas ? width * replicas
                                                                                       : std::numeric_limits<int64_t>::max();
  ids = grouped(
      by_cost, groups, [&](int64_t i) { return dense[static_cast<size_t>(i)] * replicas + owner[i]; },
      [&](int64_t a, int64_t b) {
        return std::make_pair(dense[static_cast<size_t>(a)], owner[a]) < std::make_pair(dense[static_cast<size_t>(b)], owner[b]);
      });
  for (const int64_t i : ids) costs.push_back(cost[i]);
  const double cap = *std::max_element(total.begin(), total.end());
  std::vector<double> load(r);
  for (size_t lo = 0; lo < ids.size();) {
    size_t hi = lo;
    while (hi < ids.size() && slot[ids[hi]] == slot[ids[lo]]) ++hi;
    int64_t at = static_cast<int64_t>(lo);
    for (size_t q = 0; q <= r; ++q) {
      while (at < static_cast<int64_t>(hi) && owner[ids[static_cast<size_t>(at)]] < static_cast<int64_t>(q)) ++at;
      bounds[q] = at;
    }
    std::fill(load.begin(), load.end(), 0.0);
    for (size_t x = lo; x < hi; ++x) load[static_cast<size_t>(owner[ids[x]])] += costs[x];
    even_out(
        ids, costs, bounds, load, moves,
        [&](int64_t, int64_t taker, double c) { return total[static_cast<size_t>(taker)] + c <= cap; },
        [&](int64_t, int64_t giver, int64_t taker, double c) {
          total[static_cast<size_t>(giver)] -= c;
          total[static_cast<size_t>(taker)] += c;
        });
    lo = hi;
  }
  // Then the totals with the images not yet moved, a taker taking only while its load in the
  // image's slot stays within that slot's largest.
  std::vector<int64_t> runs_on(owner, owner + n);
  std::vector<uint8_t> moved(static_cast<size_t>(n), 0);
  for (size_t x = 0; x < moves.size(); x += 3) {
    moved[static_cast<size_t>(moves[x])] = 1;
    runs_on[static_cast<size_t>(moves[x])] = moves[x + 2];
  }
  const size_t w = static_cast<size_t>(width);
  std::vector<double> slot_load(r * w, 0.0), slot_cap(w, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    slot_load[static_cast<size_t>(runs_on[static_cast<size_t>(i)]) * w + static_cast<size_t>(dense[static_cast<size_t>(i)])] += cost[i];
  }
  for (size_t q = 0; q < r; ++q) {
    for (size_t s = 0; s < w; ++s) slot_cap[s] = q == 0 ? slot_load[s] : std::max(slot_cap[s], slot_load[q * w + s]);
  }
  std::vector<int64_t> rest;
  for (const int64_t i : by_cost) {
    if (!moved[static_cast<size_t>(i)]) rest.push_back(i);
  }
  by_owner(rest);
  even_out(
      ids, costs, bounds, total, moves,
      [&](int64_t image, int64_t taker, double c) {
        const size_t s = static_cast<size_t>(dense[static_cast<size_t>(image)]);
        return slot_load[static_cast<size_t>(taker) * w + s] + c <= slot_cap[s];
      },
      [&](int64_t image, int64_t giver, int64_t taker, double c) {
        const size_t s = static_cast<size_t>(dense[static_cast<size_t>(image)]);
        slot_load[static_cast<size_t>(giver) * w + s] -= c;
        slot_load[static_cast<size_t>(taker) * w + s] += c;
      });
  return moves;
}

}  // namespace pybubble
