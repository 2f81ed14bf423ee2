#include "pybubble/synthetic.h"
#include "pybubble/twins.h"

#include "pybubble/cancel.h"
#include "pybubble/message.h"

#include "pybubble/checks.h"
#include "pybubble/pipeline.h"

#include <algorithm>
#include <cmath>
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

}  // namespace

namespace {

void check_at_least(int64_t value, int64_t lo, const char* field) {
  if (value < lo) {
    throw std::invalid_argument(std::string(field) + ": " + format_number(value) + " is < " + format_number(lo));
  }
}

// `value` finite and above `lo` (or at least `lo` when `inclusive`).
void check_number(double value, double lo, bool inclusive, const char* field) {
  if (!std::isfinite(value) || (inclusive ? !(value >= lo) : !(value > lo))) {
    throw std::invalid_argument(std::string(field) + ": " + format_number(value) + " is not a finite number " +
                                (inclusive ? ">= " : "> ") + format_number(lo));
  }
}

}  // namespace

ProblemInput synthetic_problem(const SyntheticSpec& sp) {
  check_at_least(sp.stages, 1, "stages");
  check_at_least(sp.lanes_per_stage, 1, "lanes_per_stage");
  check_at_least(sp.twin_lanes, 1, "twin_lanes");
  check_at_least(sp.microbatches, 1, "microbatches");
  if (sp.encoder_layers < sp.stages) {
    throw std::invalid_argument("encoder_layers: " + format_number(sp.encoder_layers) + " is fewer than the stages (" +
                                format_number(sp.stages) + ")");
  }
  check_at_least(sp.kernels_per_layer, 1, "kernels_per_layer");
  check_number(sp.llm_fwd, 0.0, false, "llm_fwd");
  check_number(sp.llm_bwd, 0.0, false, "llm_bwd");
  check_at_least(sp.tp_gaps_per_op, 0, "tp_gaps_per_op");
  check_number(sp.tp_gap, 0.0, true, "tp_gap");
  if (sp.tp_gaps_per_op > 0 && !(sp.tp_gap * (sp.tp_gaps_per_op + 1.0) < sp.llm_fwd)) {
    throw std::invalid_argument("tp_gap: " + format_number(sp.tp_gaps_per_op) + " gaps of " + format_number(sp.tp_gap) +
                                " leave no compute in an LLM forward of " + format_number(sp.llm_fwd));
  }
  check_number(sp.encoder_scale, 0.0, true, "encoder_scale");
  if (!(sp.jitter >= 0 && sp.jitter < 1)) {
    throw std::invalid_argument("jitter: " + format_number(sp.jitter) + " is not in [0, 1)");
  }
  // Limits, checked on the counts the spec implies before anything is built.
  check_count(sp.stages, kMaxStages, "stages", "stages");
  check_count(sp.microbatches, kMaxMicrobatches, "microbatches", "microbatches");
  check_count(int64_t{sp.stages} * sp.lanes_per_stage, kMaxLanes, "lanes", "stages x lanes_per_stage");
  for (auto [value, field] : {std::pair{sp.llm_fwd, "llm_fwd"}, std::pair{sp.llm_bwd, "llm_bwd"},
                              std::pair{sp.tp_gap, "tp_gap"}}) {
    if (value > kMaxTime) throw std::invalid_argument(std::string(field) + ": " + format_number(value) + " " + kAboveMaxTime);
  }
  const double longest_kernel = sp.encoder_scale * 120.0 * (1.0 + sp.jitter);  // a backward MLP GEMM
  if (longest_kernel > kMaxTime) {
    throw std::invalid_argument("encoder_scale: " + format_number(sp.encoder_scale) + " makes a kernel of " +
                                format_number(longest_kernel) + " us, above the largest time (LIMITS['time'])");
  }
  const double tasks = 2.0 * sp.microbatches *
                       (static_cast<double>(sp.encoder_layers) * sp.kernels_per_layer + (sp.stages - 1));
  if (tasks > static_cast<double>(kMaxTasks)) {
    throw std::invalid_argument("microbatches x encoder_layers x kernels_per_layer: " + format_number(tasks) +
                                " tasks, more than the limit of " + format_number(kMaxTasks) + " (LIMITS['tasks'])");
  }
  const double windows = static_cast<double>(sp.stages) * sp.lanes_per_stage *
                         (2.0 * sp.microbatches * (sp.tp_gaps_per_op + 1.0) + 3.0);
  if (windows > static_cast<double>(kMaxWindows)) {
    throw std::invalid_argument("stages x lanes_per_stage x microbatches x tp_gaps_per_op: up to " +
                                format_number(windows) + " windows, more than the limit of " +
                                format_number(kMaxWindows) + " (LIMITS['windows'])");
  }
  const int32_t p = sp.stages, m = sp.microbatches, lps = sp.lanes_per_stage;
  // The LLM step: 1F1B simulated by the pipeline simulator, TP collectives inside every op.
  PipelineSpec llm;
  llm.ranks = p;
  llm.microbatches = m;
  fill_one_f_one_b(llm);
  llm.fwd.assign(static_cast<size_t>(p), sp.llm_fwd);
  llm.bwd.assign(static_cast<size_t>(p), sp.llm_bwd);
  llm.wgrad.assign(static_cast<size_t>(p), 0.0);
  llm.tp_count = sp.tp_gaps_per_op;
  llm.tp_duration = sp.tp_gap;
  const PipelineTimeline tl = simulate_pipeline(llm);
  const double horizon = tl.step_time;

  ProblemInput in;
  in.horizon = horizon;
  in.num_lanes = static_cast<int64_t>(p) * lps;
  // Each of a stage's lanes sees the stage's free windows.
  for (auto [w, src] : {std::pair{&in.compute_free, &tl.compute_free}, std::pair{&in.link_free, &tl.link_free}}) {
    w->offset.push_back(0);
    for (int32_t s = 0; s < p; ++s) {
      for (int32_t k = 0; k < lps; ++k) {
        w->start.insert(w->start.end(), src->start.begin() + src->offset[s], src->start.begin() + src->offset[s + 1]);
        w->end.insert(w->end.end(), src->end.begin() + src->offset[s], src->end.begin() + src->offset[s + 1]);
        w->offset.push_back(static_cast<int64_t>(w->start.size()));
      }
    }
  }
  in.forward_needed = tl.forward_needed;  // stage 0's forward start of each microbatch
  in.grad_ready = tl.grad_ready;          // stage 0's backward end of each microbatch
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
    poll_cancel(static_cast<int64_t>(sp.encoder_layers) * sp.kernels_per_layer);
    const int32_t sub = j % lps;
    int64_t prev = -1;
    for (int32_t ph = 0; ph < 2; ++ph) {
      for (int32_t si = 0; si < p; ++si) {
        const int32_t s = ph == kFwd ? si : p - 1 - si;
        const int32_t lane = (p - 1 - s) * lps + sub;
        const int64_t first = int64_t{sp.encoder_layers} * s / p, last = int64_t{sp.encoder_layers} * (s + 1) / p;
        for (int64_t layer = first; layer < last; ++layer) {
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
  // Each encoder lane made twin lanes running the same kernels, each after its own lane's.
  return sp.twin_lanes > 1 ? with_copies(in, sp.twin_lanes) : in;
}

SyntheticSpec vit22b_sized(int32_t microbatches, int32_t layers) {
  SyntheticSpec s;
  s.stages = 8;
  s.lanes_per_stage = 2;
  s.microbatches = microbatches;
  s.encoder_layers = layers;
  s.kernels_per_layer = 16;
  s.llm_fwd = 12000.0;
  s.llm_bwd = 24000.0;
  s.tp_gaps_per_op = 12;
  s.tp_gap = 300.0;
  s.encoder_scale = 4.0;
  return s;
}

}  // namespace pybubble
