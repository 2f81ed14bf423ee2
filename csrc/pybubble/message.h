// Text for error messages: the one way the core writes a number or a caller's string into one.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace pybubble {

/// The shortest decimal that reads back as `x` exactly ("0.1", "1e+300", "-0"), or "inf",
/// "-inf", "nan".
std::string format_number(double x);

/// An integer in decimal.
template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
std::string format_number(T x) {
  if constexpr (std::is_signed_v<T>) {
    return std::to_string(static_cast<long long>(x));
  } else {
    return std::to_string(static_cast<unsigned long long>(x));
  }
}

/// The most characters of a caller's string that a message repeats.
constexpr size_t kMaxQuoted = 40;

/// `text` cut to its first kMaxQuoted characters ("..." marks a cut), so that a message never
/// repeats an unbounded value.
std::string cap_text(std::string_view text);

/// cap_text(text) in single quotes.
std::string quote_capped(std::string_view text);

}  // namespace pybubble
