#include "pybubble/message.h"

#include <charconv>
#include <cmath>

namespace pybubble {

std::string format_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);  // shortest round-trip form
  return std::string(buf, res.ptr);
}

std::string cap_text(std::string_view text) {
  if (text.size() <= kMaxQuoted) return std::string(text);
  return std::string(text.substr(0, kMaxQuoted)) + "...";
}

std::string quote_capped(std::string_view text) { return "'" + cap_text(text) + "'"; }

}  // namespace pybubble
