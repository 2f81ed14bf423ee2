#include "pybubble/problem.h"

#include "pybubble/cancel.h"
#include "pybubble/checks.h"
#include "pybubble/message.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace pybubble {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

/// `where()` names the field; it is called only to build the message of a failure, so the
/// checks of large problems build no strings.
template <typename Where>
void check_finite(double v, Where&& where) {
  if (!std::isfinite(v)) fail(where() + ": " + format_number(v) + " is not a finite number");
}

void check_windows(const WindowSet& w, int64_t num_lanes, double horizon, const char* name) {
  const std::string n = name;
  if (w.start.size() != w.end.size()) {
    fail(n + ".start, " + n + ".end: " + format_number(w.start.size()) + " starts and " + format_number(w.end.size()) +
         " ends");
  }
  check_count(static_cast<int64_t>(w.start.size()), kMaxWindows, "windows", n);
  check_offsets(w.offset, num_lanes, static_cast<int64_t>(w.start.size()), n + ".offset");
  for (int64_t l = 0; l < num_lanes; ++l) {
    const int64_t b = w.offset[static_cast<size_t>(l)], e = w.offset[static_cast<size_t>(l + 1)];
    double prev_end = 0.0;
    for (int64_t i = b; i < e; ++i) {
      const auto f = [&] {
        return "lanes[" + format_number(l) + "]." + n + "[" + format_number(i - b) + "]";
      };
      const double s = w.start[static_cast<size_t>(i)], en = w.end[static_cast<size_t>(i)];
      check_finite(s, [&] { return f() + "[0]"; });
      check_finite(en, [&] { return f() + "[1]"; });
      if (!(s < en)) fail(f() + ": start " + format_number(s) + " is not before end " + format_number(en));
      if (s < 0.0) fail(f() + ": start " + format_number(s) + " is before 0");
      if (en > horizon) fail(f() + ": end " + format_number(en) + " is after the horizon " + format_number(horizon));
      if (i > b && s < prev_end) {
        fail(f() + ": start " + format_number(s) + " overlaps or precedes the previous window ending at " +
             format_number(prev_end) + " (windows must be sorted and disjoint)");
      }
      prev_end = en;
    }
  }
}

}  // namespace

Problem::Problem(ProblemInput in) : in_(std::move(in)) {
  check_duration(in_.horizon, [] { return std::string("horizon"); });
  if (in_.num_lanes < 0) fail("lanes: " + format_number(in_.num_lanes) + " is not a number of lanes");
  check_count(in_.num_lanes, kMaxLanes, "lanes", "lanes");
  check_windows(in_.compute_free, in_.num_lanes, in_.horizon, "compute_free");
  check_windows(in_.link_free, in_.num_lanes, in_.horizon, "link_free");

  const size_t m = in_.forward_needed.size();
  if (in_.grad_ready.size() != m) fail("microbatches: forward_needed and grad_ready differ in length");
  check_count(static_cast<int64_t>(m), kMaxMicrobatches, "microbatches", "microbatches");
  for (size_t k = 0; k < m; ++k) {
    const auto f = [&] { return "microbatches[" + format_number(k) + "]"; };
    const double fn = in_.forward_needed[k], gr = in_.grad_ready[k];
    check_finite(fn, [&] { return f() + ".forward_needed"; });
    check_finite(gr, [&] { return f() + ".grad_ready"; });
    if (fn < 0.0 || fn > in_.horizon) {
      fail(f() + ".forward_needed: " + format_number(fn) + " is outside [0, horizon=" + format_number(in_.horizon) + "]");
    }
    if (gr < 0.0 || gr > in_.horizon) {
      fail(f() + ".grad_ready: " + format_number(gr) + " is outside [0, horizon=" + format_number(in_.horizon) + "]");
    }
    if (gr < fn) fail(f() + ".grad_ready: " + format_number(gr) + " is before forward_needed " + format_number(fn));
  }
  compute_free_ = std::make_shared<const WindowSet>(std::move(in_.compute_free));
  link_free_ = std::make_shared<const WindowSet>(std::move(in_.link_free));
  in_.compute_free = WindowSet{};
  in_.link_free = WindowSet{};
  index_tasks();
}

