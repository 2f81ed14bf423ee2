#include "pybubble/pipeline.h"

#include "pybubble/message.h"

#include "pybubble/cancel.h"
#include "pybubble/checks.h"
#include "pybubble/intervals.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pybubble {
namespace {

constexpr char kKindLetter[4] = {'F', 'B', 'I', 'W'};
constexpr int32_t kNoRank = -1;

// Names an action that a table too small for stages x microbatches lacks, without allocating
// per (stage, microbatch): per stage, the first microbatch with no forward or no backward (B or I).
std::string first_missing(const PipelineSpec& sp, int32_t stages) {
  std::vector<std::vector<int32_t>> fwd(static_cast<size_t>(stages)), bwd(static_cast<size_t>(stages));
  for (size_t i = 0; i < sp.stage.size(); ++i) {
    if (sp.kind[i] == kForward) fwd[sp.stage[i]].push_back(sp.microbatch[i]);
    if (sp.kind[i] == kBackward || sp.kind[i] == kInputGrad) bwd[sp.stage[i]].push_back(sp.microbatch[i]);
  }
  for (uint8_t kind : {kForward, kBackward}) {
    for (int32_t g = 0; g < stages; ++g) {
      std::vector<int32_t>& have = kind == kForward ? fwd[g] : bwd[g];
      std::sort(have.begin(), have.end());
      have.erase(std::unique(have.begin(), have.end()), have.end());
      int32_t k = 0;
      while (k < static_cast<int32_t>(have.size()) && have[k] == k) ++k;
      if (k < sp.microbatches) return action_name(g, kind, k) + (kind == kForward ? "" : " (or its I)");
    }
  }
  return "an action";
}

// A time of the spec: finite, > 0 (or >= 0 when not `positive`) and at most kMaxTime.
template <typename Where>
void check_time(double x, Where&& where, bool positive) {
  if (!std::isfinite(x) || (positive ? !(x > 0) : !(x >= 0))) {
    throw std::invalid_argument(where() + ": " + format_number(x) + (positive ? " is not > 0" : " is not >= 0"));
  }
  if (x > kMaxTime) throw std::invalid_argument(where() + ": " + format_number(x) + " " + kAboveMaxTime);
}

void check_time(double x, const char* field, bool positive) {
  check_time(x, [field] { return std::string(field); }, positive);
}

void check_costs(const std::vector<double>& v, size_t n, const char* field, bool positive) {
  if (v.size() != n) {
    throw std::invalid_argument(std::string(field) + ": " + format_number(v.size()) + " values for " +
                                format_number(n) + " (rank, chunk) pairs");
  }
  for (size_t i = 0; i < n; ++i) {
    check_time(v[i], [&] { return std::string(field) + "[" + format_number(i) + "]"; }, positive);
  }
}

}  // namespace

std::string action_name(int32_t stage, uint8_t kind, int32_t microbatch) {
  return format_number(stage) + (kind < 4 ? kKindLetter[kind] : '?') + format_number(microbatch);
}

void fill_one_f_one_b(PipelineSpec& sp) {
  if (sp.chunks != 1) throw std::invalid_argument("chunks: " + format_number(sp.chunks) + " is not 1 for 1F1B");
  const int32_t p = sp.ranks, m = sp.microbatches;
  if (p < 1) throw std::invalid_argument("ranks: " + format_number(p) + " is < 1");
  if (m < 1) throw std::invalid_argument("microbatches: " + format_number(m) + " is < 1");
  check_count(2 * static_cast<int64_t>(p) * m, kMaxActions, "actions", "table");
  sp.row_offset.assign(1, 0);
  sp.stage.clear();
  sp.kind.clear();
  sp.microbatch.clear();
  auto add = [&](int32_t r, uint8_t kind, int32_t k) {
    sp.stage.push_back(r);
    sp.kind.push_back(kind);
    sp.microbatch.push_back(k);
  };
  for (int32_t r = 0; r < p; ++r) {
    const int32_t warm = std::max(0, std::min(p - r - 1, m));
    int32_t nf = 0, nb = 0;
    for (; nf < warm; ++nf) add(r, kForward, nf);
    while (nf < m) {
      add(r, kForward, nf++);
      add(r, kBackward, nb++);
    }
    while (nb < m) add(r, kBackward, nb++);
    sp.row_offset.push_back(static_cast<int64_t>(sp.stage.size()));
  }
}

