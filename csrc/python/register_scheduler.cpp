#include <pybind11/stl.h>

#include <memory>
#include <string>


#include "arrays.h"
#include "pybubble/limits.h"
#include "pybubble/scheduler.h"
#include "register.h"
#include "without_gil.h"

namespace py = pybind11;
using pybubble::Problem;
using pybubble::Scheduler;

namespace {
py::tuple as_tuple(const pybubble::Schedule& s) {
  return py::make_tuple(to_array(s.start), to_array(s.assignment), s.step_time, s.shift_front, s.shift_back);
}
}  // namespace

void register_scheduler(py::module_& m) {
  py::class_<Scheduler>(m, "Scheduler", "Schedules one problem, again and again with new durations.")
      .def(py::init([](py::handle problem) {
             const Problem& p = read_bound<Problem>(problem, "problem", "_core.Problem");
             // Its indexes and buffers are plain C++ over the problem: other threads run meanwhile.
             return without_gil([&] { return std::make_unique<Scheduler>(p); });
           }),
           py::arg("problem"), py::keep_alive<1, 2>())
      .def(
          "run",
          [](Scheduler& self, py::handle policy, py::handle durations, bool fixed_assignment, py::handle orders) {
            const auto pol = pybubble::parse_policy(read_text(policy, "policy"));
            const int64_t mask = read_int<int64_t>(orders, "orders");
            if (mask < 1 || mask > Scheduler::kAllOrders) {  // run() says so too; checked here before the cast
              throw py::value_error("orders: " + std::to_string(mask) + " is not a mask of the holes orders (1.." +
                                    std::to_string(Scheduler::kAllOrders) + ")");
            }
            std::vector<double> d;
            if (!durations.is_none()) d = read_array<double>(durations, "durations", {pybubble::kMaxTasks, "tasks"});
            // Scheduling touches no Python object: other threads run meanwhile.
            const pybubble::Schedule& out =
                without_gil([&]() -> const pybubble::Schedule& { return self.run(pol, durations.is_none() ? nullptr : &d, fixed_assignment, static_cast<unsigned>(mask)); });
            return as_tuple(out);
          },
          py::arg("policy") = "greedy", py::arg("durations") = py::none(), py::kw_only(),
          py::arg("fixed_assignment") = false, py::arg("orders") = static_cast<int64_t>(Scheduler::kAllOrders),
          "`orders`: the holes filler's orders to try, bit i for order i. Returns (start, assignment, step_time, shift_front, shift_back).")
      .def(
          "justify",
          [](Scheduler& self, py::handle start, py::handle assignment, py::handle step_time, py::handle shift_front,
             py::handle shift_back) {
            const pybubble::Schedule s = read_schedule(start, assignment, step_time, shift_front, shift_back);
            // Pure C++ over copied arrays: no Python object is touched.
            const pybubble::Schedule& out = without_gil([&]() -> const pybubble::Schedule& { return self.justify(s); });
            return as_tuple(out);
          },
          py::arg("start"), py::arg("assignment"), py::arg("step_time"), py::arg("shift_front"), py::arg("shift_back"),
          "The schedule justified: each phase's tasks packed away from the end of the step it grows and back "
          "(never longer). ValueError when it is not a valid schedule of the problem. Returns (start, assignment, "
          "step_time, shift_front, shift_back).")
      .def_property_readonly("holes_order", &Scheduler::holes_order,
                             "The holes order (0-4) that gave the last run's schedule; -1 after another policy.");
  m.attr("HOLES_ORDERS") = Scheduler::kHolesOrders;
  m.def(
      "first_fit_floor",
      [](py::handle problem) {
        const Problem& p = read_bound<Problem>(problem, "problem", "_core.Problem");
        std::vector<double> start;
        without_gil([&] { return pybubble::first_fit_floor(p, start); });  // plain C++ over the problem's arrays
        return to_array(std::move(start));
      },
      py::arg("problem"),
      "The scheduler's speed floor: one first-fit pass over the same tasks and windows (not a valid "
      "schedule); returns the starts.");
}
