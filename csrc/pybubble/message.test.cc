#include "pybubble/message.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

namespace pybubble {
namespace {

TEST(Message, NumbersInTheirShortestRoundTripForm) {
  EXPECT_EQ(format_number(0.1), "0.1");
  EXPECT_EQ(format_number(12.5), "12.5");
  EXPECT_EQ(format_number(-3.0), "-3");
  EXPECT_EQ(format_number(1e300), "1e+300");
  EXPECT_EQ(format_number(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(format_number(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(format_number(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(format_number(std::numeric_limits<double>::quiet_NaN()), "nan");
  for (double x : {1.0 / 3.0, 6.02214076e23, 5e-324, -1.7976931348623157e308}) {
    EXPECT_EQ(std::strtod(format_number(x).c_str(), nullptr), x) << format_number(x);
  }
}

TEST(Message, IntegersOfEveryWidth) {
  EXPECT_EQ(format_number(int32_t{-5}), "-5");
  EXPECT_EQ(format_number(uint8_t{200}), "200");
  EXPECT_EQ(format_number(std::numeric_limits<int64_t>::min()), "-9223372036854775808");
  EXPECT_EQ(format_number(std::numeric_limits<uint64_t>::max()), "18446744073709551615");
}

TEST(Message, QuotedTextIsCapped) {
  EXPECT_EQ(quote_capped("greedy"), "'greedy'");
  const std::string quoted = quote_capped(std::string(1000000, 'x'));
  EXPECT_EQ(quoted.size(), kMaxQuoted + 5);
  EXPECT_EQ(quoted.substr(quoted.size() - 4), "...'");
}

}  // namespace
}  // namespace pybubble
