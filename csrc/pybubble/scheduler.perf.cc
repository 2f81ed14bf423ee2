// Scheduler speed over generated problems of about 1k to 1M tasks; reports tasks per second.
#include <benchmark/benchmark.h>

#include "pybubble/scheduler.h"
#include "pybubble/synthetic.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

// The ViT-22B-sized shape (synthetic.h); `microbatches` and `layers` set the size: with 32
// microbatches and 48 layers the ViT-22B-sized problem (~50k tasks, ~25k windows).
SyntheticSpec spec_for(int32_t microbatches, int32_t layers) { return vit22b_sized(microbatches, layers); }

void BM_Schedule(benchmark::State& state) {
  const Policy policy = state.range(2) ? Policy::kGreedy : Policy::kCoarse;
  Problem p(synthetic_problem(spec_for(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)))));
  Scheduler sched(p);
  // Benchmarks also check their result.
  if (!validate(p, sched.run(policy)).empty()) state.SkipWithError("invalid schedule");
  for (auto _ : state) {
    benchmark::DoNotOptimize(sched.run(policy).step_time);
  }
  state.counters["tasks"] = p.num_tasks();
  // Tasks scheduled per second; ns per task = 1e9 / tasks_per_s.
  state.counters["tasks_per_s"] =
      benchmark::Counter(p.num_tasks(), benchmark::Counter::kIsIterationInvariantRate);
}

// The floor: one first-fit pass over the same tasks and windows (see first_fit_floor).
void BM_FirstFitFloor(benchmark::State& state) {
  Problem p(synthetic_problem(spec_for(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)))));
  std::vector<double> start;
  const double end = first_fit_floor(p, start);
  if (!(end >= p.horizon()) || start.size() != static_cast<size_t>(p.num_tasks())) state.SkipWithError("bad floor");
  for (auto _ : state) {
    benchmark::DoNotOptimize(first_fit_floor(p, start));
  }
  state.counters["tasks"] = p.num_tasks();
  state.counters["tasks_per_s"] =
      benchmark::Counter(p.num_tasks(), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FirstFitFloor)->Args({32, 48})->Unit(benchmark::kMicrosecond);

// {microbatches, layers, greedy}: ~1k, ~6k, ~50k (ViT-22B-sized), ~200k, ~1M tasks.
BENCHMARK(BM_Schedule)
    ->Args({4, 8, 1})
    ->Args({8, 24, 1})
    ->Args({32, 48, 1})
    ->Args({32, 48, 0})
    ->Args({64, 96, 1})
    ->Args({128, 240, 1})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pybubble
