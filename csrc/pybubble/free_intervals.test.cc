#include "pybubble/free_intervals.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
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

// Random cuts and undos against a plain vector of intervals: the slab's gap moves back and forth.
TEST(FreeIntervals, RandomCutsAndUndosMatchAPlainList) {
  ProblemInput in = lane();
  in.horizon = 400.0;
  in.forward_needed = {400.0};
  in.grad_ready = {400.0};
  in.link_free = {{0, 1}, {0.0}, {400.0}};
  in.compute_free = {{0, 40}, {}, {}};
  for (int w = 0; w < 40; ++w) {
    in.compute_free.start.push_back(10.0 * w);
    in.compute_free.end.push_back(10.0 * w + 7.0);
  }
  in.compute_free.offset = {0, 40};
  const Problem p(in);
  FreeIntervals f(p, {400, 0});
  f.reset();
  Pieces plain = held(f, 0);
  std::vector<std::pair<size_t, Pieces>> marks;
  uint64_t x = 12345;
  const auto next = [&x](uint64_t n) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (x >> 33) % n;
  };
  for (int round = 0; round < 2000; ++round) {
    const uint64_t what = next(10);
    if (what == 0) {
      marks.emplace_back(f.mark(), plain);
    } else if (what == 1 && !marks.empty()) {
      f.undo(marks.back().first);
      plain = marks.back().second;
      marks.pop_back();
    } else if (!plain.empty()) {
      const size_t i = next(plain.size());
      const auto [a, b] = plain[i];
      const double s = a + (b - a) * static_cast<double>(next(5)) / 4.0;
      const double d = (b - s) * static_cast<double>(next(5)) / 4.0;
      f.take(0, static_cast<int64_t>(i), s, d);
      if (d > 0.0) {
        Pieces left;
        if (s - a > kSliver) left.emplace_back(a, s);
        if (b - (s + d) > kSliver) left.emplace_back(s + d, b);
        plain.erase(plain.begin() + static_cast<std::ptrdiff_t>(i));
        plain.insert(plain.begin() + static_cast<std::ptrdiff_t>(i), left.begin(), left.end());
      }
    }
    ASSERT_EQ(held(f, 0), plain) << "round " << round;
    if (!plain.empty()) {  // the searches see the same intervals
      double s = 0.0;
      const double ready = static_cast<double>(next(400));
      const int64_t e = f.earliest(0, ready, 1.0, 1e9, &s);
      int64_t want = -1;
      for (size_t i = 0; i < plain.size(); ++i) {
        if (plain[i].second >= ready && std::max(ready, plain[i].first) + 1.0 <= plain[i].second) {
          want = static_cast<int64_t>(i);
          break;
        }
      }
      ASSERT_EQ(e, want) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace pybubble
