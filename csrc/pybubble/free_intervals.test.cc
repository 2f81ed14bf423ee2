#include "pybubble/free_intervals.h"

#include <gtest/gtest.h>

#include <limits>
#include <utility>
#include <vector>


namespace pybubble {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One lane: compute windows [10, 20), [20, 30) (touching) and [50, 90); link window [0, 100).
ProblemInput lane() {
  ProblemInput in;
  in.horizon = 100.0;
  in.num_lanes = 1;
  in.compute_free = {{0, 3}, {10.0, 20.0, 50.0}, {20.0, 30.0, 90.0}};
  in.link_free = {{0, 1}, {0.0}, {100.0}};
  in.forward_needed = {100.0};
  in.grad_ready = {100.0};
  in.lane = {0};
  in.microbatch = {0};
  in.duration = {1.0};
  in.resource = {kCompute};
  in.phase = {kFwd};
  in.after_offset = {0, 0};
  return in;
}

std::vector<std::pair<double, double>> held(const FreeIntervals& f, int32_t k) {
  std::vector<std::pair<double, double>> out;
  for (int64_t i = 0; i < f.size(k); ++i) out.emplace_back(f.start(k, i), f.end(k, i));
  return out;
}

using Pieces = std::vector<std::pair<double, double>>;

TEST(FreeIntervals, MergesTouchingWindowsAndFindsFits) {
  const Problem p(lane());
  FreeIntervals f(p, {4, 4});
  f.reset();
  EXPECT_EQ(held(f, 0), (Pieces{{10.0, 30.0}, {50.0, 90.0}}));
  EXPECT_EQ(held(f, 1), (Pieces{{0.0, 100.0}}));
  double s = 0.0;
  EXPECT_EQ(f.earliest(0, 25.0, 10.0, 100.0, &s), 1);  // [25, 35) does not fit in [10, 30)
  EXPECT_EQ(s, 50.0);
  EXPECT_EQ(f.earliest(0, 25.0, 10.0, 55.0, &s), -1);  // ...and would end after the limit
  EXPECT_EQ(f.latest(0, 60.0, 15.0, 0.0, &s), 0);      // [45, 60) does not fit in [50, 90)
  EXPECT_EQ(s, 15.0);
  EXPECT_EQ(f.latest(0, 60.0, 15.0, 20.0, &s), -1);    // ...and would start before the floor
}

TEST(FreeIntervals, TakesSplitsDropsSliversAndUndoes) {
  const Problem p(lane());
  FreeIntervals f(p, {4, 4});
  f.reset();
  const size_t mark = f.mark();
  f.take(0, 0, 15.0, 5.0);  // the middle: split
  EXPECT_EQ(held(f, 0), (Pieces{{10.0, 15.0}, {20.0, 30.0}, {50.0, 90.0}}));
  f.take(0, 2, 50.0 + 0.5e-9, 40.0 - 0.5e-9);  // the whole of it, less a sliver: gone
  EXPECT_EQ(held(f, 0), (Pieces{{10.0, 15.0}, {20.0, 30.0}}));
  f.take(0, 1, 20.0, 4.0);  // its start
  f.take(0, 0, 12.0, 3.0);  // its end
  EXPECT_EQ(held(f, 0), (Pieces{{10.0, 12.0}, {24.0, 30.0}}));
  f.take(0, 0, 10.0, 0.0);  // no time: nothing
  EXPECT_EQ(held(f, 0).size(), 2u);
  f.undo(mark);
  EXPECT_EQ(held(f, 0), (Pieces{{10.0, 30.0}, {50.0, 90.0}}));
}

TEST(FreeIntervals, OpensTheEndsOfTheStep) {
  const Problem p(lane());
  FreeIntervals f(p, {4, 4});
  f.reset();
  f.open_front();
  EXPECT_EQ(held(f, 0), (Pieces{{-kInf, 0.0}, {10.0, 30.0}, {50.0, 90.0}}));
  EXPECT_EQ(held(f, 1), (Pieces{{-kInf, 100.0}}));  // a window from 0 merges
  double s = 0.0;
  const int64_t w = f.latest(1, 5.0, 10.0, -kInf, &s);
  EXPECT_EQ(w, 0);
  EXPECT_EQ(s, -5.0);  // across 0
  f.take(1, w, s, 10.0);
  f.close_front();
  EXPECT_EQ(held(f, 0), (Pieces{{10.0, 30.0}, {50.0, 90.0}}));
  EXPECT_EQ(held(f, 1), (Pieces{{5.0, 100.0}}));
  f.open_back();
  EXPECT_EQ(held(f, 0), (Pieces{{10.0, 30.0}, {50.0, 90.0}, {100.0, kInf}}));
  EXPECT_EQ(held(f, 1), (Pieces{{5.0, kInf}}));  // a window to the horizon merges
}

}  // namespace
}  // namespace pybubble
