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
  m.def(
      "balance_replicas",
      [](py::handle image_cost, py::handle image_owner, py::handle replicas, py::handle image_slot) {
        const MaxEntries most{pybubble::kMaxSamples, "samples"};
        const std::vector<double> cost = read_array<double>(image_cost, "image_cost", most);
        const std::vector<int64_t> owner = read_array<int64_t>(image_owner, "image_owner", most);
        std::vector<int64_t> slot;
        if (!image_slot.is_none()) slot = read_array<int64_t>(image_slot, "image_slot", most);
        const auto same_size = [&](const char* name, size_t size) {
          if (size != cost.size()) {
            throw py::value_error(std::string(name) + ": " + pybubble::format_number(size) + " entries for " +
                                  pybubble::format_number(cost.size()) + " images");
          }
        };
        same_size("image_owner", owner.size());
        if (!image_slot.is_none()) same_size("image_slot", slot.size());
        const int64_t r = read_int<int64_t>(replicas, "replicas");
        // Plain C++ over copied arrays.
        std::vector<int64_t> moves = without_gil([&] {
          return pybubble::balance_replicas(cost.data(), owner.data(), image_slot.is_none() ? nullptr : slot.data(),
                                            static_cast<int64_t>(cost.size()), r);
        });
        const int64_t rows = static_cast<int64_t>(moves.size()) / 3;
        return to_array(std::move(moves)).reshape({rows, int64_t{3}});
      },
      py::arg("image_cost"), py::arg("image_owner"), py::arg("replicas"), py::arg("image_slot") = py::none(),
      "Moves (image, from, to) of encoder work between replicas, one row each (see balance.h).");
}
