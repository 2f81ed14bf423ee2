// Cancelling long work: the core polls a hook every so often (about every million units of work),
// so that a caller can stop it, e.g. the bindings on Ctrl-C while the GIL is released.
#pragma once

#include <cstdint>
#include <exception>

namespace pybubble {

/// Asked every so often by long work in this thread: returns true to cancel it.
using CancelHook = bool (*)(void* state);

/// Thrown by poll_cancel when the hook asks to cancel. Whatever the work built is released.
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "cancelled"; }
};

/// Installs `hook` (with `state`) for the work this thread runs while the scope lives; the scope
/// before it comes back when it ends. A null hook never cancels.
class CancelScope {
 public:
  CancelScope(CancelHook hook, void* state);
  ~CancelScope();
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  CancelHook hook_;
  void* state_;
  CancelHook outer_hook_;
  void* outer_state_;
};

namespace cancel_detail {
/// Work left before the next question to the hook.
extern thread_local int64_t budget;
/// Asks the hook (resets the budget); throws Cancelled when it says so.
void ask();
}  // namespace cancel_detail

/// Counts `work` units of work done (e.g. actions simulated, tasks placed) and asks this thread's
/// hook every kCancelPollWork units; throws Cancelled when it asks to cancel. Cheap: one
/// thread-local subtraction.
inline void poll_cancel(int64_t work = 1) {
  if ((cancel_detail::budget -= work) < 0) cancel_detail::ask();
}

/// Units of work between two questions to the hook: a few milliseconds of the core's work.
constexpr int64_t kCancelPollWork = 1 << 20;

}  // namespace pybubble
