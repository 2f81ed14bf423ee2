#include "pybubble/validate.h"

#include <gtest/gtest.h>

#include "pybubble/synthetic.h"

namespace pybubble {
namespace {

bool mentions(const std::vector<std::string>& v, const std::string& what) {
  for (const auto& s : v) {
    if (s.find(what) != std::string::npos) return true;
  }
  return false;
}

class ValidateTest : public ::testing::Test {
 protected:
  ValidateTest() : p_(make()), s_(schedule(p_, Policy::kGreedy)) {}
  static ProblemInput make() {
    SyntheticSpec spec;
    spec.stages = 2;
    spec.microbatches = 3;
    spec.encoder_layers = 2;
    spec.kernels_per_layer = 4;
    return synthetic_problem(spec);
  }
  Problem p_;
  Schedule s_;
};

TEST_F(ValidateTest, AcceptsTheSchedulersOutput) { EXPECT_TRUE(validate(p_, s_).empty()); }

TEST_F(ValidateTest, CatchesADependencyBroken) {
  s_.start[1] = s_.start[0] - 1000.0;
  EXPECT_TRUE(mentions(validate(p_, s_), "before its predecessor 0"));
}

TEST_F(ValidateTest, CatchesATaskWhereTheLlmComputes) {
  // Just after lane's first compute window the LLM runs: no compute task may sit there.
  const int32_t lane = p_.lane(0);
  const auto& w = p_.windows(kCompute);
  s_.start[0] = w.end[static_cast<size_t>(w.offset[static_cast<size_t>(lane)])] + 0.5;
  EXPECT_TRUE(mentions(validate(p_, s_), "lies outside every free compute interval"));
}

TEST_F(ValidateTest, CatchesWrongStepTimeAndAssignment) {
  s_.step_time += 1.0;
  s_.assignment[0] = s_.assignment[1];
  const auto v = validate(p_, s_);
  EXPECT_TRUE(mentions(v, "step_time"));
  EXPECT_TRUE(mentions(v, "is already fed by"));
}

TEST_F(ValidateTest, CatchesNonFiniteStarts) {
  s_.start[2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(mentions(validate(p_, s_), "is not finite"));
}

TEST_F(ValidateTest, AFarStartDoesNotWidenTheTolerance) {
  // Every task of a lane stacked at one start, and one task far after the horizon: overlaps that
  // a tolerance taken from the schedule's largest time (1e288 us) hid.
  const int32_t lane = p_.lane(0);
  int32_t far = -1;
  for (int32_t t = 0; t < p_.num_tasks(); ++t) {
    if (p_.lane(t) == lane && p_.resource(t) == kCompute) {
      s_.start[static_cast<size_t>(t)] = -1000.0;
      far = t;
    }
  }
  s_.start[static_cast<size_t>(far)] = 1e300;
  EXPECT_TRUE(mentions(validate(p_, s_), "overlap on lane"));
}

TEST_F(ValidateTest, ATaskWhoseDurationVanishesInItsEndOccupiesNoTime) {
  // Issue 23: 2.5e-195 us at 74 us ends where it starts. The scheduler counts such a task as
  // occupying nothing, so may put it where another task starts; no overlap. With a duration that
  // counts, the same placement overlaps.
  ProblemInput in = make();
  int32_t first = -1, other = -1;
  for (int32_t t = 0; t < p_.num_tasks() && other < 0; ++t) {
    if (p_.lane(t) == p_.lane(0) && p_.resource(t) == kCompute) (first < 0 ? first : other) = t;
  }
  ASSERT_GE(other, 0);
  s_.start[static_cast<size_t>(first)] = s_.start[static_cast<size_t>(other)] = -1e9;  // before everything
  in.duration[static_cast<size_t>(other)] = 1e-300;  // -1e9 + 1e-300 == -1e9
  EXPECT_FALSE(mentions(validate(Problem(in), s_), "overlap on lane"));
  in.duration[static_cast<size_t>(other)] = 1.0;
  EXPECT_TRUE(mentions(validate(Problem(in), s_), "overlap on lane"));
}

TEST_F(ValidateTest, RejectsSchedulesOfTheWrongShape) {
  s_.start.pop_back();
  EXPECT_THROW(validate(p_, s_), std::invalid_argument);
}

}  // namespace
}  // namespace pybubble