namespace {

/// The table's layout, derived once while the spec is checked: the stage count, which rank holds
/// each stage and at which chunk, each action's rank, and each action's index by (stage, kind,
/// microbatch).
struct TableIndex {
  int32_t stages = 0;                ///< S = ranks * chunks
  int32_t microbatches = 0;          ///< m
  int32_t chunks = 1;                ///< v
  bool has_tp = false;               ///< TP collectives take time inside F, B and I ops
  std::vector<int32_t> stage_rank;   ///< rank of each stage
  std::vector<int32_t> stage_chunk;  ///< chunk of each stage: its position among its rank's stages
  std::vector<int32_t> action_rank;  ///< rank of each action
  std::vector<int64_t> action_of;    ///< action index of (stage, kind, microbatch), -1 if absent

  /// The index of action (g, kind, k) in the table, or -1.
  int64_t action(int32_t g, uint8_t kind, int32_t k) const {
    return action_of[(static_cast<size_t>(g) * 4 + kind) * static_cast<size_t>(microbatches) + k];
  }
  /// The backward of (g, k): its B, else its I (-1 if neither).
  int64_t backward(int32_t g, int32_t k) const {
    const int64_t b = action(g, kBackward, k);
    return b >= 0 ? b : action(g, kInputGrad, k);
  }
  /// How long an action of `kind` on stage g takes.
  double duration(const PipelineSpec& sp, int32_t g, uint8_t kind) const {
    const size_t c = static_cast<size_t>(stage_rank[g]) * chunks + stage_chunk[g];
    switch (kind) {
      case kForward: return sp.fwd[c];
      case kBackward: return sp.bwd[c];
      case kInputGrad: return sp.bwd[c] - sp.wgrad[c];
      default: return sp.wgrad[c];
    }
  }
  /// The actions that action i waits on besides its rank's order (-1 for none): the forward of
  /// the stage before (F); its own forward and the next stage's backward (B, I); its I (W).
  void dependencies(const PipelineSpec& sp, size_t i, int64_t deps[2]) const {
    const int32_t g = sp.stage[i], k = sp.microbatch[i];
    deps[0] = deps[1] = -1;
    switch (sp.kind[i]) {
      case kForward:
        if (g > 0) deps[0] = action(g - 1, kForward, k);
        break;
      case kBackward:
      case kInputGrad:
        deps[0] = action(g, kForward, k);
        if (g + 1 < stages) deps[1] = backward(g + 1, k);
        break;
      default:
        deps[0] = action(g, kInputGrad, k);
    }
  }
};

/// Checks the table's shape (row offsets, stage, kind and microbatch of every action, one rank
/// per stage, `chunks` stages per rank, each action once, a forward and a backward per stage and
/// microbatch) and the costs (fwd, bwd > 0, 0 <= wgrad < bwd, TP collectives leaving compute in
/// every op), and derives the table's index. Throws std::invalid_argument naming the field and
/// value; nothing is allocated per stage or per (stage, microbatch) before the action count is
/// known to cover them.
TableIndex check_spec(const PipelineSpec& sp) {
  const int32_t p = sp.ranks, v = sp.chunks, m = sp.microbatches;
  if (p < 1) throw std::invalid_argument("stages: " + format_number(p) + " is < 1");
  if (v < 1) throw std::invalid_argument("chunks: " + format_number(v) + " is < 1");
  if (m < 1) throw std::invalid_argument("microbatches: " + format_number(m) + " is < 1");
  check_count(p, kMaxStages, "stages", "stages");
  check_count(v, kMaxChunks, "chunks", "chunks");
  check_count(m, kMaxMicrobatches, "microbatches", "microbatches");
  const size_t n = sp.stage.size();
  check_count(static_cast<int64_t>(n), kMaxActions, "actions", "table");
  if (sp.kind.size() != n || sp.microbatch.size() != n) {
    throw std::invalid_argument("table: stage, kind and microbatch arrays differ in length");
  }
  check_offsets(sp.row_offset, p, static_cast<int64_t>(n), "row_offset");
  // Every stage needs a forward and a backward per microbatch: a table with fewer actions is
  // rejected before anything is allocated per stage or per (stage, microbatch).
  const int64_t stages64 = static_cast<int64_t>(p) * v;
  if (2 * stages64 > static_cast<int64_t>(n) || stages64 > INT32_MAX) {
    throw std::invalid_argument("table: " + format_number(n) + " actions cannot hold a forward and a backward for " +
                                "stages * chunks = " + format_number(stages64) + " stages");
  }
  TableIndex ix;
  const int32_t S = static_cast<int32_t>(stages64);
  ix.stages = S;
  ix.microbatches = m;
  ix.chunks = v;
  // Which rank holds each stage; each rank must hold v stages.
  ix.stage_rank.assign(static_cast<size_t>(S), kNoRank);
  for (int32_t r = 0; r < p; ++r) {
    poll_cancel(1 + sp.row_offset[r + 1] - sp.row_offset[r]);
    for (int64_t i = sp.row_offset[r]; i < sp.row_offset[r + 1]; ++i) {
      const int32_t g = sp.stage[i];
      auto where = [r] { return "table[" + format_number(r) + "]"; };
      if (g < 0 || g >= S) {
        throw std::invalid_argument(where() + ": stage " + format_number(g) + " is outside 0.." + format_number(S - 1) +
                                    " (stages * chunks = " + format_number(S) + ")");
      }
      if (sp.kind[i] > kWeightGrad) {
        throw std::invalid_argument(where() + ": kind " + format_number(sp.kind[i]) + " is not F, B, I or W");
      }
      if (sp.microbatch[i] < 0 || sp.microbatch[i] >= m) {
        throw std::invalid_argument(where() + ": " + action_name(g, sp.kind[i], sp.microbatch[i]) +
                                    " has a microbatch outside 0.." + format_number(m - 1));
      }
      if (ix.stage_rank[g] != kNoRank && ix.stage_rank[g] != r) {
        throw std::invalid_argument(where() + ": stage " + format_number(g) + " also runs on rank " +
                                    format_number(ix.stage_rank[g]));
      }
      ix.stage_rank[g] = r;
    }
  }
  if (2 * static_cast<int64_t>(S) * m > static_cast<int64_t>(n)) {
    throw std::invalid_argument("table: " + first_missing(sp, S) + " is missing (" + format_number(n) +
                                " actions for " + format_number(S) + " stages and " + format_number(m) +
                                " microbatches)");
  }
  ix.stage_chunk.assign(static_cast<size_t>(S), 0);
  std::vector<int32_t> rank_stages(static_cast<size_t>(p), 0);
  for (int32_t g = 0; g < S; ++g) {
    if (ix.stage_rank[g] == kNoRank) throw std::invalid_argument("table: stage " + format_number(g) + " has no actions");
    ix.stage_chunk[g] = rank_stages[ix.stage_rank[g]]++;
  }
  for (int32_t r = 0; r < p; ++r) {
    if (rank_stages[r] != v) {
      throw std::invalid_argument("table[" + format_number(r) + "]: holds " + format_number(rank_stages[r]) +
                                  " stages, not chunks = " + format_number(v));
    }
  }
  // Each action at most once; every forward present; each backward either B or I + W.
  ix.action_of.assign(static_cast<size_t>(S) * 4 * m, -1);
  for (size_t i = 0; i < n; ++i) {
    int64_t& a = ix.action_of[(static_cast<size_t>(sp.stage[i]) * 4 + sp.kind[i]) * m + sp.microbatch[i]];
    if (a >= 0) {
      throw std::invalid_argument("table: " + action_name(sp.stage[i], sp.kind[i], sp.microbatch[i]) +
                                  " appears twice");
    }
    a = static_cast<int64_t>(i);
  }
  for (int32_t g = 0; g < S; ++g) {
    poll_cancel(m);
    for (int32_t k = 0; k < m; ++k) {
      const bool f = ix.action(g, kForward, k) >= 0, b = ix.action(g, kBackward, k) >= 0;
      const bool in = ix.action(g, kInputGrad, k) >= 0, w = ix.action(g, kWeightGrad, k) >= 0;
      if (!f) throw std::invalid_argument("table: " + action_name(g, kForward, k) + " is missing");
      if (b ? (in || w) : !(in && w)) {
        throw std::invalid_argument("table: stage " + format_number(g) + " microbatch " + format_number(k) +
                                    " needs either one B or one I and one W");
      }
    }
  }
  const size_t pairs = static_cast<size_t>(p) * v;
  check_costs(sp.fwd, pairs, "fwd", true);
  check_costs(sp.bwd, pairs, "bwd", true);
  check_costs(sp.wgrad, pairs, "wgrad", false);
  for (size_t i = 0; i < pairs; ++i) {
    if (!(sp.wgrad[i] < sp.bwd[i])) {
      throw std::invalid_argument("wgrad[" + format_number(i) + "]: " + format_number(sp.wgrad[i]) + " is not < bwd " +
                                  format_number(sp.bwd[i]));
    }
  }
  check_time(sp.p2p, "p2p", false);
  check_time(sp.tp_duration, "tp_comm.duration", false);
  check_time(sp.dp_allgather, "dp_allgather", false);
  check_time(sp.dp_reducescatter, "dp_reducescatter", false);
  if (sp.tp_count < 0) throw std::invalid_argument("tp_comm.count: " + format_number(sp.tp_count) + " is < 0");
  ix.has_tp = sp.tp_count > 0 && sp.tp_duration > 0;
  if (ix.has_tp) {
    // Every op kind with TP collectives inside (F, B, I) that the table uses must keep some compute.
    bool uses[4] = {false, false, false, false};
    for (uint8_t k : sp.kind) uses[k] = true;
    for (size_t c = 0; c < pairs; ++c) {
      double shortest = sp.fwd[c];
      if (uses[kBackward]) shortest = std::min(shortest, sp.bwd[c]);
      if (uses[kInputGrad]) shortest = std::min(shortest, sp.bwd[c] - sp.wgrad[c]);
      if (!(sp.tp_duration * (static_cast<double>(sp.tp_count) + 1.0) < shortest)) {
        throw std::invalid_argument("tp_comm: " + format_number(sp.tp_count) + " collectives of " +
                                    format_number(sp.tp_duration) + " leave no compute in an op of " + format_number(shortest) +
                                    " (rank, chunk index " + format_number(c) + ")");
      }
    }
  }
  if (ix.has_tp) {
    check_count(static_cast<int64_t>(sp.tp_count) * static_cast<int64_t>(n), kMaxTpGaps, "tp_gaps",
                "tp_comm.count x " + format_number(n) + " ops");
  }
  ix.action_rank.resize(n);
  for (int32_t r = 0; r < p; ++r) {
    for (int64_t i = sp.row_offset[r]; i < sp.row_offset[r + 1]; ++i) ix.action_rank[i] = r;
  }
  return ix;
}

/// The message of a table that cannot progress: for each rank with actions left, which action
/// its next one waits on.
std::string deadlock_message(const PipelineSpec& sp, const TableIndex& ix, const std::vector<int64_t>& next,
                             const std::vector<double>& op_end) {
  std::string msg = "table deadlocks:";
  for (int32_t r = 0; r < sp.ranks; ++r) {
    if (next[r] >= sp.row_offset[r + 1]) continue;
    const size_t i = static_cast<size_t>(next[r]);
    int64_t deps[2];
    ix.dependencies(sp, i, deps);
    for (int64_t d : deps) {
      if (d < 0 || op_end[d] >= 0) continue;
      msg += " rank " + format_number(r) + "'s " + action_name(sp.stage[i], sp.kind[i], sp.microbatch[i]) +
             " waits on " + action_name(sp.stage[d], sp.kind[d], sp.microbatch[d]) + " (rank " +
             format_number(ix.action_rank[d]) + ");";
      break;
    }
  }
  msg.pop_back();
  return msg;
}

/// Runs the table: each rank takes its actions in table order, each as soon as the rank is free
/// (from the end of the all-gather) and its dependencies are done, plus p2p for a dependency on
/// another rank. Fills the ops of `tl` and its step time. Linear in the actions: a rank that waits
/// on an action is woken when that action is done (the times do not depend on the order in which
/// ranks progress). Throws std::invalid_argument for a deadlocked table and for a step time that
/// overflows.
void run_table(const PipelineSpec& sp, const TableIndex& ix, PipelineTimeline& tl) {
  const int32_t p = sp.ranks;
  const size_t n = sp.stage.size();
  tl.op_start.assign(n, -1.0);
  tl.op_end.assign(n, -1.0);  // < 0: not done yet
  std::vector<int64_t> next(sp.row_offset.begin(), sp.row_offset.end() - 1);
  std::vector<double> free_at(static_cast<size_t>(p), sp.dp_allgather);
  // Ranks that may progress; per action, the ranks waiting on it (a list threaded through
  // next_waiter: a rank waits on one action at a time).
  std::vector<int32_t> runnable(static_cast<size_t>(p));
  for (int32_t r = 0; r < p; ++r) runnable[static_cast<size_t>(r)] = p - 1 - r;
  std::vector<int32_t> waiter_head(n, kNoRank), next_waiter(static_cast<size_t>(p), kNoRank);
  size_t done = 0;
  while (!runnable.empty()) {
    const int32_t r = runnable.back();
    runnable.pop_back();
    while (next[r] < sp.row_offset[r + 1]) {
      const size_t i = static_cast<size_t>(next[r]);
      int64_t deps[2];
      ix.dependencies(sp, i, deps);
      double ready = free_at[r];
      int64_t blocked_on = -1;
      for (int64_t d : deps) {
        if (d < 0) continue;
        if (tl.op_end[d] < 0) {
          blocked_on = d;
          break;
        }
        ready = std::max(ready, tl.op_end[d] + (ix.action_rank[d] != r ? sp.p2p : 0.0));
      }
      if (blocked_on >= 0) {
        next_waiter[r] = waiter_head[blocked_on];
        waiter_head[blocked_on] = r;
        break;
      }
      tl.op_start[i] = ready;
      tl.op_end[i] = ready + ix.duration(sp, sp.stage[i], sp.kind[i]);
      free_at[r] = tl.op_end[i];
      ++next[r];
      ++done;
      for (int32_t w = waiter_head[i]; w != kNoRank;) {
        const int32_t after = next_waiter[w];
        runnable.push_back(w);
        w = after;
      }
      waiter_head[i] = kNoRank;
      poll_cancel();
    }
  }
  if (done < n) throw std::invalid_argument(deadlock_message(sp, ix, next, tl.op_end));
  double llm_end = sp.dp_allgather;
  for (size_t i = 0; i < n; ++i) llm_end = std::max(llm_end, tl.op_end[i]);
  tl.step_time = llm_end + sp.dp_reducescatter;
  if (!std::isfinite(tl.step_time)) {
    throw std::invalid_argument("costs: the step time overflows to " + format_number(tl.step_time) +
                                " (fwd, bwd, p2p, tp_comm and dp times are too large)");
  }
  tl.op_rank = ix.action_rank;
  tl.op_stage = sp.stage;
  tl.op_kind = sp.kind;
  tl.op_microbatch = sp.microbatch;
  tl.op_chunk.resize(n);
  for (size_t i = 0; i < n; ++i) tl.op_chunk[i] = ix.stage_chunk[sp.stage[i]];
}

/// Bubbles [from, end) of `tl` (one rank's) that `take` (by kind), merged by merge_intervals into
/// `iv`.
template <typename Take>
void merged_bubbles(const PipelineTimeline& tl, size_t from, Take&& take, std::vector<Interval>& iv) {
  iv.clear();
  for (size_t i = from; i < tl.bubble_start.size(); ++i) {
    if (take(tl.bubble_kind[i])) iv.push_back({tl.bubble_start[i], tl.bubble_end[i]});
  }
  merge_intervals(iv);
}

/// Appends one row (a rank) to `free`: the intervals `iv`.
void append_row(const std::vector<Interval>& iv, WindowSet& free) {
  for (const Interval& w : iv) {
    free.start.push_back(w.start);
    free.end.push_back(w.end);
  }
  free.offset.push_back(static_cast<int64_t>(free.start.size()));
}

/// Appends one row (a rank) to `free`: [0, until] less the merged intervals `busy`.
void append_complement_row(const std::vector<Interval>& busy, double until, WindowSet& free) {
  double from = 0.0;
  for (const Interval& w : busy) {
    if (w.start > from) {
      free.start.push_back(from);
      free.end.push_back(w.start);
    }
    from = std::max(from, w.end);
  }
  if (until > from) {
    free.start.push_back(from);
    free.end.push_back(until);
  }
  free.offset.push_back(static_cast<int64_t>(free.start.size()));
}

/// Classifies every rank's idle time: the DP all-gather, the gaps between its ops (warm-up before
/// its first backward, cool-down after its last forward, steady between), the TP collectives
/// inside each F, B and I (evenly spaced), the DP reduce-scatter; the link is busy during the
/// collectives.
/// Bubbles come out in time order per rank, ranks in order; empty ones are dropped. Each rank's
/// free windows follow from its bubbles and link-busy intervals while they are in cache.
void classify_bubbles(const PipelineSpec& sp, const TableIndex& ix, PipelineTimeline& tl) {
  const int32_t p = sp.ranks;
  const size_t n = sp.stage.size();
  const double llm_end = tl.step_time - sp.dp_reducescatter;
  const size_t gaps = ix.has_tp ? n * static_cast<size_t>(sp.tp_count) : 0;
  tl.bubble_rank.reserve(gaps + n + 3 * p);
  tl.bubble_kind.reserve(gaps + n + 3 * p);
  tl.bubble_start.reserve(gaps + n + 3 * p);
  tl.bubble_end.reserve(gaps + n + 3 * p);
  // At most one free window per bubble; at most one link window per collective, plus one.
  for (WindowSet* w : {&tl.compute_free, &tl.link_free}) {
    w->offset.reserve(static_cast<size_t>(p) + 1);
    w->offset.assign(1, 0);
    w->start.reserve(gaps + n + 3 * p);
    w->end.reserve(gaps + n + 3 * p);
  }
  std::vector<Interval> iv;
  auto bubble = [&](int32_t r, uint8_t kind, double a, double b) {
    if (!(b > a)) return;
    tl.bubble_rank.push_back(r);
    tl.bubble_kind.push_back(kind);
    tl.bubble_start.push_back(a);
    tl.bubble_end.push_back(b);
  };
  for (int32_t r = 0; r < p; ++r) {
    const size_t bubbles_before = tl.bubble_start.size();
    const int64_t b0 = sp.row_offset[r], b1 = sp.row_offset[r + 1];
    double first_bwd = llm_end, last_fwd = sp.dp_allgather;
    for (int64_t i = b0; i < b1; ++i) {
      if ((sp.kind[i] == kBackward || sp.kind[i] == kInputGrad) && tl.op_start[i] < first_bwd) {
        first_bwd = tl.op_start[i];
      }
      if (sp.kind[i] == kForward) last_fwd = std::max(last_fwd, tl.op_end[i]);
    }
    auto gap = [&](double a, double b) {
      const uint8_t kind = b <= first_bwd ? kPpWarmup : a >= last_fwd ? kPpCooldown : kPpSteady;
      bubble(r, kind, a, b);
    };
    bubble(r, kDpAllgather, 0.0, sp.dp_allgather);
    double t = sp.dp_allgather;
    for (int64_t i = b0; i < b1; ++i) {
      poll_cancel(1 + sp.tp_count);
      gap(t, tl.op_start[i]);
      if (ix.has_tp && sp.kind[i] != kWeightGrad) {
        const double len = tl.op_end[i] - tl.op_start[i];
        for (int32_t c = 1; c <= sp.tp_count; ++c) {
          const double gs = tl.op_start[i] + len * c / (static_cast<double>(sp.tp_count) + 1.0) - sp.tp_duration / 2;
          bubble(r, kTp, gs, gs + sp.tp_duration);
        }
      }
      t = tl.op_end[i];
    }
    gap(t, llm_end);
    bubble(r, kDpReducescatter, llm_end, tl.step_time);
    merged_bubbles(tl, bubbles_before, [](uint8_t) { return true; }, iv);
    append_row(iv, tl.compute_free);
    merged_bubbles(tl, bubbles_before, [](uint8_t k) { return k == kTp || k == kDpAllgather || k == kDpReducescatter; }, iv);
    append_complement_row(iv, tl.step_time, tl.link_free);
  }
}

/// The encoder's dependency points of each LLM microbatch k: F_k, when stage 0 starts its forward,
/// and B_k, when stage 0 ends its backward (B or I).
void dependency_points(const TableIndex& ix, PipelineTimeline& tl) {
  const int32_t m = ix.microbatches;
  tl.forward_needed.resize(static_cast<size_t>(m));
  tl.grad_ready.resize(static_cast<size_t>(m));
  for (int32_t k = 0; k < m; ++k) {
    tl.forward_needed[k] = tl.op_start[ix.action(0, kForward, k)];
    tl.grad_ready[k] = tl.op_end[ix.backward(0, k)];
  }
}

}  // namespace

PipelineTimeline simulate_pipeline(const PipelineSpec& sp) {
  const TableIndex ix = check_spec(sp);
  PipelineTimeline tl;
  run_table(sp, ix, tl);
  classify_bubbles(sp, ix, tl);
  dependency_points(ix, tl);
  return tl;
}

}  // namespace pybubble
