#include <memory>

#include <pybind11/stl.h>

#include "arrays.h"
#include "pybubble/problem.h"
#include "register.h"

namespace py = pybind11;
using pybubble::Problem;
using pybubble::ProblemInput;
using pybubble::WindowSet;

void register_problem(py::module_& m) {
  py::class_<Problem>(m, "Problem", "A checked pybubble.problem/1 held by the core.")
      .def(py::init([](double horizon, int64_t num_lanes, const carray<int64_t>& compute_offset,
                       const carray<double>& compute_start, const carray<double>& compute_end,
                       const carray<int64_t>& link_offset, const carray<double>& link_start,
                       const carray<double>& link_end, const carray<double>& forward_needed,
                       const carray<double>& grad_ready, const carray<int64_t>& lane,
                       const carray<int64_t>& microbatch, const carray<double>& duration,
                       const carray<int64_t>& resource, const carray<int64_t>& phase,
                       const carray<int64_t>& after_offset, const carray<int64_t>& after) {
             ProblemInput in;
             in.horizon = horizon;
             in.num_lanes = num_lanes;
             in.compute_free = {to_vector(compute_offset), to_vector(compute_start), to_vector(compute_end)};
             in.link_free = {to_vector(link_offset), to_vector(link_start), to_vector(link_end)};
             in.forward_needed = to_vector(forward_needed);
             in.grad_ready = to_vector(grad_ready);
             in.lane = to_vector(lane);
             in.microbatch = to_vector(microbatch);
             in.duration = to_vector(duration);
             in.resource = to_vector(resource);
             in.phase = to_vector(phase);
             in.after_offset = to_vector(after_offset);
             in.after = to_vector(after);
             // The checks and indexes are plain C++ over the copied vectors: other threads (the
             // planner's) run meanwhile.
             std::unique_ptr<Problem> out;
             {
               py::gil_scoped_release release;
               out = std::make_unique<Problem>(std::move(in));
             }
             return out;
           }),
           py::arg("horizon"), py::arg("num_lanes"), py::arg("compute_offset"), py::arg("compute_start"),
           py::arg("compute_end"), py::arg("link_offset"), py::arg("link_start"), py::arg("link_end"),
           py::arg("forward_needed"), py::arg("grad_ready"), py::arg("lane"), py::arg("microbatch"),
           py::arg("duration"), py::arg("resource"), py::arg("phase"), py::arg("after_offset"),
           py::arg("after"))
      .def_property_readonly("horizon", &Problem::horizon)
      .def_property_readonly("num_lanes", &Problem::num_lanes)
      .def_property_readonly("num_tasks", &Problem::num_tasks)
      .def_property_readonly("num_microbatches", &Problem::num_microbatches)
      .def("fields", [](const Problem& p) {
        const ProblemInput& f = p.fields();
        py::dict d;
        d["horizon"] = f.horizon;
        d["num_lanes"] = f.num_lanes;
        d["compute_offset"] = to_array(f.compute_free.offset);
        d["compute_start"] = to_array(f.compute_free.start);
        d["compute_end"] = to_array(f.compute_free.end);
        d["link_offset"] = to_array(f.link_free.offset);
        d["link_start"] = to_array(f.link_free.start);
        d["link_end"] = to_array(f.link_free.end);
        d["forward_needed"] = to_array(f.forward_needed);
        d["grad_ready"] = to_array(f.grad_ready);
        d["lane"] = to_array(f.lane);
        d["microbatch"] = to_array(f.microbatch);
        d["duration"] = to_array(f.duration);
        d["resource"] = to_array(f.resource);
        d["phase"] = to_array(f.phase);
        d["after_offset"] = to_array(f.after_offset);
        d["after"] = to_array(f.after);
        return d;
      }, "All fields as NumPy arrays, in the constructor's argument names.");
}
