#include <gtest/gtest.h>

#include <stdexcept>

#include "pybubble/scheduler.h"
#include "pybubble/synthetic.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

// Justification on generated pipelines, of every policy's schedule: valid, never longer, neither
// end of the step grown, the assignment kept; and shorter on some (the greedy's gaps).
TEST(Justify, ValidNeverLongerAndShorterOnSome) {
  int shorter = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    SyntheticSpec spec;
    spec.stages = 1 + static_cast<int32_t>(seed % 3);
    spec.microbatches = 3 + static_cast<int32_t>(seed % 5);
    spec.twin_lanes = 1 + static_cast<int32_t>(seed % 2);
    spec.tp_gaps_per_op = static_cast<int32_t>(seed % 3);
    spec.encoder_scale = 1.0 + static_cast<double>(seed % 4);
    spec.seed = seed;
    const Problem p(synthetic_problem(spec));
    for (const Policy policy : {Policy::kCoarse, Policy::kGreedy, Policy::kHoles}) {
      Scheduler s(p);
      const Schedule before = s.run(policy);
      const Schedule after = Scheduler(p).justify(before);
      EXPECT_TRUE(validate(p, after).empty()) << "seed " << seed;
      EXPECT_LE(after.step_time, before.step_time) << "seed " << seed;
      EXPECT_LE(after.shift_front, before.shift_front) << "seed " << seed;
      EXPECT_LE(after.shift_back, before.shift_back) << "seed " << seed;
      EXPECT_EQ(after.assignment, before.assignment) << "seed " << seed;
      shorter += after.step_time < before.step_time;
    }
  }
  EXPECT_GT(shorter, 0);
}

// A schedule that is not valid, or not of the problem's sizes, is refused before anything moves.
TEST(Justify, RefusesSchedulesThatAreNotValid) {
  SyntheticSpec spec;
  spec.seed = 3;
  const Problem p(synthetic_problem(spec));
  Scheduler s(p);
  Schedule late = s.run(Policy::kGreedy);
  for (double& x : late.start) x += 1e9;  // past every deadline and the step's end
  EXPECT_THROW(Scheduler(p).justify(late), std::invalid_argument);
  Schedule short_ = s.run(Policy::kGreedy);
  short_.start.pop_back();
  EXPECT_THROW(Scheduler(p).justify(short_), std::invalid_argument);
}

}  // namespace
}  // namespace pybubble
