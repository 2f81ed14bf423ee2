#include "pybubble/intervals.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace pybubble {
namespace {

std::vector<Interval> merged(std::vector<Interval> iv) {
  merge_intervals(iv);
  return iv;
}

void expect_intervals(const std::vector<Interval>& got, const std::vector<Interval>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].start, want[i].start) << i;
    EXPECT_EQ(got[i].end, want[i].end) << i;
  }
}

TEST(Intervals, MergesTouchingAndOverlapping) {
  expect_intervals(merged({{0, 1}, {1, 2}, {1.5, 4}, {5, 6}}), {{0, 4}, {5, 6}});
}

TEST(Intervals, SortsFirstAndKeepsTheFurthestEnd) {
  expect_intervals(merged({{5, 6}, {0, 10}, {2, 3}, {12, 13}}), {{0, 10}, {12, 13}});
}

TEST(Intervals, DropsEmptyOnes) {
  expect_intervals(merged({{1, 1}, {3, 2}, {4, 5}}), {{4, 5}});
  expect_intervals(merged({}), {});
}

TEST(Intervals, InfiniteEndsMerge) {
  const double inf = std::numeric_limits<double>::infinity();
  expect_intervals(merged({{-inf, 0}, {0, 3}, {7, 9}, {9, inf}}), {{-inf, 3}, {7, inf}});
}

}  // namespace
}  // namespace pybubble
