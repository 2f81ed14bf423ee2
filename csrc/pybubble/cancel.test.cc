#include "pybubble/cancel.h"

#include <gtest/gtest.h>

#include "pybubble/pipeline.h"

namespace pybubble {
namespace {

TEST(Cancel, LongWorkAsksTheHookAndStops) {
  int asked = 0;
  auto hook = [](void* state) { return ++*static_cast<int*>(state) >= 3; };
  CancelScope scope(hook, &asked);
  // 1F1B over 4096 ranks and 64 microbatches: 524,288 actions, with its TP gaps about five
  // questions to the hook, the third cancels.
  PipelineSpec sp;
  sp.ranks = 4096;
  sp.microbatches = 64;
  fill_one_f_one_b(sp);
  sp.fwd.assign(4096, 1.0);
  sp.bwd.assign(4096, 2.0);
  sp.wgrad.assign(4096, 0.0);
  sp.tp_count = 8;  // about 5M units of work in all
  sp.tp_duration = 0.01;
  EXPECT_THROW(simulate_pipeline(sp), Cancelled);
  EXPECT_EQ(asked, 3);
}

TEST(Cancel, NoHookNeverCancelsAndScopesNest) {
  int outer = 0;
  CancelScope a([](void* s) { return ++*static_cast<int*>(s) > 1000000; }, &outer);
  {
    CancelScope b(nullptr, nullptr);
    for (int i = 0; i < 10; ++i) poll_cancel(kCancelPollWork);
  }
  EXPECT_EQ(outer, 0);  // the inner scope has no hook
  poll_cancel(kCancelPollWork + 1);
  EXPECT_EQ(outer, 1);  // the outer hook is back
}

}  // namespace
}  // namespace pybubble
