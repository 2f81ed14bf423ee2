#include "pybubble/balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>

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

TEST(ReplicaMoves, TheLargestImageThatFitsGoesToTheLightestReplica) {
  // Replica 0 holds 4, 3, 2 and 1, replica 1 nothing: mean 5. The largest image within 5 (the 4),
  // then the largest within 1 (the 1) leave both at 5.
  const std::vector<double> cost = {4.0, 3.0, 2.0, 1.0};
  const std::vector<int64_t> owner = {0, 0, 0, 0};
  EXPECT_EQ(balance_replicas(cost.data(), owner.data(), nullptr, 4, 2), (std::vector<int64_t>{0, 0, 1, 3, 0, 1}));
  // With slots 0, 1, 0, 1: slot 0 (4 and 2) gives its 2, slot 1 (3 and 1) its 1; then the totals
  // (7 and 3) would take the 3, but it would lift replica 1's slot 1 (1 + 3) above its largest (3).
  const std::vector<int64_t> slot = {0, 1, 0, 1};
  EXPECT_EQ(balance_replicas(cost.data(), owner.data(), slot.data(), 4, 2), (std::vector<int64_t>{2, 0, 1, 3, 0, 1}));
}

TEST(ReplicaMoves, NeverRaiseTheLargestLoadAndMoveEachImageOnceFromItsOwner) {
  std::mt19937_64 rng(11);
  int moved = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t r = 1 + static_cast<int64_t>(rng() % 8), n = static_cast<int64_t>(rng() % 80);
    const int64_t slots = 1 + static_cast<int64_t>(rng() % 5);
    std::vector<double> cost(static_cast<size_t>(n));
    std::vector<int64_t> owner(static_cast<size_t>(n)), slot(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      cost[static_cast<size_t>(i)] = static_cast<double>(rng() % 5) * 0.5;  // ties and images without cost
      owner[static_cast<size_t>(i)] = static_cast<int64_t>(rng() % static_cast<uint64_t>(1 + (trial % 2 ? r - 1 : r / 2)));
      slot[static_cast<size_t>(i)] = static_cast<int64_t>(rng() % static_cast<uint64_t>(slots)) * 7;  // sparse slot values
    }
    for (const bool by_slot : {false, true}) {
      const std::vector<int64_t> m = balance_replicas(cost.data(), owner.data(), by_slot ? slot.data() : nullptr, n, r);
      ASSERT_EQ(m.size() % 3, 0u);
      std::vector<int64_t> runs_on = owner;
      std::vector<int> times(static_cast<size_t>(n), 0);
      for (size_t x = 0; x < m.size(); x += 3) {
        const size_t i = static_cast<size_t>(m[x]);
        EXPECT_EQ(m[x + 1], owner[i]);
        EXPECT_GT(cost[i], 0.0);
        EXPECT_NE(m[x + 2], m[x + 1]);
        EXPECT_EQ(++times[i], 1);
        runs_on[i] = m[x + 2];
        ++moved;
      }
      const auto largest = [&](const std::vector<int64_t>& on, int64_t only_slot) {
        std::vector<double> load(static_cast<size_t>(r), 0.0);
        for (int64_t i = 0; i < n; ++i) {
          if (only_slot < 0 || slot[static_cast<size_t>(i)] == only_slot) load[static_cast<size_t>(on[static_cast<size_t>(i)])] += cost[static_cast<size_t>(i)];
        }
        return *std::max_element(load.begin(), load.end());
      };
      EXPECT_LE(largest(runs_on, -1), largest(owner, -1) + 1e-9);
      if (by_slot) {
        for (int64_t s = 0; s < slots; ++s) EXPECT_LE(largest(runs_on, 7 * s), largest(owner, 7 * s) + 1e-9);
      }
    }
  }
  EXPECT_GT(moved, 100);
}

TEST(ReplicaMoves, RejectBadInputNamingTheField) {
  const auto message = [](std::vector<double> cost, std::vector<int64_t> owner, std::vector<int64_t> slot, int64_t r) {
    try {
      balance_replicas(cost.data(), owner.data(), slot.empty() ? nullptr : slot.data(), static_cast<int64_t>(cost.size()), r);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message({1.0, -1.0}, {0, 0}, {}, 2), "image_cost[1]: -1 is negative");
  EXPECT_EQ(message({1.0, 1.0}, {0, 2}, {}, 2), "image_owner[1]: 2 is not in [0, 2)");
  EXPECT_EQ(message({1.0, 1.0}, {0, 1}, {0, -3}, 2), "image_slot[1]: -3 is negative");
  EXPECT_EQ(message({1.0}, {0}, {}, 0), "replicas: 0 is not >= 1");
  EXPECT_EQ(message({}, {}, {}, 3), "accepted");
}

}  // namespace
}  // namespace pybubble
