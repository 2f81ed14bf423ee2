// The LLM pipeline simulator: runs an action table (torch.distributed.pipelining's format) with
// per-stage costs, point-to-point latency, TP collectives inside ops and exposed DP collectives,
// and yields every op, every bubble with its kind, each rank's free windows and the encoder's dependency
// points.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pybubble/problem.h"

namespace pybubble {

/// Kinds of pipeline actions, as in torch.distributed.pipelining ("F", "B", "I", "W").
enum ActionKind : uint8_t {
  kForward = 0,      ///< F: forward of one microbatch through one stage
  kBackward = 1,     ///< B: full backward (input and weight gradient)
  kInputGrad = 2,    ///< I: backward for the input gradient only
  kWeightGrad = 3,   ///< W: backward for the weight gradient only
};

/// Kinds of bubbles (compute idle) on a pipeline rank.
enum BubbleKind : uint8_t {
  kDpAllgather = 0,      ///< exposed DP parameter all-gather at the step start
  kPpWarmup = 1,         ///< before the rank's first backward
  kPpSteady = 2,         ///< between the first backward and the last forward
  kPpCooldown = 3,       ///< after the rank's last forward
  kTp = 4,               ///< TP collective inside an op (compute idle, link busy)
  kDpReducescatter = 5,  ///< exposed DP gradient reduce-scatter at the step end
};

/// The action table and costs. Times are microseconds.
struct PipelineSpec {
  int32_t ranks = 0;         ///< pipeline ranks (GPU groups), p
  int32_t chunks = 1;        ///< model chunks per rank, v; the table has p * v stages
  int32_t microbatches = 0;  ///< microbatches, m
  /// The table, flattened: actions of rank r are [row_offset[r], row_offset[r + 1]).
  std::vector<int64_t> row_offset;
  std::vector<int32_t> stage;       ///< global stage of each action (0 .. p*v-1)
  std::vector<uint8_t> kind;        ///< ActionKind of each action
  std::vector<int32_t> microbatch;  ///< microbatch of each action
  /// Costs per (rank, chunk), index rank * chunks + chunk; chunk = position of the stage among the
  /// rank's stages in ascending order. bwd is a full backward B; an I takes bwd - wgrad, a W wgrad.
  std::vector<double> fwd, bwd, wgrad;
  double p2p = 0.0;                ///< latency added to a dependency that crosses ranks
  int32_t tp_count = 0;            ///< TP collectives inside each F, B and I op
  double tp_duration = 0.0;        ///< length of one TP collective
  double dp_allgather = 0.0;       ///< exposed all-gather before the first op
  double dp_reducescatter = 0.0;   ///< exposed reduce-scatter after the last op
};

/// The simulated step: ops (in each rank's order), bubbles and free windows per rank. The link is
/// busy exactly during the bubbles of kinds kTp, kDpAllgather and kDpReducescatter.
struct PipelineTimeline {
  double step_time = 0.0;  ///< from 0 to the end of the reduce-scatter
  std::vector<int32_t> op_rank, op_chunk, op_stage, op_microbatch;  ///< per op
  std::vector<uint8_t> op_kind;                                      ///< per op (ActionKind)
  std::vector<double> op_start, op_end;                              ///< per op
  std::vector<int32_t> bubble_rank;                                  ///< per bubble
  std::vector<uint8_t> bubble_kind;                                  ///< per bubble (BubbleKind)
  std::vector<double> bubble_start, bubble_end;                      ///< per bubble, sorted per rank
  std::vector<double> forward_needed;  ///< F_k: stage 0 starts the forward of microbatch k
  std::vector<double> grad_ready;      ///< B_k: stage 0 ends the backward (B or I) of microbatch k
  /// The windows each rank leaves free, one CSR row per rank (a problem's lane windows):
  /// compute_free = its bubbles, touching or overlapping ones merged; link_free = [0, step_time]
  /// less its merged link-busy intervals (TP and DP collectives).
  WindowSet compute_free, link_free;
};

/// Simulates `spec`: each rank runs its actions in table order, each as soon as the rank is free
/// and its dependencies are done. Throws std::invalid_argument naming the field and value for bad
/// input, and for a deadlocked table naming which action waits on which.
PipelineTimeline simulate_pipeline(const PipelineSpec& spec);

/// Fills the table of `spec` with 1F1B for spec.ranks and spec.microbatches (chunks must be 1):
/// rank r runs min(p - r - 1, m) warm-up forwards, then one forward and one backward in turn,
/// then its remaining backwards. The one 1F1B of pybubble: the Python tables and the generated
/// problems both take it from here. Throws std::invalid_argument for ranks or microbatches < 1
/// and for a table over LIMITS['actions'].
void fill_one_f_one_b(PipelineSpec& spec);

/// The action's name in torch's notation, e.g. "3F12".
std::string action_name(int32_t stage, uint8_t kind, int32_t microbatch);

}  // namespace pybubble
