// Microbatch balancing: samples with an encoder cost and an LLM cost, split into microbatches so
// that the largest per-microbatch cost of either part is as small as possible.
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

}  // namespace pybubble
