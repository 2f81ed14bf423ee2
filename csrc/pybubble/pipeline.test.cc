#include "pybubble/pipeline.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace pybubble {
namespace {

PipelineSpec one_f_one_b(int32_t p, int32_t m, double f, double b) {
  PipelineSpec sp;
  sp.ranks = p;
  sp.microbatches = m;
  fill_one_f_one_b(sp);
  sp.fwd.assign(p, f);
  sp.bwd.assign(p, b);
  sp.wgrad.assign(p, 0.0);
  return sp;
}

double idle(const PipelineTimeline& tl, int32_t rank) {
  double s = 0;
  for (size_t i = 0; i < tl.bubble_rank.size(); ++i) {
    if (tl.bubble_rank[i] == rank) s += tl.bubble_end[i] - tl.bubble_start[i];
  }
  return s;
}

TEST(Pipeline, OneFOneBClosedForm) {
  for (int32_t p : {1, 2, 4, 7}) {
    for (int32_t m : {p, 2 * p + 1}) {
      const PipelineTimeline tl = simulate_pipeline(one_f_one_b(p, m, 1.0, 2.0));
      EXPECT_EQ(tl.step_time, (m + p - 1) * 3.0) << p << " " << m;
      for (int32_t r = 0; r < p; ++r) EXPECT_EQ(idle(tl, r), (p - 1) * 3.0);
      EXPECT_EQ(tl.forward_needed[0], 0.0);
      EXPECT_EQ(tl.grad_ready[0], p * 3.0);
    }
  }
}

TEST(Pipeline, DataParallelCollectivesAddToTheStep) {
  PipelineSpec sp = one_f_one_b(4, 8, 1.0, 2.0);
  sp.dp_allgather = 5.0;
  sp.dp_reducescatter = 7.0;
  const PipelineTimeline tl = simulate_pipeline(sp);
  EXPECT_EQ(tl.step_time, 11 * 3.0 + 12.0);
  EXPECT_EQ(tl.forward_needed[0], 5.0);
  EXPECT_EQ(tl.grad_ready[0], 5.0 + 4 * 3.0);
}

TEST(Pipeline, TpCollectivesAreBubblesInsideOps) {
  PipelineSpec sp = one_f_one_b(2, 2, 10.0, 20.0);
  sp.tp_count = 2;
  sp.tp_duration = 1.0;
  const PipelineTimeline tl = simulate_pipeline(sp);
  size_t tp = 0;
  for (uint8_t k : tl.bubble_kind) tp += k == kTp;
  EXPECT_EQ(tp, 2u * 2u * 2u * 2u);  // ranks * (F + B) * microbatches * collectives
  // The link is free between the collectives: 8 per rank split [0, step] into 9 windows.
  EXPECT_EQ(tl.link_free.offset, (std::vector<int64_t>{0, 9, 18}));
  EXPECT_EQ(tl.step_time, 3 * 30.0);
}

TEST(Pipeline, TpCollectivesMustLeaveCompute) {
  PipelineSpec sp = one_f_one_b(2, 2, 10.0, 20.0);
  sp.tp_count = 4;
  sp.tp_duration = 2.0;  // 5 * 2 = 10: no compute left in a forward
  EXPECT_THROW(simulate_pipeline(sp), std::invalid_argument);
  sp.tp_duration = 1.9;
  EXPECT_NO_THROW(simulate_pipeline(sp));
}

TEST(Pipeline, DeadlockNamesTheWaitingAction) {
  PipelineSpec sp = one_f_one_b(2, 2, 1.0, 2.0);
  // Rank 0 runs its backward of microbatch 0 first: it waits on its own 0F0, and rank 1 on 0F0.
  std::swap(sp.kind[0], sp.kind[2]);
  std::swap(sp.microbatch[0], sp.microbatch[2]);
  try {
    simulate_pipeline(sp);
    FAIL() << "no deadlock reported";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0's 0B0 waits on 0F0 (rank 0); rank 1's 1F0 waits on 0F0"), std::string::npos) << e.what();
  }
}

TEST(Pipeline, BadInputNamesTheField) {
  PipelineSpec sp = one_f_one_b(2, 2, 1.0, 2.0);
  sp.fwd[1] = -1.0;
  EXPECT_THROW(simulate_pipeline(sp), std::invalid_argument);
  sp = one_f_one_b(2, 2, 1.0, 2.0);
  sp.microbatch[0] = 5;
  EXPECT_THROW(simulate_pipeline(sp), std::invalid_argument);
  sp = one_f_one_b(2, 2, 1.0, 2.0);
  sp.p2p = -1;
  try {
    simulate_pipeline(sp);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("p2p:", 0), 0u) << e.what();
  }
}

