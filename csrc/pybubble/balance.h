// Microbatch balancing: samples with an encoder cost and an LLM cost, split into microbatches so
// that the largest per-microbatch cost of either part is as small as possible; and the moves of
// images' encoder work between data-parallel replicas that even out their loads.
#pragma once

#include <cstdint>
#include <vector>

namespace pybubble {

/// Assigns each of the n samples (costs[2 i] = encoder cost, costs[2 i + 1] = LLM cost; finite,
/// in [0, kMaxTime]) to one of `num_microbatches` microbatches (1 <= num_microbatches <= n), every microbatch
/// non-empty. Greedy largest-first placement in costs normalised by each part's lower bound (so
/// both parts are balanced), then moves and swaps out of the bottleneck microbatch while they
/// lower the largest raw cost. O(n log n + n m).
/// Throws std::invalid_argument for bad input.
std::vector<int64_t> balance_microbatches(const double* costs, int64_t n, int64_t num_microbatches);

/// max over microbatches and parts of the summed cost (the quantity balancing minimises).
double max_microbatch_cost(const double* costs, int64_t n, const int64_t* assignment, int64_t num_microbatches);

/// The lower bound of max_microbatch_cost over all assignments into non-empty microbatches:
/// max(sum of each part / num_microbatches, the largest single cost).
double balance_lower_bound(const double* costs, int64_t n, int64_t num_microbatches);

/// Moves of encoder work between `replicas` data-parallel replicas (pybubble.schedule.balance.
/// balance_replicas gives the rules): image i costs cost[i] (finite, in [0, kMaxTime]) and belongs
/// to replica owner[i] (in [0, replicas)), its output needed in LLM slot slot[i] (>= 0; `slot` may
/// be null: no slots). Returns rows (image, from, to), flattened, in the order they were decided:
/// greedy passes (one per slot with `slot`, then one over the totals), each giving the images of
/// the replicas above the mean load, heaviest first (ties: the lower index), to the lightest
/// replica (ties: the lower index): the largest image within both what the giver has above the
/// mean and what the taker has below it (else the smallest, if the taker stays below the giver)
/// that the taker may take. Sums are taken in index order (a per-slot group's in the order
/// slot, owner, cost, index), so the result is the same on every machine. Throws
/// std::invalid_argument naming the field for bad input.
std::vector<int64_t> balance_replicas(const double* cost, const int64_t* owner, const int64_t* slot, int64_t n,
                                      int64_t replicas);

}  // namespace pybubble
