#include "pybubble/cancel.h"

namespace pybubble {
namespace {
thread_local CancelHook current_hook = nullptr;
thread_local void* current_state = nullptr;
}  // namespace

namespace cancel_detail {
thread_local int64_t budget = kCancelPollWork;

void ask() {
  budget = kCancelPollWork;
  if (current_hook != nullptr && current_hook(current_state)) throw Cancelled();
}
}  // namespace cancel_detail

CancelScope::CancelScope(CancelHook hook, void* state)
    : hook_(hook), state_(state), outer_hook_(current_hook), outer_state_(current_state) {
  current_hook = hook_;
  current_state = state_;
  cancel_detail::budget = kCancelPollWork;
}

CancelScope::~CancelScope() {
  current_hook = outer_hook_;
  current_state = outer_state_;
}

}  // namespace pybubble
