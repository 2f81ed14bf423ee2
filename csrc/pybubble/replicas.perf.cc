// Rescheduling many data-parallel replicas of one problem in one call: replicas per second.
#include <benchmark/benchmark.h>

#include "pybubble/replicas.h"
#include "pybubble/synthetic.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

// The ViT-22B-sized problem (synthetic.h), each encoder lane made `twins` twin lanes.
SyntheticSpec spec_for(int32_t twins) {
  SyntheticSpec s = vit22b_sized();
  s.twin_lanes = twins;
  return s;
}

// {twin lanes, threads}: 48 replicas, each microbatch scaled by 0.5 to 1.5.
void BM_ReplicaSchedules(benchmark::State& state) {
  Problem p(synthetic_problem(spec_for(static_cast<int32_t>(state.range(0)))));
  ReplicaScheduler all(p, static_cast<int32_t>(state.range(1)), Policy::kGreedy, true);
  const int64_t replicas = 48;
  std::vector<double> scale;
  for (int64_t k = 0; k < replicas; ++k) {
    for (int32_t j = 0; j < p.num_microbatches(); ++j) scale.push_back(0.5 + static_cast<double>((k * 7 + j * 3) % 11) / 10.0);
  }
  ReplicaSchedules out;
  all.run(scale.data(), replicas, out);
  // Benchmarks also check their result: replica 0 valid for its durations.
  ProblemInput in = p.input();
  for (int32_t t = 0; t < p.num_tasks(); ++t) in.duration[static_cast<size_t>(t)] *= scale[static_cast<size_t>(p.microbatch(t))];
  if (!validate(Problem(std::move(in)), out.schedule(0)).empty()) state.SkipWithError("invalid schedule");
  for (auto _ : state) {
    all.run(scale.data(), replicas, out);
    benchmark::DoNotOptimize(out.step_time.data());
  }
  state.counters["tasks"] = p.num_tasks();
  state.counters["replicas_per_s"] = benchmark::Counter(static_cast<double>(replicas), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ReplicaSchedules)->Args({1, 1})->Args({8, 1})->Args({8, 2})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace pybubble
