// Random input for every entry point of the core: arrays of any length, values and offsets. Each
// call either throws std::invalid_argument or returns a valid result; run under ASan and UBSan
// (ctest in CI), anything else (a crash, an out-of-bounds read, undefined behaviour, another
// exception) fails. A few seconds in all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "pybubble/balance.h"
#include "pybubble/pipeline.h"
#include "pybubble/problem.h"
#include "pybubble/scheduler.h"
#include "pybubble/synthetic.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

// Values that break careless checks, mixed with ordinary ones.
struct Random {
  std::mt19937_64 rng;
  bool hostile = true;  // odd values and broken offsets now and then; off: in range, sorted
  explicit Random(uint64_t seed) : rng(seed) {}

  int64_t below(int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); }
  bool one_in(int64_t n) { return below(n) == 0; }
  // Rarely when hostile, never otherwise.
  bool odd(int64_t n) { return hostile && one_in(n); }
  int64_t integer(int64_t lo, int64_t hi) {
    static const int64_t odd[] = {-1, 0, 1, std::numeric_limits<int32_t>::max(), std::numeric_limits<int64_t>::max(),
                                  std::numeric_limits<int64_t>::min(), 1000000, 2};
    if (this->odd(8)) return odd[below(8)];
    if (hi < lo) return lo;
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;  // 0: all of int64
    return static_cast<int64_t>(static_cast<uint64_t>(lo) + (span == 0 ? rng() : rng() % span));
  }
  double number(double lo, double hi) {
    static const double odd[] = {-1.0, 0.0, -0.0, 1e300, -1e300, 1e308, 5e-324, std::numeric_limits<double>::quiet_NaN(),
                                 std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                 1e12, 1e12 + 1};
    if (this->odd(10)) return odd[below(12)];
    return lo + (hi - lo) * std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  }
  std::vector<int64_t> integers(int64_t size, int64_t lo, int64_t hi) {
    std::vector<int64_t> v(static_cast<size_t>(size));
    for (auto& x : v) x = integer(lo, hi);
    return v;
  }
  std::vector<double> numbers(int64_t size, double lo, double hi) {
    std::vector<double> v(static_cast<size_t>(size));
    for (auto& x : v) x = number(lo, hi);
    return v;
  }
  // Offsets of `rows` rows over about `count` entries: sorted most of the time, rising then
  // falling or off by one sometimes.
  std::vector<int64_t> offsets(int64_t rows, int64_t count) {
    std::vector<int64_t> v = integers(rows + 1 + (odd(10) ? below(3) - 1 : 0), 0, count);
    if (!odd(4)) std::sort(v.begin(), v.end());
    if (!v.empty() && !odd(6)) v.front() = 0;
    if (!v.empty() && !odd(6)) v.back() = count;
    return v;
  }
  // A length near `n` (sometimes far from it).
  int64_t near(int64_t n) { return odd(8) ? below(2 * n + 3) : n; }
};

// Windows of `lanes` lanes, sorted within each lane most of the time.
WindowSet windows(Random& r, int64_t lanes, double horizon) {
  WindowSet w;
  const int64_t count = r.below(3 * lanes + 2);
  w.offset = r.offsets(lanes, count);
  std::vector<double> cuts = r.numbers(2 * count, 0.0, horizon);
  if (!r.odd(5)) std::sort(cuts.begin(), cuts.end(), [](double a, double b) { return a < b; });
  for (int64_t i = 0; i < count; ++i) {
    w.start.push_back(cuts[static_cast<size_t>(2 * i)]);
    w.end.push_back(cuts[static_cast<size_t>(2 * i + 1)]);
  }
  // Each lane's windows from 0 again: sorted per lane, not over all.
  if (!r.odd(4) && std::is_sorted(w.offset.begin(), w.offset.end())) {
    for (int64_t l = 0; l + 1 < static_cast<int64_t>(w.offset.size()); ++l) {
      const int64_t b = std::clamp<int64_t>(w.offset[l], 0, count), e = std::clamp<int64_t>(w.offset[l + 1], 0, count);
      std::vector<double> c;
      for (int64_t i = b; i < e; ++i) c.insert(c.end(), {w.start[i], w.end[i]});
      std::sort(c.begin(), c.end(), [](double a, double b) { return a < b; });
      for (int64_t i = b; i < e; ++i) {
        w.start[i] = c[static_cast<size_t>(2 * (i - b))];
        w.end[i] = c[static_cast<size_t>(2 * (i - b) + 1)];
      }
    }
  }
  if (r.odd(12)) w.end.push_back(1.0);
  return w;
}

