#include <gtest/gtest.h>

#include <stdexcept>

#include "pybubble/scheduler.h"
#include "pybubble/synthetic.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

// The holes policy on generated pipelines: valid, and shorter than the greedy more often than longer
// (it is a heuristic too: not shorter on every problem).
TEST(Holes, ValidAndShorterThanGreedyMoreOftenThanLonger) {
  int shorter = 0, longer = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    SyntheticSpec spec;
    spec.stages = 2 + static_cast<int32_t>(seed % 3);
    spec.microbatches = 4 + static_cast<int32_t>(seed % 5);
    spec.encoder_scale = 1.0 + static_cast<double>(seed % 4);
    spec.seed = seed;
    const Problem p(synthetic_problem(spec));
    Scheduler s(p);
    const Schedule holes = s.run(Policy::kHoles);
    EXPECT_TRUE(validate(p, holes).empty()) << "seed " << seed;
    const double greedy = s.run(Policy::kGreedy).step_time;
    shorter += holes.step_time < greedy;
    longer += holes.step_time > greedy;
  }
  EXPECT_GT(shorter, longer);
}

// The orders run() is given: each alone gives a valid schedule no shorter than all of them, the
// order it reports gives all of them's schedule alone, and a mask that names no order is refused.
TEST(Holes, OrdersAreTriedAsGivenAndTheWinnerIsReported) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    SyntheticSpec spec;  // one or two chains per microbatch, with and without TP gaps
    spec.twin_lanes = 1 + static_cast<int32_t>(seed % 2);
    spec.tp_gaps_per_op = static_cast<int32_t>(seed % 3);
    spec.seed = seed;
    const Problem p(synthetic_problem(spec));
    Scheduler s(p);
    const Schedule all = s.run(Policy::kHoles);
    const int winner = s.holes_order();
    ASSERT_GE(winner, 0) << "seed " << seed;
    ASSERT_LT(winner, Scheduler::kHolesOrders) << "seed " << seed;
    for (int i = 0; i < Scheduler::kHolesOrders; ++i) {
      const Schedule one = s.run(Policy::kHoles, nullptr, false, 1u << i);
      EXPECT_TRUE(validate(p, one).empty()) << "seed " << seed << " order " << i;
      EXPECT_GE(one.step_time, all.step_time) << "seed " << seed << " order " << i;
    }
    const Schedule alone = s.run(Policy::kHoles, nullptr, false, 1u << winner);
    EXPECT_EQ(alone.start, all.start) << "seed " << seed;
    EXPECT_EQ(s.holes_order(), winner);
    s.run(Policy::kGreedy);
    EXPECT_EQ(s.holes_order(), -1);
    EXPECT_THROW(s.run(Policy::kHoles, nullptr, false, 0u), std::invalid_argument);
    EXPECT_THROW(s.run(Policy::kHoles, nullptr, false, Scheduler::kAllOrders + 1), std::invalid_argument);
  }
}

// Twin lanes split every microbatch into independent chains, one per twin: the order by pieces
// runs (fill_holes), and the schedule stays valid and the same on a rerun.
TEST(Holes, MicrobatchesOfSeveralPiecesGiveValidSchedules) {
  for (uint64_t seed = 0; seed < 12; ++seed) {
    SyntheticSpec spec;
    spec.stages = 1 + static_cast<int32_t>(seed % 3);
    spec.twin_lanes = 2 + static_cast<int32_t>(seed % 2);
    spec.microbatches = 3 + static_cast<int32_t>(seed % 4);
    spec.encoder_scale = 1.0 + static_cast<double>(seed % 5);
    spec.jitter = 0.4;
    spec.seed = seed;
    const Problem p(synthetic_problem(spec));
    Scheduler s(p);
    const Schedule first = s.run(Policy::kHoles);
    EXPECT_TRUE(validate(p, first).empty()) << "seed " << seed;
    EXPECT_EQ(first.start, s.run(Policy::kHoles).start) << "seed " << seed;
  }
}

TEST(Holes, RerunsGiveTheSameScheduleAndNewDurationsAreHonoured) {
  SyntheticSpec spec;
  spec.microbatches = 6;
  const Problem p(synthetic_problem(spec));
  Scheduler s(p);
  const Schedule first = s.run(Policy::kHoles);
  const Schedule again = s.run(Policy::kHoles);
  EXPECT_EQ(first.start, again.start);
  EXPECT_EQ(first.step_time, again.step_time);
  const ProblemInput given = p.input();
  std::vector<double> d(given.duration.begin(), given.duration.end());
  for (double& x : d) x *= 1.5;
  const Schedule& longer = s.run(Policy::kHoles, &d);
  ProblemInput in = p.input();
  in.duration = d;
  EXPECT_TRUE(validate(Problem(std::move(in)), longer).empty());
  EXPECT_EQ(Scheduler(p).run(Policy::kHoles).start, first.start);
}

}  // namespace
}  // namespace pybubble
