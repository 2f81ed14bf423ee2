#include "pybubble/problem.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>

#include "pybubble/scheduler.h"
#include "pybubble/synthetic.h"
#include "pybubble/validate.h"

namespace pybubble {
namespace {

ProblemInput two_tasks() {
  ProblemInput in;
  in.horizon = 100.0;
  in.num_lanes = 1;
  in.compute_free = {{0, 1}, {10.0}, {20.0}};
  in.link_free = {{0, 0}, {}, {}};
  in.forward_needed = {50.0};
  in.grad_ready = {60.0};
  in.lane = {0, 0};
  in.microbatch = {0, 0};
  in.duration = {5.0, 5.0};
  in.resource = {kCompute, kCompute};
  in.phase = {kFwd, kBwd};
  in.after_offset = {0, 0, 1};
  in.after = {0};
  return in;
}

std::string error_of(const ProblemInput& in) {
  try {
    Problem p(in);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Problem, WithOtherTasksSharesTheWindowsAndChecksTheTasks) {
  const Problem base(two_tasks());
  ProblemInput tasks;  // one forward task of 7 us; its other fields are ignored
  tasks.horizon = 1.0;
  tasks.lane = {0};
  tasks.microbatch = {0};
  tasks.duration = {7.0};
  tasks.resource = {kCompute};
  tasks.phase = {kFwd};
  tasks.after_offset = {0, 0};
  const Problem p(base, tasks);
  EXPECT_EQ(p.num_tasks(), 1);
  EXPECT_EQ(p.horizon(), 100.0);
  EXPECT_EQ(&p.windows(kCompute), &base.windows(kCompute));  // shared, not copied
  EXPECT_TRUE(p.fields().compute_free.start.empty());
  const ProblemInput full = p.input();  // the windows come back with input()
  EXPECT_EQ(full.compute_free.start, std::vector<double>{10.0});
  EXPECT_EQ(full.forward_needed, std::vector<double>{50.0});
  EXPECT_EQ(Problem(full).num_tasks(), 1);
  EXPECT_EQ(schedule(p, Policy::kGreedy).step_time, schedule(Problem(full), Policy::kGreedy).step_time);
  tasks.lane = {1};
  try {
    Problem bad(base, tasks);
    ADD_FAILURE() << "a task on lane 1 of 1 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "tasks[0].lane: 1 is not in [0, 1)");
  }
}

// Tasks of microbatch 0 on lane `lane`: a forward chain of `fwd` tasks, then a backward chain of
// `bwd` after the last forward; durations 1, 2, 3, ...
ProblemInput chain_tasks(int64_t lane, int fwd, int bwd) {
  ProblemInput t;
  t.after_offset = {0};
  for (int i = 0; i < fwd + bwd; ++i) {
    t.lane.push_back(lane);
    t.microbatch.push_back(0);
    t.duration.push_back(1.0 + i);
    t.resource.push_back(i % 3 == 2 ? kComm : kCompute);
    t.phase.push_back(i < fwd ? kFwd : kBwd);
    if (i > 0) t.after.push_back(i - 1);
    t.after_offset.push_back(static_cast<int64_t>(t.after.size()));
  }
  return t;
}

std::string join_error(const Problem& base, const std::vector<const Problem*>& blocks,
                       const std::vector<int64_t>& counts) {
  try {
    Problem p(base, blocks, counts);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Problem, JoinedBlocksEqualTheirTasksGivenWhole) {
  ProblemInput in = two_tasks();
  in.num_lanes = 2;
  in.compute_free = {{0, 1, 2}, {10.0, 5.0}, {20.0, 90.0}};
  in.link_free = {{0, 1, 1}, {0.0}, {100.0}};
  in.forward_needed = {50.0, 55.0, 60.0, 70.0};
  in.grad_ready = {60.0, 65.0, 70.0, 80.0};
  const Problem base(in);
  const Problem a(base, chain_tasks(0, 2, 1)), b(base, chain_tasks(1, 3, 4));
  const Problem joined(base, {&a, &b, &a}, {1, 2, 0});
  // The same tasks given whole: a once, then b twice, each copy a microbatch of its own.
  ProblemInput whole;
  whole.after_offset = {0};
  int64_t j = 0;
  for (const auto& [block, copies] : {std::pair{&a, 1}, std::pair{&b, 2}}) {
    for (int c = 0; c < copies; ++c, ++j) {
      const ProblemInput& f = block->fields();
      const int64_t first = static_cast<int64_t>(whole.lane.size());
      for (size_t i = 0; i < f.lane.size(); ++i) {
        whole.lane.push_back(f.lane[i]);
        whole.microbatch.push_back(j);
        whole.duration.push_back(f.duration[i]);
        whole.resource.push_back(f.resource[i]);
        whole.phase.push_back(f.phase[i]);
        for (int64_t q = f.after_offset[i]; q < f.after_offset[i + 1]; ++q) {
          whole.after.push_back(first + f.after[static_cast<size_t>(q)]);
        }
        whole.after_offset.push_back(static_cast<int64_t>(whole.after.size()));
      }
    }
  }
  const Problem given(base, whole);
  ASSERT_EQ(joined.num_tasks(), given.num_tasks());
  const ProblemInput &x = joined.fields(), &y = given.fields();
  EXPECT_EQ(x.lane, y.lane);
  EXPECT_EQ(x.microbatch, y.microbatch);
  EXPECT_EQ(x.duration, y.duration);
  EXPECT_EQ(x.resource, y.resource);
  EXPECT_EQ(x.phase, y.phase);
  EXPECT_EQ(x.after_offset, y.after_offset);
  EXPECT_EQ(x.after, y.after);
  EXPECT_EQ(&joined.windows(kComm), &base.windows(kComm));
  for (int32_t t = 0; t < given.num_tasks(); ++t) {
    EXPECT_EQ(std::vector<int32_t>(joined.pred_begin(t), joined.pred_end(t)),
              std::vector<int32_t>(given.pred_begin(t), given.pred_end(t)));
    EXPECT_EQ(std::vector<int32_t>(joined.succ_begin(t), joined.succ_end(t)),
              std::vector<int32_t>(given.succ_begin(t), given.succ_end(t)));
    EXPECT_EQ(joined.lane(t), given.lane(t));
    EXPECT_EQ(joined.microbatch(t), given.microbatch(t));
  }
  for (int32_t m = 0; m < 4; ++m) {
    for (int ph : {kFwd, kBwd}) {
      EXPECT_EQ(std::vector<int32_t>(joined.tasks_begin(m, ph), joined.tasks_end(m, ph)),
                std::vector<int32_t>(given.tasks_begin(m, ph), given.tasks_end(m, ph)));
    }
  }
  for (Policy pol : {Policy::kGreedy, Policy::kCoarse, Policy::kHoles}) {
    Scheduler s1(joined), s2(given);
    EXPECT_EQ(s1.run(pol).start, s2.run(pol).start);
    EXPECT_TRUE(validate(joined, s1.run(pol)).empty());
  }
  // Refused: a block on other bubbles, of another microbatch, a negative count, too many copies.
  const Problem other(two_tasks());
  EXPECT_EQ(join_error(base, {&other}, {1}), "blocks[0]: not a problem on these bubbles (make it with_tasks of them)");
  ProblemInput second = chain_tasks(0, 1, 0);
  second.microbatch = {1};
  const Problem of_one(base, second);
  EXPECT_EQ(join_error(base, {&a, &of_one}, {1, 1}), "blocks[1]: holds tasks of a microbatch other than 0");
  EXPECT_EQ(join_error(base, {&a}, {-1}), "counts[0]: -1 is negative");
  EXPECT_EQ(join_error(base, {&a, &b}, {3, 2}), "counts: 5 microbatches or more, the problem has 4");
  EXPECT_EQ(join_error(base, {&a}, {1, 1}), "counts: 2 counts for 1 blocks");
  EXPECT_EQ(Problem(base, {}, {}).num_tasks(), 0);
  // A block of no task still counts its copies as microbatches.
  const Problem none(base, chain_tasks(0, 0, 0));
  const Problem after_two(base, {&none, &a}, {2, 1});
  EXPECT_EQ(after_two.fields().microbatch, std::vector<int64_t>(3, 2));
  EXPECT_EQ(after_two.tasks_end(1, kBwd) - after_two.tasks_begin(0, kFwd), 0);
  EXPECT_EQ(after_two.tasks_end(2, kFwd) - after_two.tasks_begin(2, kFwd), 2);
}

TEST(Problem, AcceptsAValidProblemAndIndexesIt) {
  Problem p(two_tasks());
  EXPECT_EQ(p.num_tasks(), 2);
  EXPECT_EQ(p.succ_end(0) - p.succ_begin(0), 0);  // successors of another phase are not listed
  EXPECT_EQ(p.tasks_end(0, kFwd) - p.tasks_begin(0, kFwd), 1);
  EXPECT_EQ(*p.tasks_begin(0, kBwd), 1);
}

TEST(Problem, NamesTheBadField) {
  auto in = two_tasks();
  in.after = {1};
  EXPECT_EQ(error_of(in), "tasks[1].after[0]: 1 is not < 1");
  in = two_tasks();
  in.compute_free.end = {200.0};
  EXPECT_EQ(error_of(in), "lanes[0].compute_free[0]: end 200 is after the horizon 100");
  in = two_tasks();
  in.lane = {0, 3};
  EXPECT_EQ(error_of(in), "tasks[1].lane: 3 is not in [0, 1)");
  in = two_tasks();
  in.phase = {kBwd, kFwd};
  EXPECT_EQ(error_of(in), "tasks[1].after[0]: 0 is a backward task, a predecessor of forward task 1");
  in = two_tasks();
  in.grad_ready = {40.0};
  EXPECT_EQ(error_of(in), "microbatches[0].grad_ready: 40 is before forward_needed 50");
  in = two_tasks();
  in.after_offset = {0, 0};
  EXPECT_EQ(error_of(in), "tasks.after_offset: 2 entries, expected 3");
}

TEST(Problem, OffsetsAreCheckedBeforeTheyIndex) {
  // Rising then falling: lane 0 would walk windows 0..2 of the only one.
  auto in = two_tasks();
  in.num_lanes = 2;
  in.compute_free.offset = {0, 3, 1};
  in.link_free.offset = {0, 0, 0};
  EXPECT_EQ(error_of(in), "compute_free.offset[1]: 3 is not in [0, 1]");
  in.compute_free.offset = {0, 1, 0};
  EXPECT_EQ(error_of(in), "compute_free.offset[2]: 0 is below the offset before it, 1");
  in.compute_free.offset = {0, 0, 1};
  in.link_free = {{0, 1, 0}, {1.0}, {2.0}};
  EXPECT_EQ(error_of(in), "link_free.offset[2]: 0 is below the offset before it, 1");
  in = two_tasks();
  in.after_offset = {0, 5, 1};
  EXPECT_EQ(error_of(in), "tasks.after_offset[1]: 5 is not in [0, 1]");
  in.after_offset = {0, 1, 0};
  EXPECT_EQ(error_of(in), "tasks.after_offset[2]: 0 is below the offset before it, 1");
}

// Random corruption of valid inputs: the core either rejects the input with invalid_argument or
// accepts it and then schedules it validly. Run under ASan/UBSan in CI.
TEST(Problem, FuzzedInputsNeverCrash) {
  std::mt19937_64 rng(7);
  SyntheticSpec spec;
  spec.stages = 2;
  spec.microbatches = 3;
  spec.encoder_layers = 2;
  spec.kernels_per_layer = 3;
  const ProblemInput good = synthetic_problem(spec);
  const double specials[] = {-1.0, 0.0, 1e300, -1e300, std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(), 5.0};
  const int64_t ints[] = {-1, 0, 1, 2, 3, 1000000, std::numeric_limits<int64_t>::max(),
                          std::numeric_limits<int64_t>::min()};
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    ProblemInput in = good;
    std::vector<std::vector<int64_t>*> iv = {&in.compute_free.offset, &in.link_free.offset, &in.lane,
                                             &in.microbatch, &in.resource, &in.phase, &in.after_offset,
                                             &in.after};
    std::vector<std::vector<double>*> dv = {&in.compute_free.start, &in.compute_free.end, &in.link_free.start,
                                            &in.link_free.end, &in.forward_needed, &in.grad_ready,
                                            &in.duration};
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      if (rng() % 2) {
        auto* v = iv[rng() % iv.size()];
        if (rng() % 8 == 0) {
          v->pop_back();
        } else if (!v->empty()) {
          (*v)[rng() % v->size()] = ints[rng() % 8];
        }
      } else {
        auto* v = dv[rng() % dv.size()];
        if (rng() % 8 == 0 && !v->empty()) {
          v->pop_back();
        } else if (!v->empty()) {
          (*v)[rng() % v->size()] = specials[rng() % 7];
        }
      }
    }
    if (rng() % 16 == 0) in.num_lanes = ints[rng() % 8];
    try {
      Problem p(std::move(in));
      ++accepted;
      for (Policy pol : {Policy::kGreedy, Policy::kCoarse, Policy::kHoles}) {
        const auto v = validate(p, schedule(p, pol));
        EXPECT_TRUE(v.empty()) << "round " << round << ": " << v.front();
      }
    } catch (const std::invalid_argument&) {
    }
  }
  EXPECT_GT(accepted, 100);
}

}  // namespace
}  // namespace pybubble
