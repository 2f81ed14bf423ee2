#include <memory>
#include <mutex>

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

// The core's ReplicaScheduler, and the memory of the start rows it hands to NumPy (the bulk of a
// result: replicas x tasks): a buffer whose arrays Python has all released is reused by the next
// run, so that a step's rows are written to memory already mapped rather than to fresh pages.
struct Replicas {
  std::unique_ptr<ReplicaScheduler> core;
  std::mutex running;  // one run at a time: the core's schedulers are reused by each
  std::vector<std::shared_ptr<std::vector<double>>> rows;  // each shared with the arrays viewing it
  static constexpr size_t kKept = 4;                        // buffers kept for reuse

  // A buffer no array views (the GIL held: arrays are released only under it).
  std::shared_ptr<std::vector<double>> free_rows() {
    for (const auto& b : rows) {
      if (b.use_count() == 1) return b;
    }
    auto b = std::make_shared<std::vector<double>>();
    if (rows.size() < kKept) rows.push_back(b);
    return b;
  }
};

// `rows` x `cols` of `buffer` as a NumPy array that shares the buffer (kept alive by the array).
py::array_t<double> shared_rows(const std::shared_ptr<std::vector<double>>& buffer, int64_t rows, int64_t cols) {
  auto* keep = new std::shared_ptr<std::vector<double>>(buffer);
  py::capsule release(keep, [](void* p) { delete static_cast<std::shared_ptr<std::vector<double>>*>(p); });
  return py::array_t<double>({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)}, buffer->data(), release);
}

}  // namespace

void register_replicas(py::module_& m) {
  py::class_<Replicas>(m, "ReplicaScheduler",
                       "Reschedules one problem for many data-parallel replicas, over threads in the core.")
      .def(py::init([](py::handle problem, py::handle threads, py::handle policy, bool fixed_assignment) {
             const Problem& p = read_bound<Problem>(problem, "problem", "_core.Problem");
             const int32_t n = read_int<int32_t>(threads, "threads");
             const auto pol = pybubble::parse_policy(read_text(policy, "policy"));
             auto out = std::make_unique<Replicas>();
             // Finding the twin lanes and building one copy's problem: plain C++ over the problem.
             out->core = without_gil([&] { return std::make_unique<ReplicaScheduler>(p, n, pol, fixed_assignment); });
             return out;
           }),
           py::arg("problem"), py::arg("threads") = 1, py::arg("policy") = "greedy", py::kw_only(),
           py::arg("fixed_assignment") = true, py::keep_alive<1, 2>())
      .def_property_readonly("copies", [](const Replicas& self) { return self.core->copies(); })
      .def_property_readonly("threads", [](const Replicas& self) { return self.core->threads(); })
      .def(
          "run",
          [](Replicas& self, py::handle scale) {
            int64_t rows = 0;
            const std::vector<double> s =
                read_rows(scale, "scale", self.core->microbatches(), {pybubble::kMaxReplicas, "replicas"}, rows);
            const std::shared_ptr<std::vector<double>> buffer = self.free_rows();
            ReplicaSchedules out;
            out.start.swap(*buffer);
            // Scheduling touches no Python object: other threads run meanwhile.
            try {
              without_gil([&] {
                const std::lock_guard<std::mutex> one(self.running);
                self.core->run(s.data(), rows, out);
              });
            } catch (...) {
              buffer->swap(out.start);
              throw;
            }
            buffer->swap(out.start);
            const int64_t tasks = out.tasks, m = out.microbatches;
            return py::make_tuple(shared_rows(buffer, rows, tasks),
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
