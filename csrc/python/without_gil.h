// Long C++ work with the GIL released, and Ctrl-C that still stops it.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "pybubble/cancel.h"

/// What a released call needs to stop on a signal: whether this is the main thread (the only one
/// where Python runs signal handlers) and the exception a handler raised.
class SignalWatch {
 public:
  SignalWatch();
  /// The hook the core polls: takes the GIL for a moment and runs Python's signal handlers; true
  /// (cancel) when one raised, keeping its exception.
  static bool hook(void* self);
  /// Whether the hook is worth installing (this thread runs signal handlers).
  bool main_thread() const { return main_thread_; }
  /// Raises the kept exception (e.g. KeyboardInterrupt) in Python.
  [[noreturn]] void rethrow();

 private:
  bool main_thread_;
  std::optional<pybind11::error_already_set> error_;
};

/// Runs `work` (plain C++ that touches no Python object) with the GIL released so that other
/// threads run meanwhile. In the main thread, a signal whose Python handler raises (Ctrl-C:
/// KeyboardInterrupt) cancels the work within milliseconds (the core polls; see cancel.h) and the
/// exception comes back to the caller.
template <typename Work>
decltype(auto) without_gil(Work&& work) {
  SignalWatch watch;
  pybubble::CancelScope scope(watch.main_thread() ? &SignalWatch::hook : nullptr, &watch);
  try {
    pybind11::gil_scoped_release release;
    return work();
  } catch (const pybubble::Cancelled&) {
    watch.rethrow();
  }
}
