// Time intervals: the one place where overlapping or touching intervals are merged (a rank's
// bubbles into free windows, a lane's windows into free intervals for the validator).
#pragma once

#include <vector>

namespace pybubble {

/// The interval [start, end) in microseconds.
struct Interval {
  double start;  ///< first instant inside
  double end;    ///< first instant after
};

/// Sorts `intervals` by start, drops the empty ones (end <= start) and merges those that touch or
/// overlap, in place: the result is sorted, disjoint and non-touching. O(n) when the intervals
/// come sorted, O(n log n) otherwise.
void merge_intervals(std::vector<Interval>& intervals);

}  // namespace pybubble
