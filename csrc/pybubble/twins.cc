#include "pybubble/twins.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "pybubble/cancel.h"
#include "pybubble/checks.h"
#include "pybubble/message.h"

namespace pybubble {
namespace {

// Whether lanes a and b have exactly the same free windows of resource r.
bool same_windows(const WindowSet& ws, int32_t a, int32_t b) {
  const int64_t a0 = ws.offset[static_cast<size_t>(a)], a1 = ws.offset[static_cast<size_t>(a) + 1];
  const int64_t b0 = ws.offset[static_cast<size_t>(b)], b1 = ws.offset[static_cast<size_t>(b) + 1];
  return a1 - a0 == b1 - b0 && std::equal(ws.start.begin() + a0, ws.start.begin() + a1, ws.start.begin() + b0) &&
         std::equal(ws.end.begin() + a0, ws.end.begin() + a1, ws.end.begin() + b0);
}

// Whether task t is a copy of task r (same microbatch, phase, resource, duration; predecessors
// r's shifted by `shift`, each of r's a multiple of `copies`).
bool same_task(const Problem& p, int32_t r, int32_t t, int32_t copies) {
  const ProblemInput& f = p.fields();
  if (p.microbatch(t) != p.microbatch(r) || p.phase(t) != p.phase(r) || p.resource(t) != p.resource(r) ||
      !(f.duration[static_cast<size_t>(t)] == f.duration[static_cast<size_t>(r)])) {
    return false;
  }
  const int64_t rb = f.after_offset[static_cast<size_t>(r)], re = f.after_offset[static_cast<size_t>(r) + 1];
  const int64_t tb = f.after_offset[static_cast<size_t>(t)], te = f.after_offset[static_cast<size_t>(t) + 1];
  if (te - tb != re - rb) return false;
  for (int64_t q = 0; q < re - rb; ++q) {
    const int64_t pr = f.after[static_cast<size_t>(rb + q)];
    if (pr % copies != 0 || f.after[static_cast<size_t>(tb + q)] != pr + (t - r)) return false;
  }
  return true;
}

}  // namespace

bool has_copies(const Problem& p, int32_t copies) {
  if (copies < 1) throw std::invalid_argument("copies: " + format_number(copies) + " is not >= 1");
  const int32_t n = p.num_tasks();
  if (copies == 1) return true;
  if (n % copies != 0) return false;
  const size_t lanes = static_cast<size_t>(p.num_lanes());
  std::vector<uint8_t> used(lanes, 0);       // lane already in a list of twins
  std::vector<int64_t> list(lanes, -1);      // where a group-first lane's twins begin in `twins`
  std::vector<int32_t> twins;
  for (int32_t r = 0; r < n; r += copies) {
    poll_cancel(copies);
    const int32_t lead = p.lane(r);
    const int64_t at = list[static_cast<size_t>(lead)];
    for (int32_t i = 0; i < copies; ++i) {
      const int32_t t = r + i, lane = p.lane(t);
      // i == 0: r's own predecessors must be groups' firsts.
      if (!same_task(p, r, t, copies)) return false;
      if (at >= 0) {
        if (twins[static_cast<size_t>(at + i)] != lane) return false;
        continue;
      }
      if (used[static_cast<size_t>(lane)]) return false;
      if (i > 0 && !(same_windows(p.windows(kCompute), lead, lane) && same_windows(p.windows(kComm), lead, lane))) {
        return false;
      }
      used[static_cast<size_t>(lane)] = 1;
    }
    if (at < 0) {
      list[static_cast<size_t>(lead)] = static_cast<int64_t>(twins.size());
      for (int32_t i = 0; i < copies; ++i) twins.push_back(p.lane(r + i));
    }
  }
  return true;
}

int32_t twin_copies(const Problem& p) {
  const int32_t n = p.num_tasks();
  if (n == 0) return 1;
  // A group is at most as long as the run of copies of task 0 on different lanes that opens the
  // tasks; every divisor of the task count up to it is a candidate, the largest first.
  std::vector<uint8_t> seen(static_cast<size_t>(p.num_lanes()), 0);
  int32_t run = 0;
  while (run < n && !seen[static_cast<size_t>(p.lane(run))] && same_task(p, 0, run, 1)) {
    seen[static_cast<size_t>(p.lane(run))] = 1;
    ++run;
  }
  for (int32_t copies = run; copies >= 2; --copies) {
    if (n % copies == 0 && has_copies(p, copies)) return copies;
  }
  return 1;
}

ProblemInput fold_copies(const Problem& p, int32_t copies) {
  if (!has_copies(p, copies)) {
    throw std::invalid_argument("copies: the problem is not " + format_number(copies) + " copies of one problem");
  }
  const ProblemInput& f = p.fields();
  if (copies == 1) return p.input();
  const int32_t n = p.num_tasks(), groups = n / copies;
  std::vector<int32_t> leads;
  for (int32_t r = 0; r < n; r += copies) leads.push_back(p.lane(r));
  std::sort(leads.begin(), leads.end());
  leads.erase(std::unique(leads.begin(), leads.end()), leads.end());
  std::vector<int64_t> index(static_cast<size_t>(p.num_lanes()), -1);
  for (size_t k = 0; k < leads.size(); ++k) index[static_cast<size_t>(leads[k])] = static_cast<int64_t>(k);

  ProblemInput out;
  out.horizon = f.horizon;
  out.num_lanes = static_cast<int64_t>(leads.size());
  for (int r = 0; r < 2; ++r) {
    const WindowSet& ws = p.windows(r);
    WindowSet& to = r == kCompute ? out.compute_free : out.link_free;
    to.offset.push_back(0);
    for (const int32_t lane : leads) {
      const int64_t b = ws.offset[static_cast<size_t>(lane)], e = ws.offset[static_cast<size_t>(lane) + 1];
      to.start.insert(to.start.end(), ws.start.begin() + b, ws.start.begin() + e);
      to.end.insert(to.end.end(), ws.end.begin() + b, ws.end.begin() + e);
      to.offset.push_back(static_cast<int64_t>(to.start.size()));
    }
  }
  out.forward_needed = f.forward_needed;
  out.grad_ready = f.grad_ready;
  out.after_offset.reserve(static_cast<size_t>(groups) + 1);
  out.after_offset.push_back(0);
  for (int32_t g = 0; g < groups; ++g) {
    const size_t r = static_cast<size_t>(g) * static_cast<size_t>(copies);
    out.lane.push_back(index[static_cast<size_t>(f.lane[r])]);
    out.microbatch.push_back(f.microbatch[r]);
    out.duration.push_back(f.duration[r]);
    out.resource.push_back(f.resource[r]);
    out.phase.push_back(f.phase[r]);
    for (int64_t q = f.after_offset[r]; q < f.after_offset[r + 1]; ++q) out.after.push_back(f.after[static_cast<size_t>(q)] / copies);
    out.after_offset.push_back(static_cast<int64_t>(out.after.size()));
  }
  return out;
}

ProblemInput with_copies(const ProblemInput& in, int32_t copies) {
  if (copies < 1) throw std::invalid_argument("copies: " + format_number(copies) + " is not >= 1");
  const int64_t c = copies;
  check_count(in.num_lanes * c, kMaxLanes, "lanes", "lanes x copies");
  check_count(static_cast<int64_t>(in.duration.size()) * c, kMaxTasks, "tasks", "tasks x copies");
  check_count(static_cast<int64_t>(in.after.size()) * c, kMaxPredecessors, "predecessors", "tasks.after x copies");
  check_count(static_cast<int64_t>(std::max(in.compute_free.start.size(), in.link_free.start.size())) * c, kMaxWindows,
              "windows", "windows x copies");
  ProblemInput out;
  out.horizon = in.horizon;
  out.num_lanes = in.num_lanes * c;
  out.forward_needed = in.forward_needed;
  out.grad_ready = in.grad_ready;
  for (int r = 0; r < 2; ++r) {
    const WindowSet& ws = r == kCompute ? in.compute_free : in.link_free;
    WindowSet& to = r == kCompute ? out.compute_free : out.link_free;
    to.offset.push_back(0);
    for (size_t l = 0; l + 1 < ws.offset.size(); ++l) {
      for (int32_t i = 0; i < copies; ++i) {
        to.start.insert(to.start.end(), ws.start.begin() + ws.offset[l], ws.start.begin() + ws.offset[l + 1]);
        to.end.insert(to.end.end(), ws.end.begin() + ws.offset[l], ws.end.begin() + ws.offset[l + 1]);
        to.offset.push_back(static_cast<int64_t>(to.start.size()));
      }
    }
  }
  out.after_offset.push_back(0);
  for (size_t t = 0; t < in.duration.size(); ++t) {
    for (int32_t i = 0; i < copies; ++i) {
      out.lane.push_back(in.lane[t] * c + i);
      out.microbatch.push_back(in.microbatch[t]);
      out.duration.push_back(in.duration[t]);
      out.resource.push_back(in.resource[t]);
      out.phase.push_back(in.phase[t]);
      for (int64_t q = in.after_offset[t]; q < in.after_offset[t + 1]; ++q) {
        out.after.push_back(in.after[static_cast<size_t>(q)] * c + i);
      }
      out.after_offset.push_back(static_cast<int64_t>(out.after.size()));
    }
  }
  return out;
}

}  // namespace pybubble
