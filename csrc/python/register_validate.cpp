#include <pybind11/stl.h>

#include "arrays.h"
#include "pybubble/validate.h"
#include "register.h"

namespace py = pybind11;

void register_validate(py::module_& m) {
  m.def(
      "validate",
      [](const pybubble::Problem& p, const carray<double>& start, const carray<int64_t>& assignment,
         double step_time, double shift_front, double shift_back) {
        pybubble::Schedule s;
        s.start = to_vector(start);
        s.assignment = to_vector(assignment);
        s.step_time = step_time;
        s.shift_front = shift_front;
        s.shift_back = shift_back;
        // Pure C++ over copied arrays: no Python object is touched.
        py::gil_scoped_release release;
        return pybubble::validate(p, s);
      },
      py::arg("problem"), py::arg("start"), py::arg("assignment"), py::arg("step_time"),
      py::arg("shift_front"), py::arg("shift_back"),
      "Every violation of the schedule against the problem, as sentences (empty: valid).");
  m.attr("TIME_TOLERANCE") = pybubble::kTimeTolerance;
}
