#include "arrays.h"
#include "pybubble/balance.h"
#include "pybubble/limits.h"
#include "register.h"
#include "without_gil.h"

namespace py = pybind11;

namespace {
// The costs: an N x 2 array (encoder cost, LLM cost per sample); `n` receives N.
std::vector<double> read_costs(py::handle costs, int64_t& n) {
  return read_rows(costs, "costs", 2, {pybubble::kMaxSamples, "samples"}, n);
}
}  // namespace

void register_balance(py::module_& m) {
  m.def(
      "balance_microbatches",
      [](py::handle costs, py::handle num_microbatches) {
        int64_t n = 0;
        const std::vector<double> c = read_costs(costs, n);
        const int64_t mb = read_int<int64_t>(num_microbatches, "num_microbatches");
        // Plain C++ over copied arrays.
        return to_array(without_gil([&] { return pybubble::balance_microbatches(c.data(), n, mb); }));
      },
      py::arg("costs"), py::arg("num_microbatches"));
  m.def(
      "balance_lower_bound",
      [](py::handle costs, py::handle num_microbatches) {
        int64_t n = 0;
        const std::vector<double> c = read_costs(costs, n);
        return pybubble::balance_lower_bound(c.data(), n, read_int<int64_t>(num_microbatches, "num_microbatches"));
      },
      py::arg("costs"), py::arg("num_microbatches"));
  m.def(
      "max_microbatch_cost",
      [](py::handle costs, py::handle assignment, py::handle num_microbatches) {
        int64_t n = 0;
        const std::vector<double> c = read_costs(costs, n);
        const std::vector<int64_t> a = read_array<int64_t>(assignment, "assignment", {pybubble::kMaxSamples, "samples"});
        if (static_cast<int64_t>(a.size()) != n) {
          throw py::value_error("assignment: " + pybubble::format_number(a.size()) + " entries for " +
                                pybubble::format_number(n) + " samples");
        }
        return pybubble::max_microbatch_cost(c.data(), n, a.data(), read_int<int64_t>(num_microbatches, "num_microbatches"));
      },
      py::arg("costs"), py::arg("assignment"), py::arg("num_microbatches"));
}
