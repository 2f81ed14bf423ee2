#include "without_gil.h"

#include <stdexcept>

namespace py = pybind11;

namespace {
// The main thread's ident, read once (it never changes).
unsigned long main_thread_ident() {
  static const unsigned long ident =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  return ident;
}
}  // namespace

SignalWatch::SignalWatch() : main_thread_(PyThread_get_thread_ident() == main_thread_ident()) {}

bool SignalWatch::hook(void* self) {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return false;
  static_cast<SignalWatch*>(self)->error_.emplace();  // takes the raised exception
  return true;
}

void SignalWatch::rethrow() {
  if (error_) throw *error_;
  throw std::runtime_error("cancelled without a Python exception");
}
