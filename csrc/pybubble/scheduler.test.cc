#include "pybubble/scheduler.h"

#include <gtest/gtest.h>

#include "pybubble/synthetic.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

// One lane, one compute window [10, 40], one microbatch needed at 50 with its gradient at 60.
ProblemInput chain(double d0, double d1) {
  ProblemInput in;
  in.horizon = 100.0;
  in.num_lanes = 1;
  in.compute_free = {{0, 2}, {10.0, 70.0}, {40.0, 90.0}};
  in.link_free = {{0, 0}, {}, {}};
  in.forward_needed = {50.0};
  in.grad_ready = {60.0};
  in.lane = {0, 0, 0};
  in.microbatch = {0, 0, 0};
  in.duration = {d0, d1, 10.0};
  in.resource = {kCompute, kCompute, kCompute};
  in.phase = {kFwd, kFwd, kBwd};
  in.after_offset = {0, 0, 1, 2};
  in.after = {0, 1};
  return in;
}

TEST(Scheduler, CoarsePacksForwardBeforeAndBackwardAfter) {
  Problem p(chain(5.0, 7.0));
  const Schedule s = schedule(p, Policy::kCoarse);
  EXPECT_DOUBLE_EQ(s.start[1], -7.0);
  EXPECT_DOUBLE_EQ(s.start[0], -12.0);
  EXPECT_DOUBLE_EQ(s.start[2], 100.0);
  EXPECT_DOUBLE_EQ(s.step_time, 122.0);
  EXPECT_TRUE(validate(p, s).empty());
}

TEST(Scheduler, GreedyHidesWhatFits) {
  Problem p(chain(5.0, 7.0));
  const Schedule s = schedule(p, Policy::kGreedy);
  EXPECT_DOUBLE_EQ(s.start[0], 10.0);  // as early as possible in the first window
  EXPECT_DOUBLE_EQ(s.start[1], 15.0);
  EXPECT_DOUBLE_EQ(s.start[2], 80.0);  // as late as possible in the last window
  EXPECT_DOUBLE_EQ(s.step_time, 100.0);
  EXPECT_TRUE(validate(p, s).empty());
}

TEST(Scheduler, GreedyMovesTheLongestFittingSuffix) {
  // 30 + 25 cannot both end by 40 inside [10, 40]; the second alone can.
  Problem p(chain(30.0, 25.0));
  const Schedule s = schedule(p, Policy::kGreedy);
  EXPECT_DOUBLE_EQ(s.start[1], 10.0);
  EXPECT_DOUBLE_EQ(s.start[0], -30.0);
  EXPECT_DOUBLE_EQ(s.shift_front, 30.0);
  EXPECT_TRUE(validate(p, s).empty());
}

TEST(Scheduler, ReusesItsMemoryForNewDurations) {
  SyntheticSpec spec;
  Problem p(synthetic_problem(spec));
  Scheduler sched(p);
  std::vector<double> d = p.fields().duration;
  for (double& x : d) x *= 3.0;
  const Schedule a = sched.run(Policy::kGreedy, &d);
  const Schedule b = sched.run(Policy::kGreedy);
  const Schedule c = schedule(p, Policy::kGreedy);
  EXPECT_EQ(b.start, c.start);
  EXPECT_GT(a.step_time, b.step_time);
  d[3] = -1.0;
  EXPECT_THROW(sched.run(Policy::kGreedy, &d), std::invalid_argument);
  d.pop_back();  // fewer durations than tasks: refused before any is read
  try {
    sched.run(Policy::kGreedy, &d);
    FAIL() << "short durations accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "durations: " + std::to_string(d.size()) + " values for " +
                                         std::to_string(p.num_tasks()) + " tasks");
  }
}

TEST(Scheduler, GreedyIsValidAndNeverWorseThanCoarseOnGeneratedPipelines) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SyntheticSpec spec;
    spec.stages = 1 + static_cast<int32_t>(seed % 4);
    spec.encoder_layers = 4;
    spec.microbatches = 1 + static_cast<int32_t>(seed % 7);
    spec.encoder_scale = 0.5 * static_cast<double>(seed % 9);
    spec.seed = seed;
    Problem p(synthetic_problem(spec));
    const Schedule g = schedule(p, Policy::kGreedy), c = schedule(p, Policy::kCoarse);
    EXPECT_TRUE(validate(p, g).empty()) << "seed " << seed;
    EXPECT_TRUE(validate(p, c).empty()) << "seed " << seed;
    EXPECT_LE(g.step_time, c.step_time) << "seed " << seed;
  }
}

TEST(Scheduler, FixedAssignmentFeedsEachMicrobatchItsOwnAndStaysValid) {
  // Encoder microbatches of very different lengths (data that varies per microbatch): the free
  // assignment may reorder them, the fixed one keeps j -> j and is valid all the same.
  int reordered = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SyntheticSpec spec;
    spec.stages = 1 + static_cast<int32_t>(seed % 4);
    spec.encoder_layers = 4;
    spec.microbatches = 2 + static_cast<int32_t>(seed % 6);
    spec.encoder_scale = 0.3 * static_cast<double>(1 + seed % 5);
    spec.seed = seed;
    Problem p(synthetic_problem(spec));
    std::vector<double> d = p.fields().duration;
    for (int32_t t = 0; t < p.num_tasks(); ++t) {
      d[static_cast<size_t>(t)] *= 1.0 + 3.0 * static_cast<double>((p.fields().microbatch[static_cast<size_t>(t)] * 7 + 3) % 5);
    }
    Scheduler sched(p);
    const Schedule free = sched.run(Policy::kGreedy, &d);
    for (size_t j = 0; j < free.assignment.size(); ++j) reordered += free.assignment[j] != static_cast<int64_t>(j);
    for (const Policy policy : {Policy::kGreedy, Policy::kCoarse}) {
      const Schedule s = sched.run(policy, &d, true);
      for (size_t j = 0; j < s.assignment.size(); ++j) EXPECT_EQ(s.assignment[j], static_cast<int64_t>(j));
      ProblemInput in = p.input();
      in.duration = d;
      Problem scaled(std::move(in));
      EXPECT_TRUE(validate(scaled, s).empty()) << "seed " << seed;
    }
  }
  EXPECT_GT(reordered, 0);  // the case the option is for occurs here
}

TEST(Scheduler, RejectsUnknownPolicies) { EXPECT_THROW(parse_policy("fastest"), std::invalid_argument); }

}  // namespace
}  // namespace pybubble
