// Checks shared by the core's entry points: each throws std::invalid_argument naming the field
// and the value, before anything indexes with what it checks.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "pybubble/message.h"

namespace pybubble {

/// Checks `offset` as the CSR offsets of `rows` rows over `count` entries: rows + 1 values, each
/// in [0, count], none below the one before, the first 0 and the last `count`. `name` names the
/// array in messages, e.g. "compute_free.offset[2]: 9 is not in [0, 4]".
void check_offsets(const std::vector<int64_t>& offset, int64_t rows, int64_t count, const std::string& name);

/// Checks a task's duration: a finite number >= 0. `where()` names it; it is called only to build
/// the message of a failure, so that large arrays are checked without building strings.
template <typename Where>
void check_duration(double d, Where&& where) {
  if (!std::isfinite(d)) throw std::invalid_argument(where() + ": " + format_number(d) + " is not a finite number");
  if (d < 0.0) throw std::invalid_argument(where() + ": " + format_number(d) + " is negative");
}

}  // namespace pybubble