Problem::Problem(const Problem& like, ProblemInput tasks) : compute_free_(like.compute_free_), link_free_(like.link_free_) {
  in_.horizon = like.in_.horizon;
  in_.num_lanes = like.in_.num_lanes;
  in_.forward_needed = like.in_.forward_needed;
  in_.grad_ready = like.in_.grad_ready;
  in_.lane = std::move(tasks.lane);
  in_.microbatch = std::move(tasks.microbatch);
  in_.duration = std::move(tasks.duration);
  in_.resource = std::move(tasks.resource);
  in_.phase = std::move(tasks.phase);
  in_.after_offset = std::move(tasks.after_offset);
  in_.after = std::move(tasks.after);
  index_tasks();
}

Problem::Problem(const Problem& like, const std::vector<const Problem*>& blocks, const std::vector<int64_t>& counts)
    : compute_free_(like.compute_free_), link_free_(like.link_free_) {
  in_.horizon = like.in_.horizon;
  in_.num_lanes = like.in_.num_lanes;
  in_.forward_needed = like.in_.forward_needed;
  in_.grad_ready = like.in_.grad_ready;
  if (blocks.size() != counts.size()) {
    fail("counts: " + format_number(counts.size()) + " counts for " + format_number(blocks.size()) + " blocks");
  }
  const int64_t m = static_cast<int64_t>(in_.forward_needed.size());
  int64_t copies = 0, n = 0, preds = 0, succs = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Problem& blk = *blocks[b];
    const auto f = [&] { return "blocks[" + format_number(b) + "]"; };
    if (blk.compute_free_ != compute_free_ || blk.link_free_ != link_free_ || blk.in_.horizon != in_.horizon ||
        blk.in_.forward_needed != in_.forward_needed || blk.in_.grad_ready != in_.grad_ready) {
      fail(f() + ": not a problem on these bubbles (make it with_tasks of them)");
    }
    if (blk.num_tasks() > 0 && blk.mb_off_[2] != blk.num_tasks()) {
      fail(f() + ": holds tasks of a microbatch other than 0");
    }
    if (counts[b] < 0) fail("counts[" + format_number(b) + "]: " + format_number(counts[b]) + " is negative");
    copies += counts[b];
    if (copies > m) {
      fail("counts: " + format_number(copies) + " microbatches or more, the problem has " + format_number(m));
    }
    n += counts[b] * blk.num_tasks();
    preds += counts[b] * static_cast<int64_t>(blk.pred_.size());
    succs += counts[b] * static_cast<int64_t>(blk.succ_.size());
    check_count(n, kMaxTasks, "tasks", "tasks");
    check_count(preds, kMaxPredecessors, "predecessors", "tasks.after");
  }
  const size_t un = static_cast<size_t>(n);
  for (auto* v : {&in_.lane, &in_.microbatch, &in_.resource, &in_.phase}) v->resize(un);
  in_.duration.resize(un);
  in_.after_offset.resize(un + 1);
  in_.after.resize(static_cast<size_t>(preds));
  lane_.resize(un);
  microbatch_.resize(un);
  resource_.resize(un);
  phase_.resize(un);
  pred_off_.resize(un + 1);
  pred_.resize(static_cast<size_t>(preds));
  succ_off_.resize(un + 1);
  mb_off_.assign(static_cast<size_t>(2 * m + 1), 0);
  mb_tasks_.resize(un);
  succ_.resize(static_cast<size_t>(succs));
  pred_off_[0] = succ_off_[0] = in_.after_offset[0] = 0;
  size_t at = 0, at_pred = 0, at_succ = 0;  // where the next copy's tasks, predecessors and successors go
  int32_t j = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Problem& blk = *blocks[b];
    const size_t bn = static_cast<size_t>(blk.num_tasks());
    // The block's forward tasks, then its backward (a block of no task may have no microbatch to index).
    const size_t fwd = bn == 0 ? 0 : static_cast<size_t>(blk.mb_off_[1]);
    for (int64_t c = 0; c < counts[b]; ++c, ++j) {
      poll_cancel(static_cast<int64_t>(bn));
      const int32_t o = static_cast<int32_t>(at);
      const int64_t po = static_cast<int64_t>(at_pred), so = static_cast<int64_t>(at_succ);
      std::copy_n(blk.in_.lane.begin(), bn, in_.lane.begin() + at);
      std::copy_n(blk.in_.resource.begin(), bn, in_.resource.begin() + at);
      std::copy_n(blk.in_.phase.begin(), bn, in_.phase.begin() + at);
      std::copy_n(blk.in_.duration.begin(), bn, in_.duration.begin() + at);
      std::fill_n(in_.microbatch.begin() + at, bn, j);
      std::copy_n(blk.lane_.begin(), bn, lane_.begin() + at);
      std::copy_n(blk.resource_.begin(), bn, resource_.begin() + at);
      std::copy_n(blk.phase_.begin(), bn, phase_.begin() + at);
      std::fill_n(microbatch_.begin() + at, bn, j);
      for (size_t i = 1; i <= bn; ++i) pred_off_[at + i] = po + blk.pred_off_[i];
      std::copy_n(pred_off_.begin() + at + 1, bn, in_.after_offset.begin() + at + 1);
      for (size_t i = 1; i <= bn; ++i) succ_off_[at + i] = so + blk.succ_off_[i];
      for (size_t i = 0; i < bn; ++i) mb_tasks_[at + i] = o + blk.mb_tasks_[i];
      for (size_t q = 0; q < blk.pred_.size(); ++q) pred_[at_pred + q] = o + blk.pred_[q];
      std::copy_n(pred_.begin() + at_pred, blk.pred_.size(), in_.after.begin() + at_pred);
      for (size_t q = 0; q < blk.succ_.size(); ++q) succ_[at_succ + q] = o + blk.succ_[q];
      mb_off_[static_cast<size_t>(2 * j + 1)] = static_cast<int64_t>(at + fwd);
      mb_off_[static_cast<size_t>(2 * j + 2)] = static_cast<int64_t>(at + bn);
      at += bn;
      at_pred += blk.pred_.size();
      at_succ += blk.succ_.size();
    }
  }
  for (int64_t k = 2 * j + 1; k <= 2 * m; ++k) mb_off_[static_cast<size_t>(k)] = static_cast<int64_t>(at);
}