ProblemInput random_problem(Random& r) {
  ProblemInput in;
  in.horizon = r.number(0.0, 100.0);
  in.num_lanes = r.integer(0, 3);
  const int64_t lanes = std::clamp<int64_t>(in.num_lanes, 0, 3);
  in.compute_free = windows(r, lanes, in.horizon);
  in.link_free = windows(r, lanes, in.horizon);
  const int64_t m = r.below(4);
  in.forward_needed = r.numbers(m, 0.0, in.horizon / 2);
  in.grad_ready = r.numbers(r.near(m), in.horizon / 2, in.horizon);
  const int64_t n = r.below(12);
  in.lane = r.integers(r.near(n), 0, lanes - 1);
  in.microbatch = r.integers(r.near(n), 0, m - 1);
  in.duration = r.numbers(n, 0.0, 15.0);
  in.resource = r.integers(r.near(n), 0, 1);
  in.phase = r.integers(r.near(n), 0, 1);
  // Chains within a microbatch most of the time, anything sometimes.
  in.after_offset.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0 && !r.one_in(3)) in.after.push_back(r.odd(6) ? r.integer(-2, n + 2) : r.below(i));
    in.after_offset.push_back(static_cast<int64_t>(in.after.size()));
  }
  if (r.odd(8)) in.after_offset = r.offsets(n, static_cast<int64_t>(in.after.size()));
  return in;
}

