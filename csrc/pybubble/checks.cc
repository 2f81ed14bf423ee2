#include "pybubble/checks.h"

#include <stdexcept>

#include "pybubble/message.h"

namespace pybubble {

const char* const kAboveMaxTime = "is above the largest time, 1e+12 us (LIMITS['time'])";

void check_count(int64_t count, int64_t limit, const char* limit_name, const std::string& field) {
  if (count > limit) {
    throw std::invalid_argument(field + ": " + format_number(count) + ", more than the limit of " + format_number(limit) +
                                " (LIMITS['" + limit_name + "'])");
  }
}

void check_offsets(const std::vector<int64_t>& offset, int64_t rows, int64_t count, const std::string& name) {
  if (rows < 0 || offset.size() != static_cast<uint64_t>(rows) + 1) {
    throw std::invalid_argument(name + ": " + format_number(offset.size()) + " entries, expected " +
                                (rows < 0 ? std::string("a row count >= 0") : format_number(rows + 1)));
  }
  for (size_t i = 0; i < offset.size(); ++i) {
    const auto where = [&] { return name + "[" + format_number(i) + "]: " + format_number(offset[i]); };
    if (offset[i] < 0 || offset[i] > count) {
      throw std::invalid_argument(where() + " is not in [0, " + format_number(count) + "]");
    }
    if (i > 0 && offset[i] < offset[i - 1]) {
      throw std::invalid_argument(where() + " is below the offset before it, " + format_number(offset[i - 1]));
    }
  }
  if (offset.front() != 0) throw std::invalid_argument(name + "[0]: " + format_number(offset.front()) + " is not 0");
  if (offset.back() != count) {
    throw std::invalid_argument(name + "[" + format_number(rows) + "]: " + format_number(offset.back()) +
                                " is not " + format_number(count) + ", the number of entries");
  }
}

}  // namespace pybubble
