// Generated, realistic problems: a 1F1B LLM pipeline with TP gaps, and a ViT-like encoder made of
// kernel chains. Used by the tests, the benchmarks, the CLI's examples and the Python generator.
#pragma once

#include <cstdint>

#include "pybubble/problem.h"

namespace pybubble {

/// Shape of a generated problem. Times are microseconds.
struct SyntheticSpec {
  int32_t stages = 4;             ///< LLM pipeline stages; the encoder pipeline uses the same count
  int32_t lanes_per_stage = 2;    ///< encoder lanes (e.g. encoder TP groups) on each stage's GPUs
  int32_t twin_lanes = 1;         ///< copies of every encoder lane: the same windows and kernels (twins.h)
  int32_t microbatches = 8;       ///< LLM microbatches = encoder microbatches
  int32_t encoder_layers = 8;     ///< encoder layers in all, split evenly over the stages
  int32_t kernels_per_layer = 16; ///< kernels per layer and phase (cycling a ViT layer's kernels)
  double llm_fwd = 4000.0;        ///< one LLM forward op (one microbatch, one stage)
  double llm_bwd = 8000.0;        ///< one LLM backward op
  int32_t tp_gaps_per_op = 4;     ///< TP collectives inside each LLM op
  double tp_gap = 150.0;          ///< length of one TP collective (compute idle, link busy)
  double encoder_scale = 1.0;     ///< multiplies every encoder kernel's duration
  double jitter = 0.2;            ///< kernel durations vary by up to this fraction
  uint64_t seed = 0;              ///< random seed for the jitter
};

/// The benchmarks' ViT-22B-sized shape: 8 stages x 2 lanes, LLM ops of 12 and 24 ms with 12 TP
/// gaps of 300 us each, encoder kernels x 4; with 32 microbatches and 48 layers about 50k tasks
/// and 25k windows.
SyntheticSpec vit22b_sized(int32_t microbatches = 32, int32_t layers = 48);

/// Builds the problem of `spec`; throws std::invalid_argument for a bad spec.
ProblemInput synthetic_problem(const SyntheticSpec& spec);

}  // namespace pybubble
