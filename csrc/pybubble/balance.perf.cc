// Microbatch balancing speed: 4,096 samples into 64 microbatches (target: under 10 ms).
#include <benchmark/benchmark.h>

#include <random>

#include "pybubble/balance.h"

namespace pybubble {
namespace {

void BM_Balance(benchmark::State& state) {
  const int64_t n = state.range(0), m = state.range(1);
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> enc(0.0, 1.0), llm(0.0, 0.5);
  std::vector<double> c;
  for (int64_t i = 0; i < n; ++i) c.insert(c.end(), {enc(rng), llm(rng)});
  double ratio = 0.0;
  for (auto _ : state) {
    const auto a = balance_microbatches(c.data(), n, m);
    ratio = max_microbatch_cost(c.data(), n, a.data(), m) / balance_lower_bound(c.data(), n, m);
  }
  state.counters["cost_over_bound"] = ratio;
  if (ratio > 1.02) state.SkipWithError("more than 2% above the lower bound");
}
BENCHMARK(BM_Balance)->Args({4096, 64})->Args({1024, 32})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pybubble
