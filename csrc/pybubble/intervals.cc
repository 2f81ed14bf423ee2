#include "pybubble/intervals.h"

#include <algorithm>

namespace pybubble {

void merge_intervals(std::vector<Interval>& iv) {
  const auto by_start = [](const Interval& a, const Interval& b) { return a.start < b.start; };
  if (!std::is_sorted(iv.begin(), iv.end(), by_start)) std::sort(iv.begin(), iv.end(), by_start);
  size_t out = 0;
  for (const Interval& w : iv) {
    if (!(w.end > w.start)) continue;
    if (out > 0 && w.start <= iv[out - 1].end) {
      iv[out - 1].end = std::max(iv[out - 1].end, w.end);
    } else {
      iv[out++] = w;
    }
  }
  iv.resize(out);
}

}  // namespace pybubble
