#include <pybind11/stl.h>

#include "arrays.h"
#include "pybubble/limits.h"
#include "pybubble/validate.h"
#include "register.h"
#include "without_gil.h"

namespace py = pybind11;

void register_validate(py::module_& m) {
  m.def(
      "validate",
      [](py::handle problem, py::handle start, py::handle assignment, py::handle step_time,
         py::handle shift_front, py::handle shift_back) {
        const auto& p = read_bound<pybubble::Problem>(problem, "problem", "_core.Problem");
        const pybubble::Schedule s = read_schedule(start, assignment, step_time, shift_front, shift_back);
        // Pure C++ over copied arrays: no Python object is touched.
        return without_gil([&] { return pybubble::validate(p, s); });
      },
      py::arg("problem"), py::arg("start"), py::arg("assignment"), py::arg("step_time"),
      py::arg("shift_front"), py::arg("shift_back"),
      "Every violation of the schedule against the problem, as sentences (empty: valid).");
  m.attr("TIME_TOLERANCE") = pybubble::kTimeTolerance;
}
