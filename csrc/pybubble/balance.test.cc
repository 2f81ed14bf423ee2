#include "pybubble/balance.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

namespace pybubble {
namespace {

TEST(Balance, MatchesTheBoundOnAnEvenSplit) {
  // Eight samples of (1, 2): four microbatches of two each reach the bound (2, 4) exactly.
  std::vector<double> c;
  for (int i = 0; i < 8; ++i) c.insert(c.end(), {1.0, 2.0});
  const auto a = balance_microbatches(c.data(), 8, 4);
  EXPECT_DOUBLE_EQ(max_microbatch_cost(c.data(), 8, a.data(), 4), 4.0);
  EXPECT_DOUBLE_EQ(balance_lower_bound(c.data(), 8, 4), 4.0);
}

TEST(Balance, StaysNearTheBoundOnRandomBatches) {
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> enc(0.0, 1.0), llm(0.0, 0.5);
  std::vector<double> c;
  for (int i = 0; i < 4096; ++i) c.insert(c.end(), {enc(rng), llm(rng)});
  const auto a = balance_microbatches(c.data(), 4096, 64);
  std::vector<int> count(64, 0);
  for (auto k : a) ++count[static_cast<size_t>(k)];
  for (int k : count) EXPECT_GE(k, 1);
  EXPECT_LE(max_microbatch_cost(c.data(), 4096, a.data(), 64), 1.02 * balance_lower_bound(c.data(), 4096, 64));
}

TEST(Balance, RejectsBadInput) {
  std::vector<double> c = {1.0, -2.0};
  EXPECT_THROW(balance_microbatches(c.data(), 1, 1), std::invalid_argument);
  c = {1.0, 2.0};
  EXPECT_THROW(balance_microbatches(c.data(), 1, 2), std::invalid_argument);
  EXPECT_THROW(balance_microbatches(c.data(), 0, 1), std::invalid_argument);
}

}  // namespace
}  // namespace pybubble
