#include "pybubble/twins.h"

#include <gtest/gtest.h>

#include "pybubble/scheduler.h"
#include "pybubble/synthetic.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

SyntheticSpec spec_for(uint64_t seed) {
  SyntheticSpec spec;
  spec.stages = 1 + static_cast<int32_t>(seed % 4);
  spec.lanes_per_stage = 1 + static_cast<int32_t>(seed % 2);
  spec.encoder_layers = 4;
  spec.microbatches = 1 + static_cast<int32_t>(seed % 6);
  spec.encoder_scale = 0.4 * static_cast<double>(1 + seed % 7);
  spec.seed = seed;
  return spec;
}

// Each microbatch's tasks scaled by its own factor: the durations a replica's data gives.
std::vector<double> scaled(const Problem& p, uint64_t seed) {
  std::vector<double> d = p.fields().duration;
  for (int32_t t = 0; t < p.num_tasks(); ++t) {
    d[static_cast<size_t>(t)] *= 0.25 + 0.5 * static_cast<double>((p.microbatch(t) * 5 + seed) % 7);
  }
  return d;
}

TEST(Twins, FindsTheCopiesOfAProblemAndNoneInAGeneratedOne) {
  for (uint64_t seed = 0; seed < 6; ++seed) {
    const ProblemInput one = synthetic_problem(spec_for(seed));
    EXPECT_EQ(twin_copies(Problem(one)), 1) << "seed " << seed;
    for (const int32_t copies : {2, 3, 8}) {
      const Problem p(with_copies(one, copies));
      EXPECT_EQ(twin_copies(p), copies) << "seed " << seed;
      EXPECT_TRUE(has_copies(p, copies));
      EXPECT_TRUE(has_copies(p, 1));
      const ProblemInput folded = fold_copies(p, copies);
      EXPECT_EQ(folded.duration, one.duration);
      EXPECT_EQ(folded.after, one.after);
      EXPECT_EQ(folded.lane, one.lane);
      EXPECT_EQ(folded.compute_free.start, one.compute_free.start);
      EXPECT_EQ(folded.link_free.offset, one.link_free.offset);
    }
  }
  EXPECT_THROW(has_copies(Problem(synthetic_problem(spec_for(1))), 0), std::invalid_argument);
}

TEST(Twins, OneCopyScheduledGivesEveryCopyItsSchedule) {
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const int32_t copies = 2 + static_cast<int32_t>(seed % 3);
    const Problem p(with_copies(synthetic_problem(spec_for(seed)), copies));
    const Problem folded(fold_copies(p, copies));
    const std::vector<double> d = scaled(p, seed), df = scaled(folded, seed);
    Scheduler all(p), one(folded);
    for (const Policy policy : {Policy::kGreedy, Policy::kCoarse}) {
      for (const bool fixed : {false, true}) {
        const Schedule a = all.run(policy, &d, fixed);
        const Schedule b = one.run(policy, &df, fixed);
        ASSERT_EQ(a.start.size(), b.start.size() * static_cast<size_t>(copies));
        for (size_t t = 0; t < a.start.size(); ++t) {
          ASSERT_EQ(a.start[t], b.start[t / static_cast<size_t>(copies)]) << "seed " << seed << " task " << t;
        }
        EXPECT_EQ(a.assignment, b.assignment);
        EXPECT_EQ(a.step_time, b.step_time);
        EXPECT_EQ(a.shift_front, b.shift_front);
        EXPECT_EQ(a.shift_back, b.shift_back);
      }
    }
  }
}

TEST(Twins, AnyDifferenceBetweenCopiesIsNoFold) {
  const ProblemInput one = synthetic_problem(spec_for(3));
  const ProblemInput base = with_copies(one, 4);
  ASSERT_EQ(twin_copies(Problem(base)), 4);
  {  // one task of one copy longer: no fold of 4 nor of 2 (the task's group differs in both)
    ProblemInput in = base;
    in.duration[5] *= 1.5;  // copy 1 of task 1
    EXPECT_FALSE(has_copies(Problem(in), 4));
    EXPECT_FALSE(has_copies(Problem(in), 2));
    EXPECT_EQ(twin_copies(Problem(in)), 1);
  }
  {  // a twin lane's window shorter
    ProblemInput in = base;
    ASSERT_FALSE(in.compute_free.start.empty());
    const size_t w = static_cast<size_t>(in.compute_free.offset[1]);  // lane 1's first window
    in.compute_free.end[w] = 0.5 * (in.compute_free.start[w] + in.compute_free.end[w]);
    EXPECT_FALSE(has_copies(Problem(in), 4));
  }
  {  // a task of copy 1 depends on copy 0's
    ProblemInput in = base;
    size_t t = 0;
    while (in.after_offset[t + 1] == in.after_offset[t] || t % 4 != 1) ++t;
    in.after[static_cast<size_t>(in.after_offset[t])] -= 1;
    EXPECT_FALSE(has_copies(Problem(in), 4));
  }
  {  // two copies of one group swap lanes: the lanes are twins, the roles no longer one list
    ProblemInput in = base;
    const size_t g = in.duration.size() - 4;
    std::swap(in.lane[g + 1], in.lane[g + 2]);
    EXPECT_FALSE(has_copies(Problem(in), 4));
  }
  {  // the copies of one lane reused by another: lanes 0..3 hold lane 0's copies and lane 1's
    ProblemInput in = with_copies(one, 2);
    if (one.num_lanes > 1) {
      for (size_t t = 0; t < in.lane.size(); ++t) {
        if (in.lane[t] == 3) in.lane[t] = 1;  // lane 1 now copy 1 of both lanes 0 and 1
      }
      EXPECT_FALSE(has_copies(Problem(in), 2));
    }
  }
  EXPECT_THROW(fold_copies(Problem(synthetic_problem(spec_for(3))), 2), std::invalid_argument);
}

TEST(Twins, CopiesAreRefusedBeyondTheLimits) {
  const ProblemInput one = synthetic_problem(spec_for(2));
  EXPECT_THROW(with_copies(one, 0), std::invalid_argument);
  try {
    with_copies(one, static_cast<int32_t>(kMaxLanes));
    FAIL() << "lanes beyond the limit accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lanes x copies"), std::string::npos) << e.what();
  }
}

TEST(Twins, FoldedSchedulesAreValidForTheWholeProblem) {
  const int32_t copies = 4;
  const Problem p(with_copies(synthetic_problem(spec_for(5)), copies));
  const Problem folded(fold_copies(p, copies));
  Schedule s = schedule(folded, Policy::kGreedy);
  std::vector<double> start;
  for (int32_t t = 0; t < p.num_tasks(); ++t) start.push_back(s.start[static_cast<size_t>(t / copies)]);
  s.start = start;
  EXPECT_TRUE(validate(p, s).empty());
}

}  // namespace
}  // namespace pybubble
