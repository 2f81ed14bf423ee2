#include "pybubble/synthetic.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pybubble {
namespace {

// A ViT layer's kernels in order, with a relative cost and the resource they use. The backward
// runs the list in reverse with GEMMs split in input- and weight-gradient halves (same total).
struct KernelShape {
  double cost;
  uint8_t resource;
};
constexpr KernelShape kLayer[16] = {
    {4, kCompute},   // layer norm 1
    {30, kCompute},  // Q GEMM
    {30, kCompute},  // K GEMM
    {30, kCompute},  // V GEMM
    {45, kCompute},  // flash attention
    {30, kCompute},  // output projection GEMM
    {20, kComm},     // TP all-reduce
    {3, kCompute},   // residual add
    {4, kCompute},   // layer norm 2
    {60, kCompute},  // MLP up GEMM (first half)
    {60, kCompute},  // MLP up GEMM (second half)
    {8, kCompute},   // GELU
    {60, kCompute},  // MLP down GEMM (first half)
    {60, kCompute},  // MLP down GEMM (second half)
    {20, kComm},     // TP all-reduce
    {3, kCompute},   // residual add
};

// SplitMix64: a small, fully specified generator (same numbers on every platform).
struct SplitMix64 {
  uint64_t x;
  uint64_t next() {
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

struct Op {
  double start, end;
};

// Uniform-cost 1F1B: stage s runs min(p - s - 1, m) warm-up forwards, then alternates one
// forward and one backward, then drains its backwards. Returns per stage the ops in order, and
// fills the per-stage forward/backward op of each microbatch.
void one_f_one_b(const SyntheticSpec& sp, std::vector<std::vector<Op>>& ops,
                 std::vector<std::vector<Op>>& fwd, std::vector<std::vector<Op>>& bwd) {
  const int32_t p = sp.stages, m = sp.microbatches;
  // Per stage: the sequence of (is_backward, microbatch).
  std::vector<std::vector<std::pair<bool, int32_t>>> order(static_cast<size_t>(p));
  for (int32_t s = 0; s < p; ++s) {
    const int32_t warm = std::min(p - s - 1, m);
    int32_t nf = 0, nb = 0;
    for (; nf < warm; ++nf) order[s].push_back({false, nf});
    while (nf < m) {
      order[s].push_back({false, nf++});
      order[s].push_back({true, nb++});
    }
    while (nb < m) order[s].push_back({true, nb++});
  }
  fwd.assign(static_cast<size_t>(p), std::vector<Op>(static_cast<size_t>(m), Op{-1, -1}));
  bwd = fwd;
  ops.assign(static_cast<size_t>(p), {});
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  size_t done = 0, total = static_cast<size_t>(2 * p * m);
  while (done < total) {
    bool progressed = false;
    for (int32_t s = 0; s < p; ++s) {
      while (next[s] < order[s].size()) {
        const auto [is_bwd, mb] = order[s][next[s]];
        double ready;
        if (!is_bwd) {
          if (s > 0 && fwd[s - 1][mb].end < 0) break;
          ready = s > 0 ? fwd[s - 1][mb].end : 0.0;
        } else {
          if (s + 1 < p && bwd[s + 1][mb].end < 0) break;
          ready = s + 1 < p ? bwd[s + 1][mb].end : fwd[s][mb].end;
        }
        const double st = std::max(ready, free_at[s]);
        const Op op{st, st + (is_bwd ? sp.llm_bwd : sp.llm_fwd)};
        (is_bwd ? bwd : fwd)[s][mb] = op;
        ops[s].push_back(op);
        free_at[s] = op.end;
        ++next[s];
        ++done;
        progressed = true;
      }
    }
    if (!progressed) throw std::logic_error("1F1B table deadlocked");
  }
}

}  // namespace

ProblemInput synthetic_problem(const SyntheticSpec& sp) {
  if (sp.stages < 1) throw std::invalid_argument("stages: " + std::to_string(sp.stages) + " is < 1");
  if (sp.lanes_per_stage < 1) {
    throw std::invalid_argument("lanes_per_stage: " + std::to_string(sp.lanes_per_stage) + " is < 1");
  }
  if (sp.microbatches < 1) {
    throw std::invalid_argument("microbatches: " + std::to_string(sp.microbatches) + " is < 1");
  }
  if (sp.encoder_layers < sp.stages) {
    throw std::invalid_argument("encoder_layers: " + std::to_string(sp.encoder_layers) +
                                " is fewer than the stages");
  }
  if (sp.kernels_per_layer < 1) {
    throw std::invalid_argument("kernels_per_layer: " + std::to_string(sp.kernels_per_layer) + " is < 1");
  }
  if (!(sp.llm_fwd > 0) || !(sp.llm_bwd > 0)) throw std::invalid_argument("llm_fwd, llm_bwd: must be > 0");
  if (sp.tp_gaps_per_op < 0 || !(sp.tp_gap >= 0)) {
    throw std::invalid_argument("tp_gaps_per_op, tp_gap: must be >= 0");
  }
  if (sp.tp_gaps_per_op > 0 && !(sp.tp_gap * (sp.tp_gaps_per_op + 1) < sp.llm_fwd)) {
    throw std::invalid_argument("tp_gap: " + std::to_string(sp.tp_gap) + " leaves no compute in an LLM forward");
  }
  if (!(sp.encoder_scale >= 0) || !(sp.jitter >= 0 && sp.jitter < 1)) {
    throw std::invalid_argument("encoder_scale must be >= 0 and jitter in [0, 1)");
  }
  const int32_t p = sp.stages, m = sp.microbatches, lps = sp.lanes_per_stage;
  std::vector<std::vector<Op>> ops, fwd, bwd;
  one_f_one_b(sp, ops, fwd, bwd);
  double horizon = 0.0;
  for (const auto& st : ops) horizon = std::max(horizon, st.back().end);

  ProblemInput in;
  in.horizon = horizon;
  in.num_lanes = static_cast<int64_t>(p) * lps;
  for (WindowSet* w : {&in.compute_free, &in.link_free}) w->offset.push_back(0);
  for (int32_t s = 0; s < p; ++s) {
    // Compute windows: the gaps between ops and the TP gaps inside them. Link windows: all but
    // the TP gaps. Each of the stage's lanes sees the same windows.
    std::vector<Op> cw, lw;
    double t = 0.0, link_from = 0.0;
    for (const Op& op : ops[s]) {
      if (op.start > t) cw.push_back({t, op.start});
      const int32_t g = sp.tp_gaps_per_op;
      const double len = op.end - op.start;
      for (int32_t i = 1; i <= g && sp.tp_gap > 0; ++i) {
        const double gs = op.start + len * i / (g + 1) - sp.tp_gap / 2;
        cw.push_back({gs, gs + sp.tp_gap});
        if (gs > link_from) lw.push_back({link_from, gs});
        link_from = gs + sp.tp_gap;
      }
      t = op.end;
    }
    if (horizon > t) cw.push_back({t, horizon});
    if (horizon > link_from) lw.push_back({link_from, horizon});
    for (int32_t k = 0; k < lps; ++k) {
      for (auto [w, src] : {std::pair{&in.compute_free, &cw}, std::pair{&in.link_free, &lw}}) {
        for (const Op& o : *src) {
          w->start.push_back(o.start);
          w->end.push_back(o.end);
        }
        w->offset.push_back(static_cast<int64_t>(w->start.size()));
      }
    }
  }
  for (int32_t k = 0; k < m; ++k) {
    in.forward_needed.push_back(fwd[0][k].start);
    in.grad_ready.push_back(bwd[0][k].end);
  }
  // Encoder: microbatch j runs on lane (j mod lanes_per_stage) of every stage, layers split over
  // the stages; forward chain stage 0 -> p-1, a point-to-point send between stages (comm), then
  // the backward chain back from p-1 to 0. Encoder stage e sits on LLM stage p-1-e, whose
  // warm-up bubble is the longest where the encoder's first layers must run.
  SplitMix64 rng{sp.seed * 0x2545F4914F6CDD1DULL + 1};
  in.after_offset.push_back(0);
  auto add = [&](int32_t lane, int32_t j, double d, uint8_t res, uint8_t ph, int64_t pred) {
    in.lane.push_back(lane);
    in.microbatch.push_back(j);
    in.duration.push_back(d * sp.encoder_scale * (1.0 + sp.jitter * (2.0 * rng.uniform() - 1.0)));
    in.resource.push_back(res);
    in.phase.push_back(ph);
    if (pred >= 0) in.after.push_back(pred);
    in.after_offset.push_back(static_cast<int64_t>(in.after.size()));
    return static_cast<int64_t>(in.duration.size()) - 1;
  };
  for (int32_t j = 0; j < m; ++j) {
    const int32_t sub = j % lps;
    int64_t prev = -1;
    for (int32_t ph = 0; ph < 2; ++ph) {
      for (int32_t si = 0; si < p; ++si) {
        const int32_t s = ph == kFwd ? si : p - 1 - si;
        const int32_t lane = (p - 1 - s) * lps + sub;
        const int32_t first = sp.encoder_layers * s / p, last = sp.encoder_layers * (s + 1) / p;
        for (int32_t layer = first; layer < last; ++layer) {
          for (int32_t k = 0; k < sp.kernels_per_layer; ++k) {
            const int32_t idx = ph == kFwd ? k % 16 : 15 - (k % 16);
            const KernelShape& ks = kLayer[idx];
            const double cost = ph == kFwd || ks.resource == kComm ? ks.cost : 2.0 * ks.cost;
            prev = add(lane, j, cost, ks.resource, static_cast<uint8_t>(ph), prev);
          }
        }
        const bool boundary = ph == kFwd ? s + 1 < p : s > 0;
        if (boundary) prev = add(lane, j, 10.0, kComm, static_cast<uint8_t>(ph), prev);
      }
    }
  }
  return in;
}

}  // namespace pybubble
