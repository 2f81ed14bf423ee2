#include "arrays.h"
#include "pybubble/balance.h"
#include "register.h"

namespace py = pybind11;

namespace {
const double* costs_of(const carray<double>& costs, int64_t& n) {
  if (costs.ndim() != 2 || costs.shape(1) != 2) {
    throw py::value_error("costs: expected an N x 2 array (encoder cost, LLM cost per sample)");
  }
  n = costs.shape(0);
  return costs.data();
}
}  // namespace

void register_balance(py::module_& m) {
  m.def(
      "balance_microbatches",
      [](const carray<double>& costs, int64_t num_microbatches) {
        int64_t n = 0;
        const double* c = costs_of(costs, n);
        std::vector<int64_t> out;
        {
          py::gil_scoped_release release;  // plain C++ over the array's buffer
          out = pybubble::balance_microbatches(c, n, num_microbatches);
        }
        return to_array(out);
      },
      py::arg("costs"), py::arg("num_microbatches"));
  m.def(
      "balance_lower_bound",
      [](const carray<double>& costs, int64_t num_microbatches) {
        int64_t n = 0;
        const double* c = costs_of(costs, n);
        return pybubble::balance_lower_bound(c, n, num_microbatches);
      },
      py::arg("costs"), py::arg("num_microbatches"));
  m.def(
      "max_microbatch_cost",
      [](const carray<double>& costs, const carray<int64_t>& assignment, int64_t num_microbatches) {
        int64_t n = 0;
        const double* c = costs_of(costs, n);
        if (assignment.ndim() != 1 || assignment.shape(0) != n) {
          throw py::value_error("assignment: expected one entry per sample");
        }
        return pybubble::max_microbatch_cost(c, n, assignment.data(), num_microbatches);
      },
      py::arg("costs"), py::arg("assignment"), py::arg("num_microbatches"));
}