ProblemInput Problem::input() const {
  ProblemInput out = in_;
  out.compute_free = *compute_free_;
  out.link_free = *link_free_;
  return out;
}

void Problem::index_tasks() {
  const size_t m = in_.forward_needed.size();
  const size_t n = in_.duration.size();
  check_count(static_cast<int64_t>(n), kMaxTasks, "tasks", "tasks");
  check_count(static_cast<int64_t>(in_.after.size()), kMaxPredecessors, "predecessors", "tasks.after");
  if (in_.lane.size() != n || in_.microbatch.size() != n || in_.resource.size() != n ||
      in_.phase.size() != n) {
    fail("tasks: lane, microbatch, duration, resource and phase differ in length");
  }
  check_offsets(in_.after_offset, static_cast<int64_t>(n), static_cast<int64_t>(in_.after.size()),
                "tasks.after_offset");
  lane_.resize(n);
  microbatch_.resize(n);
  resource_.resize(n);
  phase_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if ((i & 1023) == 0) poll_cancel(1024);  // a thread-local read per task would cost more than the checks
    const auto f = [&] { return "tasks[" + format_number(i) + "]"; };
    if (in_.lane[i] < 0 || in_.lane[i] >= in_.num_lanes) {
      fail(f() + ".lane: " + format_number(in_.lane[i]) + " is not in [0, " +
           format_number(in_.num_lanes) + ")");
    }
    if (in_.microbatch[i] < 0 || in_.microbatch[i] >= static_cast<int64_t>(m)) {
      fail(f() + ".microbatch: " + format_number(in_.microbatch[i]) + " is not in [0, " +
           format_number(m) + ")");
    }
    check_duration(in_.duration[i], [&] { return f() + ".duration"; });
    if (in_.resource[i] != kCompute && in_.resource[i] != kComm) {
      fail(f() + ".resource: " + format_number(in_.resource[i]) + " is not 0 (compute) or 1 (comm)");
    }
    if (in_.phase[i] != kFwd && in_.phase[i] != kBwd) {
      fail(f() + ".phase: " + format_number(in_.phase[i]) + " is not 0 (fwd) or 1 (bwd)");
    }
    lane_[i] = static_cast<int32_t>(in_.lane[i]);
    microbatch_[i] = static_cast<int32_t>(in_.microbatch[i]);
    resource_[i] = static_cast<uint8_t>(in_.resource[i]);
    phase_[i] = static_cast<uint8_t>(in_.phase[i]);
  }
  // Predecessors: checked in order, so every id below i is already known to be a valid task.
  pred_off_.assign(n + 1, 0);
  pred_.resize(in_.after.size());
  std::vector<int64_t> succ_count(n, 0);
  int64_t work = 0;  // polled every 1024 units or so, as above
  for (size_t i = 0; i < n; ++i) {
    const int64_t b = in_.after_offset[i], e = in_.after_offset[i + 1];
    if ((work += 1 + e - b) >= 1024) {
      poll_cancel(work);
      work = 0;
    }
    for (int64_t q = b; q < e; ++q) {
      const int64_t p = in_.after[static_cast<size_t>(q)];
      const auto f = [&] { return "tasks[" + format_number(i) + "].after[" + format_number(q - b) + "]"; };
      if (p < 0) fail(f() + ": " + format_number(p) + " is negative");
      if (p >= static_cast<int64_t>(i)) {
        fail(f() + ": " + format_number(p) + " is not < " + format_number(i));
      }
      if (phase_[static_cast<size_t>(p)] == kBwd && phase_[i] == kFwd) {
        fail(f() + ": " + format_number(p) + " is a backward task, a predecessor of forward task " +
             format_number(i));
      }
      if (microbatch_[static_cast<size_t>(p)] != microbatch_[i]) {
        fail(f() + ": " + format_number(p) + " belongs to microbatch " +
             format_number(microbatch_[static_cast<size_t>(p)]) + ", task " + format_number(i) +
             " to microbatch " + format_number(microbatch_[i]));
      }
      pred_[static_cast<size_t>(q)] = static_cast<int32_t>(p);
      if (phase_[static_cast<size_t>(p)] == phase_[i]) ++succ_count[static_cast<size_t>(p)];
    }
    pred_off_[i + 1] = e;
  }
  // Same-phase successors (CSR), increasing ids.
  succ_off_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) succ_off_[i + 1] = succ_off_[i] + succ_count[i];
  succ_.resize(static_cast<size_t>(succ_off_[n]));
  std::vector<int64_t> fill(succ_off_.begin(), succ_off_.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    for (int64_t q = pred_off_[i]; q < pred_off_[i + 1]; ++q) {
      const int32_t p = pred_[static_cast<size_t>(q)];
      if (phase_[static_cast<size_t>(p)] == phase_[i]) {
        succ_[static_cast<size_t>(fill[static_cast<size_t>(p)]++)] = static_cast<int32_t>(i);
      }
    }
  }
  // Tasks per (microbatch, phase), increasing ids: a counting sort on the key 2 j + phase.
  mb_off_.assign(2 * m + 1, 0);
  for (size_t i = 0; i < n; ++i) ++mb_off_[static_cast<size_t>(2 * microbatch_[i] + phase_[i] + 1)];
  for (size_t k = 0; k < 2 * m; ++k) mb_off_[k + 1] += mb_off_[k];
  mb_tasks_.resize(n);
  std::vector<int64_t> pos(mb_off_.begin(), mb_off_.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    mb_tasks_[static_cast<size_t>(pos[static_cast<size_t>(2 * microbatch_[i] + phase_[i])]++)] =
        static_cast<int32_t>(i);
  }
}

std::array<double, 4> longest_paths(const Problem& p) {
  const int32_t n = p.num_tasks();
  std::vector<double> full(static_cast<size_t>(n)), compute(static_cast<size_t>(n));
  std::array<double, 4> best{0.0, 0.0, 0.0, 0.0};
  for (int32_t t = 0; t < n; ++t) {
    if ((t & 1023) == 0) poll_cancel(1024);
    const uint8_t ph = p.phase(t);
    double f = 0.0, c = 0.0;
    for (const int32_t* q = p.pred_begin(t); q != p.pred_end(t); ++q) {  // ids below t: known already
      if (p.phase(*q) == ph) {
        f = std::max(f, full[static_cast<size_t>(*q)]);
        c = std::max(c, compute[static_cast<size_t>(*q)]);
      }
    }
    const double d = p.duration(t);
    full[static_cast<size_t>(t)] = f + d;
    compute[static_cast<size_t>(t)] = c + (p.resource(t) == kCompute ? d : 0.0);
    best[ph] = std::max(best[ph], full[static_cast<size_t>(t)]);
    best[2 + ph] = std::max(best[2 + ph], compute[static_cast<size_t>(t)]);
  }
  return best;
}

}  // namespace pybubble