TEST(Pipeline, HugeCountsAreRejectedBeforeAllocating) {
  // A microbatch number of 2^31 - 2 would need a table of 8 * 2^31 entries: rejected by count,
  // naming the first missing action.
  PipelineSpec sp = one_f_one_b(1, 2, 1.0, 2.0);
  sp.microbatch[2] = 2147483646;
  sp.microbatches = 2147483647;
  try {
    simulate_pipeline(sp);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "microbatches: 2147483647, more than the limit of 1000000 (LIMITS['microbatches'])");
  }
  sp.microbatch[2] = 999999;
  sp.microbatches = 1000000;  // within the limit, far beyond the table's 4 actions
  try {
    simulate_pipeline(sp);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("table: 0F1 is missing", 0), 0u) << e.what();
  }
  sp = one_f_one_b(2, 2, 1.0, 2.0);
  sp.chunks = 1 << 30;  // ranks * chunks overflows int32
  EXPECT_THROW(simulate_pipeline(sp), std::invalid_argument);
  sp = one_f_one_b(2, 2, 1.0, 2.0);
  sp.tp_duration = 1e-300;
  sp.tp_count = 2147483647;  // count + 1 overflows int32; 8 ops x 2^31 gaps
  try {
    simulate_pipeline(sp);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "tp_comm.count x 8 ops: 17179869176, more than the limit of 20000000 (LIMITS['tp_gaps'])");
  }
  sp.tp_duration = 0.1;  // 0.1 * 2^31 leaves no compute: checked in floating point, no overflow
  try {
    simulate_pipeline(sp);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tp_comm: 2147483647 collectives", 0), 0u) << e.what();
  }
}

TEST(Pipeline, ErrorsWriteNumbersShortest) {
  PipelineSpec sp = one_f_one_b(2, 2, 1.0, 2.0);
  sp.wgrad[0] = 2.5;
  try {
    simulate_pipeline(sp);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "wgrad[0]: 2.5 is not < bwd 2");
  }
  sp = one_f_one_b(2, 2, 1.0, 2.0);
  sp.p2p = -0.1;
  try {
    simulate_pipeline(sp);
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "p2p: -0.1 is not >= 0");
  }
}

TEST(Pipeline, FreeWindowsMergeBubblesAndComplementTheLink) {
  // 2 ranks, 1F1B, one TP collective per op, an all-gather: rank 1's all-gather touches its
  // warm-up gap (one window), rank 0's does not (its first forward starts at once).
  PipelineSpec sp = one_f_one_b(2, 1, 10.0, 20.0);
  sp.tp_count = 1;
  sp.tp_duration = 2.0;
  sp.dp_allgather = 3.0;
  const PipelineTimeline tl = simulate_pipeline(sp);
  // rank 0: F [3, 13] with TP [7, 9], B [43, 63] with TP [52, 54];
  // rank 1: F [13, 23] with TP [17, 19], B [23, 43] with TP [32, 34]; step 63.
  EXPECT_EQ(tl.step_time, 63.0);
  EXPECT_EQ(tl.compute_free.offset, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(tl.compute_free.start, (std::vector<double>{0, 7, 13, 52, 0, 17, 32, 43}));
  EXPECT_EQ(tl.compute_free.end, (std::vector<double>{3, 9, 43, 54, 13, 19, 34, 63}));
  EXPECT_EQ(tl.link_free.offset, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(tl.link_free.start, (std::vector<double>{3, 9, 54, 3, 19, 34}));
  EXPECT_EQ(tl.link_free.end, (std::vector<double>{7, 52, 63, 17, 32, 63}));
}

TEST(Pipeline, OneFOneBRefusesBadCountsAndTablesOverTheLimit) {
  PipelineSpec sp;
  sp.ranks = 0;
  sp.microbatches = 4;
  EXPECT_THROW(fill_one_f_one_b(sp), std::invalid_argument);
  sp.ranks = 4;
  sp.microbatches = -1;
  EXPECT_THROW(fill_one_f_one_b(sp), std::invalid_argument);
  sp.microbatches = 1'000'000;
  try {
    fill_one_f_one_b(sp);
    FAIL() << "a table of 8000000 actions was built";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "table: 8000000, more than the limit of 4000000 (LIMITS['actions'])");
  }
}

}  // namespace
}  // namespace pybubble
