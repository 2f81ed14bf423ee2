#include "pybubble/limits.h"
#include "register.h"

namespace py = pybind11;

void register_limits(py::module_& m) {
  // The core's limits (limits.h), for the Python loaders and the docs: the same numbers.
  py::dict limits;
#define PYBUBBLE_EXPORT_LIMIT(constant, name, value, what) limits[name] = pybubble::constant;
  PYBUBBLE_COUNT_LIMITS(PYBUBBLE_EXPORT_LIMIT)
#undef PYBUBBLE_EXPORT_LIMIT
  limits["time"] = pybubble::kMaxTime;
  m.attr("LIMITS") = limits;
}