// Runs `call`: true when it returns, false when it refuses its input with invalid_argument (any
// other exception escapes and fails the test).
template <typename Call>
bool accepts(Call&& call) {
  try {
    call();
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

// Runs `rounds` rounds of `one(r, round)` (true: its input was accepted), every other one hostile;
// returns how many were accepted.
template <typename One>
int fuzz(uint64_t seed, int rounds, One&& one) {
  Random r(seed);
  int accepted = 0;
  for (int round = 0; round < rounds; ++round) {
    r.hostile = round % 2 == 0;
    accepted += one(r, round);
  }
  return accepted;
}

// The schedule a scheduler run must produce: valid against the problem it ran with.
void expect_valid(const ProblemInput& in, const Schedule& s, int round) {
  const Problem checked(in);
  const auto v = validate(checked, s);
  EXPECT_TRUE(v.empty()) << "round " << round << ": " << v.front();
  EXPECT_TRUE(std::isfinite(s.step_time)) << "round " << round;
}

TEST(Fuzz, ProblemSchedulerAndValidator) {
  EXPECT_GT(fuzz(11, 15000, [](Random& r, int round) {
    const ProblemInput in = random_problem(r);
    const bool ok = accepts([&] {
      const Problem p(in);
      Scheduler sched(p);
      for (Policy pol : {Policy::kGreedy, Policy::kCoarse, Policy::kHoles}) {
        const Schedule s = sched.run(pol);
        expect_valid(p.input(), s, round);
        Scheduler justifier(p);
        const Schedule& j = justifier.justify(s);  // justified: valid, never longer
        expect_valid(p.input(), j, round);
        EXPECT_LE(j.step_time, s.step_time) << "round " << round;
      }
      std::vector<double> start;
      first_fit_floor(p, start);
      EXPECT_EQ(start.size(), static_cast<size_t>(p.num_tasks()));
      // New durations of any length and value.
      const std::vector<double> d = r.numbers(r.near(p.num_tasks()), 0.0, 20.0);
      accepts([&] {
        for (Policy pol : {Policy::kGreedy, Policy::kHoles}) {
          const Schedule& s = sched.run(pol, &d);
          ProblemInput with = p.input();
          with.duration = d;
          expect_valid(with, s, round);
        }
      });
      // Its longest paths; copies of it joined (refused unless its tasks are all of microbatch 0).
      const auto paths = longest_paths(p);
      EXPECT_TRUE(std::all_of(paths.begin(), paths.end(), [](double x) { return x >= 0.0; })) << "round " << round;
      const std::vector<int64_t> counts = r.integers(r.near(1), -1, p.num_microbatches() + 1);
      accepts([&] {
        const Problem joined(p, std::vector<const Problem*>(counts.size(), &p), counts);
        Scheduler js(joined);
        expect_valid(joined.input(), js.run(Policy::kGreedy), round);
      });
      // Any schedule: violations or a refusal of its shape, nothing else.
      Schedule any;
      any.start = r.numbers(r.near(p.num_tasks()), -50.0, 150.0);
      any.assignment = r.integers(r.near(p.num_microbatches()), -1, p.num_microbatches());
      any.step_time = r.number(0.0, 200.0);
      any.shift_front = r.number(0.0, 50.0);
      any.shift_back = r.number(0.0, 50.0);
      accepts([&] { validate(p, any); });
      accepts([&] { expect_valid(p.input(), Scheduler(p).justify(any), round); });  // refused unless valid
    });
    return ok;
  }), 1000);
}

// A table of `ranks` rows: 1F1B most of the time (then mutated), random actions sometimes.
PipelineSpec random_spec(Random& r) {
  PipelineSpec sp;
  sp.ranks = static_cast<int32_t>(r.integer(1, 4));
  sp.chunks = r.one_in(6) ? static_cast<int32_t>(r.integer(0, 3)) : 1;
  sp.microbatches = static_cast<int32_t>(r.integer(1, 4));
  const int32_t p = std::clamp(sp.ranks, 1, 4), v = std::clamp(sp.chunks, 1, 3), m = std::clamp(sp.microbatches, 1, 4);
  if (sp.chunks == 1 && sp.ranks == p && sp.microbatches == m && !r.one_in(4)) {
    fill_one_f_one_b(sp);
    for (int e = static_cast<int>(r.below(3)); e > 0 && !sp.stage.empty(); --e) {
      const size_t i = static_cast<size_t>(r.below(static_cast<int64_t>(sp.stage.size())));
      switch (r.below(5)) {
        case 0: sp.stage[i] = static_cast<int32_t>(r.integer(-1, p)); break;
        case 1: sp.kind[i] = static_cast<uint8_t>(r.integer(0, 4)); break;
        case 2: sp.microbatch[i] = static_cast<int32_t>(r.integer(-1, m)); break;
        case 3: std::swap(sp.stage[i], sp.stage[static_cast<size_t>(r.below(static_cast<int64_t>(sp.stage.size())))]); break;
        default: sp.row_offset = r.offsets(p, static_cast<int64_t>(sp.stage.size()));
      }
    }
  } else {
    const int64_t n = r.below(4 * p * v * m + 3);
    for (int64_t i = 0; i < n; ++i) {
      sp.stage.push_back(static_cast<int32_t>(r.integer(0, p * v - 1)));
      sp.kind.push_back(static_cast<uint8_t>(r.integer(0, 3)));
      sp.microbatch.push_back(static_cast<int32_t>(r.integer(0, m - 1)));
    }
    sp.row_offset = r.offsets(p, n);
  }
  const int64_t pairs = r.near(int64_t{p} * v);
  sp.fwd = r.numbers(pairs, 0.5, 4.0);
  sp.bwd = r.numbers(r.near(pairs), 4.0, 8.0);
  sp.wgrad = r.numbers(r.near(pairs), 0.0, 3.0);
  sp.p2p = r.number(0.0, 1.0);
  sp.tp_count = static_cast<int32_t>(r.integer(0, 3));
  sp.tp_duration = r.number(0.0, 0.1);
  sp.dp_allgather = r.number(0.0, 2.0);
  sp.dp_reducescatter = r.number(0.0, 2.0);
  return sp;
}

// Windows of each rank: sorted, disjoint, non-empty, inside [0, step_time].
void expect_windows(const WindowSet& w, int32_t ranks, double step_time, int round) {
  ASSERT_EQ(w.offset.size(), static_cast<size_t>(ranks) + 1) << "round " << round;
  for (int32_t r = 0; r < ranks; ++r) {
    for (int64_t i = w.offset[r]; i < w.offset[r + 1]; ++i) {
      EXPECT_LT(w.start[i], w.end[i]) << "round " << round;
      EXPECT_GE(w.start[i], 0.0) << "round " << round;
      EXPECT_LE(w.end[i], step_time) << "round " << round;
      if (i > w.offset[r]) EXPECT_LT(w.end[i - 1], w.start[i]) << "round " << round;
    }
  }
}

TEST(Fuzz, SimulatorAndItsFreeWindows) {
  EXPECT_GT(fuzz(12, 15000, [](Random& r, int round) {
    const PipelineSpec sp = random_spec(r);
    const bool ok = accepts([&] {
      const PipelineTimeline tl = simulate_pipeline(sp);
      EXPECT_TRUE(std::isfinite(tl.step_time)) << "round " << round;
      for (size_t i = 0; i < tl.op_start.size(); ++i) EXPECT_LE(tl.op_start[i], tl.op_end[i]) << "round " << round;
      for (size_t i = 0; i < tl.bubble_start.size(); ++i) EXPECT_LT(tl.bubble_start[i], tl.bubble_end[i]);
      expect_windows(tl.compute_free, sp.ranks, tl.step_time, round);
      expect_windows(tl.link_free, sp.ranks, tl.step_time, round);
      EXPECT_EQ(tl.forward_needed.size(), static_cast<size_t>(sp.microbatches));
      for (size_t k = 0; k < tl.grad_ready.size(); ++k) EXPECT_LE(tl.forward_needed[k], tl.grad_ready[k]);
    });
    return ok;
  }), 1000);
}

TEST(Fuzz, Balance) {
  EXPECT_GT(fuzz(13, 6000, [](Random& r, int round) {
    const int64_t n = r.below(12), m = r.integer(-1, 13);
    const std::vector<double> costs = r.numbers(2 * n, 0.0, 10.0);
    const bool ok = accepts([&] {
      const std::vector<int64_t> a = balance_microbatches(costs.data(), n, m);
      ASSERT_EQ(a.size(), static_cast<size_t>(n));
      std::vector<int64_t> count(static_cast<size_t>(m), 0);
      for (int64_t k : a) {
        ASSERT_GE(k, 0);
        ASSERT_LT(k, m);
        ++count[static_cast<size_t>(k)];
      }
      for (int64_t c : count) EXPECT_GE(c, 1) << "round " << round;
      EXPECT_GE(max_microbatch_cost(costs.data(), n, a.data(), m), balance_lower_bound(costs.data(), n, m) * (1 - 1e-12));
    });
    const std::vector<int64_t> any = r.integers(n, -1, m);
    accepts([&] { max_microbatch_cost(costs.data(), n, any.data(), m); });
    return ok;
  }), 100);
}

TEST(Fuzz, GeneratedProblems) {
  EXPECT_GT(fuzz(14, 500, [](Random& r, int round) {
    SyntheticSpec s;
    s.stages = static_cast<int32_t>(r.integer(1, 3));
    s.lanes_per_stage = static_cast<int32_t>(r.integer(1, 2));
    s.microbatches = static_cast<int32_t>(r.integer(1, 3));
    s.encoder_layers = static_cast<int32_t>(r.integer(1, 4));
    s.kernels_per_layer = static_cast<int32_t>(r.integer(1, 4));
    s.llm_fwd = r.number(100.0, 500.0);
    s.llm_bwd = r.number(100.0, 900.0);
    s.tp_gaps_per_op = static_cast<int32_t>(r.integer(0, 3));
    s.tp_gap = r.number(0.0, 30.0);
    s.encoder_scale = r.number(0.0, 2.0);
    s.jitter = r.number(0.0, 0.9);
    s.seed = static_cast<uint64_t>(r.integer(0, 1000));
    const bool ok = accepts([&] {
      const Problem p(synthetic_problem(s));
      expect_valid(p.input(), schedule(p, Policy::kGreedy), round);
    });
    return ok;
  }), 50);
}

}  // namespace
}  // namespace pybubble
