// Simulates p = 8, m = 32, v = 12 interleaved 1F1B with 12 layers per chunk and 2 TP collectives
// per layer (24 per F/B op): 6,144 ops, about 150k ops and gaps.
#include <benchmark/benchmark.h>

#include <algorithm>

#include "pybubble/pipeline.h"

namespace pybubble {
namespace {

// Megatron's interleaved 1F1B table (m a multiple of p), the same as pybubble.schedules.
PipelineSpec interleaved(int32_t p, int32_t v, int32_t m) {
  PipelineSpec sp;
  sp.ranks = p;
  sp.chunks = v;
  sp.microbatches = m;
  sp.row_offset.assign(1, 0);
  const int32_t total = v * m;
  for (int32_t r = 0; r < p; ++r) {
    const int32_t warm = std::min((v - 1) * p + 2 * (p - 1 - r), total);
    std::vector<int32_t> fcount(v, 0), bcount(v, 0);
    auto add = [&](bool bwd, int32_t step) {
      int32_t local = (step / p) % v;
      if (bwd) local = v - 1 - local;
      int32_t& c = bwd ? bcount[local] : fcount[local];
      sp.stage.push_back(local * p + r);
      sp.kind.push_back(bwd ? kBackward : kForward);
      sp.microbatch.push_back(c++);
    };
    for (int32_t s = 0; s < total; ++s) {
      if (s < warm) {
        add(false, s);
      } else {
        add(false, s);
        add(true, s - warm);
      }
    }
    for (int32_t s = total - warm; s < total; ++s) add(true, s);
    sp.row_offset.push_back(static_cast<int64_t>(sp.stage.size()));
  }
  sp.fwd.assign(p * v, 1200.0);
  sp.bwd.assign(p * v, 2400.0);
  sp.wgrad.assign(p * v, 0.0);
  sp.tp_count = 24;
  sp.tp_duration = 30.0;
  sp.p2p = 20.0;
  sp.dp_allgather = 3000.0;
  sp.dp_reducescatter = 8000.0;
  return sp;
}

void BM_SimulateInterleaved(benchmark::State& state) {
  const PipelineSpec sp = interleaved(8, 12, 32);
  size_t items = 0;
  for (auto _ : state) {
    PipelineTimeline tl = simulate_pipeline(sp);
    items = tl.op_start.size() + tl.bubble_start.size();
    benchmark::DoNotOptimize(tl.step_time);
  }
  state.counters["ops_and_gaps"] = static_cast<double>(items);
  if (items < 100000) state.SkipWithError("fewer ops and gaps than expected");
}
BENCHMARK(BM_SimulateInterleaved)->Unit(benchmark::kMillisecond);


}  // namespace
}  // namespace pybubble
