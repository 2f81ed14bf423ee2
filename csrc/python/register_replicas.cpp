#include <memory>

#include "arrays.h"
#include "pybubble/limits.h"
#include "pybubble/replicas.h"
#include "pybubble/twins.h"
#include "register.h"
#include "without_gil.h"

namespace py = pybind11;
using pybubble::Problem;
using pybubble::ReplicaScheduler;
using pybubble::ReplicaSchedules;

namespace {

// `v` as a NumPy array of `rows` x `cols` without copying: the array owns the vector's buffer.
template <typename T>
py::array_t<T> rows_array(std::vector<T>&& v, int64_t rows, int64_t cols) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)}, owned->data(), free_when_done);
}

}  // namespace

void register_replicas(py::module_& m) {
  py::class_<ReplicaScheduler>(m, "ReplicaScheduler",
                               "Reschedules one problem for many data-parallel replicas, over threads in the core.")
      .def(py::init([](py::handle problem, py::handle threads, py::handle policy, bool fixed_assignment) {
             const Problem& p = read_bound<Problem>(problem, "problem", "_core.Problem");
             const int32_t n = read_int<int32_t>(threads, "threads");
             const auto pol = pybubble::parse_policy(read_text(policy, "policy"));
             // Finding the twin lanes and building one copy's problem: plain C++ over the problem.
             return without_gil([&] { return std::make_unique<ReplicaScheduler>(p, n, pol, fixed_assignment); });
           }),
           py::arg("problem"), py::arg("threads") = 1, py::arg("policy") = "greedy", py::kw_only(),
           py::arg("fixed_assignment") = true, py::keep_alive<1, 2>())
      .def_property_readonly("copies", &ReplicaScheduler::copies)
      .def_property_readonly("threads", &ReplicaScheduler::threads)
      .def(
          "run",
          [](ReplicaScheduler& self, py::handle scale) {
            int64_t rows = 0;
            const std::vector<double> s =
                read_rows(scale, "scale", self.microbatches(), {pybubble::kMaxReplicaTasks, "replica_tasks"}, rows);
            ReplicaSchedules out;
            // Scheduling touches no Python object: other threads run meanwhile.
            without_gil([&] { self.run(s.data(), rows, out); });
            const int64_t tasks = out.tasks, m = out.microbatches;
            return py::make_tuple(rows_array(std::move(out.start), rows, tasks),
                                  rows_array(std::move(out.assignment), rows, m), to_array(std::move(out.step_time)),
                                  to_array(std::move(out.shift_front)), to_array(std::move(out.shift_back)),
                                  to_array(std::move(out.seconds)));
          },
          py::arg("scale"),
          "Returns (start: replicas x tasks / copies, assignment: replicas x microbatches, step_time, shift_front, "
          "shift_back, seconds), one entry per replica each.");
  m.def(
      "twin_copies",
      [](py::handle problem) {
        const Problem& p = read_bound<Problem>(problem, "problem", "_core.Problem");
        return without_gil([&] { return pybubble::twin_copies(p); });
      },
      py::arg("problem"), "The most copies of one problem `problem` is made of, twin lanes task by task (1: none).");
}
