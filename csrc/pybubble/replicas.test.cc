#include "pybubble/replicas.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "pybubble/synthetic.h"
#include "pybubble/twins.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

// replicas x microbatches factors from 0 (a microbatch without images) to 3.
std::vector<double> scales(int64_t replicas, int32_t microbatches, uint64_t seed) {
  std::vector<double> s;
  for (int64_t k = 0; k < replicas; ++k) {
    for (int32_t j = 0; j < microbatches; ++j) s.push_back(0.25 * static_cast<double>((k * 7 + j * 3 + seed) % 13));
  }
  return s;
}

// Replica k's durations: each task's scaled by its microbatch's factor in row k.
std::vector<double> durations(const Problem& p, const std::vector<double>& scale, int64_t k) {
  std::vector<double> d = p.fields().duration;
  for (int32_t t = 0; t < p.num_tasks(); ++t) d[static_cast<size_t>(t)] *= scale[static_cast<size_t>(k * p.num_microbatches() + p.microbatch(t))];
  return d;
}

TEST(ReplicaScheduler, EachReplicaIsTheSchedulerOnItsOwnDurations) {
  int hidden = 0, grown = 0;  // greedy schedules inside the LLM step, and ones that grow it
  for (uint64_t seed = 0; seed < 8; ++seed) {
    SyntheticSpec spec;
    spec.stages = 1 + static_cast<int32_t>(seed % 4);
    spec.twin_lanes = 1 + static_cast<int32_t>(seed % 3) * 2;  // 1, 3, 5 twin lanes
    spec.encoder_layers = 4;
    spec.microbatches = 1 + static_cast<int32_t>(seed % 5);
    spec.encoder_scale = 0.5 + 0.5 * static_cast<double>(seed % 4);
    spec.seed = seed;
    const Problem p(synthetic_problem(spec));
    const int64_t replicas = 5;
    const std::vector<double> scale = scales(replicas, p.num_microbatches(), seed);
    Scheduler one(p);
    for (const Policy policy : {Policy::kGreedy, Policy::kCoarse, Policy::kHoles}) {
      for (const bool fixed : {true, false}) {
        for (const int32_t threads : {1, 2, 3}) {
          ReplicaScheduler all(p, threads, policy, fixed);
          EXPECT_EQ(all.copies(), spec.twin_lanes);
          ReplicaSchedules out;
          all.run(scale.data(), replicas, out);
          ASSERT_EQ(out.replicas, replicas);
          EXPECT_EQ(out.tasks * out.copies, p.num_tasks());
          for (int64_t k = 0; k < replicas; ++k) {
            const std::vector<double> d = durations(p, scale, k);
            const Schedule want = one.run(policy, &d, fixed);
            const Schedule got = out.schedule(k);
            ASSERT_EQ(got.start, want.start) << "seed " << seed << " replica " << k << " threads " << threads;
            EXPECT_EQ(got.assignment, want.assignment);
            EXPECT_EQ(got.step_time, want.step_time);
            EXPECT_EQ(got.shift_front, want.shift_front);
            EXPECT_EQ(got.shift_back, want.shift_back);
            EXPECT_GE(out.seconds[static_cast<size_t>(k)], 0.0);
            if (policy == Policy::kGreedy && threads == 1) ++(got.step_time > p.horizon() ? grown : hidden);
            if (k == 0 && threads == 1) {
              ProblemInput in = p.input();
              in.duration = d;
              EXPECT_TRUE(validate(Problem(std::move(in)), got).empty()) << "seed " << seed;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(hidden, 0);
  EXPECT_GT(grown, 0);
}

TEST(ReplicaScheduler, ReusesItsMemoryAndTakesNoReplicas) {
  SyntheticSpec spec;
  spec.twin_lanes = 2;
  const Problem p(synthetic_problem(spec));
  ReplicaScheduler all(p, 2, Policy::kGreedy, true);
  ReplicaSchedules a, b;
  const std::vector<double> s = scales(4, p.num_microbatches(), 1);
  all.run(s.data(), 4, a);
  all.run(s.data(), 2, b);  // the first two rows again
  for (int64_t k = 0; k < 2; ++k) EXPECT_EQ(a.schedule(k).start, b.schedule(k).start);
  all.run(s.data(), 0, b);
  EXPECT_EQ(b.replicas, 0);
  EXPECT_TRUE(b.start.empty());
  EXPECT_THROW(b.schedule(0), std::invalid_argument);
}

TEST(ReplicaScheduler, RefusesBadScalesNamingTheEntry) {
  const Problem p(synthetic_problem(SyntheticSpec{}));
  ReplicaScheduler all(p, 2, Policy::kGreedy, true);
  ReplicaSchedules out;
  const int32_t m = p.num_microbatches();
  const auto message = [&](std::vector<double> s) {
    try {
      all.run(s.data(), static_cast<int64_t>(s.size()) / m, out);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::vector<double> s = scales(3, m, 0);
  s[static_cast<size_t>(m + 2)] = -1.0;
  EXPECT_EQ(message(s).rfind("scale[1, 2]: -1 is not a finite number >= 0", 0), 0u) << message(s);
  s[static_cast<size_t>(m + 2)] = std::nan("");
  EXPECT_EQ(message(s).rfind("scale[1, 2]: ", 0), 0u) << message(s);
  s[static_cast<size_t>(m + 2)] = 1e300;
  EXPECT_NE(message(s).find("above the largest time"), std::string::npos) << message(s);
  EXPECT_THROW(ReplicaScheduler(p, 0, Policy::kGreedy, true), std::invalid_argument);
}

}  // namespace
}  // namespace pybubble
