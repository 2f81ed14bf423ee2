// Checks shared by the core's entry points: each throws std::invalid_argument naming the field
// and the value, before anything indexes with what it checks.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "pybubble/limits.h"
#include "pybubble/message.h"

namespace pybubble {

/// The end of the message for a time above kMaxTime.
extern const char* const kAboveMaxTime;

/// Checks `offset` as the CSR offsets of `rows` rows over `count` entries: rows + 1 values, each
/// in [0, count], none below the one before, the first 0 and the last `count`. `name` names the
/// array in messages, e.g. "compute_free.offset[2]: 9 is not in [0, 4]".
void check_offsets(const std::vector<int64_t>& offset, int64_t rows, int64_t count, const std::string& name);

/// Checks `count` (of `field`) against a limit of limits.h named `limit` in _core.LIMITS, e.g.
/// "tasks: 6000000, more than the limit of 5000000 (LIMITS['tasks'])".
void check_count(int64_t count, int64_t limit, const char* limit_name, const std::string& field);

/// Checks a time or duration: a finite number >= 0 and <= kMaxTime. `where()` names it; it is
/// called only to build the message of a failure, so that large arrays are checked without
/// building strings.
template <typename Where>
void check_duration(double d, Where&& where) {
  if (!std::isfinite(d)) throw std::invalid_argument(where() + ": " + format_number(d) + " is not a finite number");
  if (d < 0.0) throw std::invalid_argument(where() + ": " + format_number(d) + " is negative");
  if (d > kMaxTime) throw std::invalid_argument(where() + ": " + format_number(d) + " " + kAboveMaxTime);
}

}  // namespace pybubble
