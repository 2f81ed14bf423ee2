#include <memory>

#include "arrays.h"
#include "pybubble/problem.h"
#include "register.h"
#include "without_gil.h"

namespace py = pybind11;
using pybubble::Problem;
using pybubble::ProblemInput;

namespace {

// The field's name in messages and in Problem.arrays(): "group.name", or "name" at the top level.
std::string field_name(const char* group, const char* name) {
  return *group ? std::string(group) + "." + name : std::string(name);
}

// The object holding `group`'s arrays: `arrays` itself for the top level.
py::object group_of(py::handle arrays, const char* group) {
  return *group ? read_attr(arrays, group, group) : py::reinterpret_borrow<py::object>(arrays);
}

ProblemInput read_problem(py::handle arrays) {
  ProblemInput in;
  in.horizon = read_float(read_attr(arrays, "horizon", "horizon"), "horizon");
#define PYBUBBLE_READ(group, name, type, member, limit, limit_name, extra)                           \
  in.member = read_array<type>(read_attr(group_of(arrays, #group), #name, field_name(#group, #name)), \
                               field_name(#group, #name), {pybubble::limit, limit_name, extra});
  PYBUBBLE_PROBLEM_ARRAYS(PYBUBBLE_READ)
#undef PYBUBBLE_READ
  // One offset per lane plus one, the same count for both resources.
  if (in.compute_free.offset.empty()) {
    throw py::value_error("compute_free.offset: empty; it holds num_lanes + 1 entries, from 0");
  }
  if (in.link_free.offset.size() != in.compute_free.offset.size()) {
    throw py::value_error("link_free.offset: " + pybubble::format_number(in.link_free.offset.size()) +
                          " entries, compute_free.offset has " +
                          pybubble::format_number(in.compute_free.offset.size()) + " (num_lanes + 1 each)");
  }
  in.num_lanes = static_cast<int64_t>(in.compute_free.offset.size()) - 1;
  return in;
}

// The tasks of `tasks` (a Python object with the attributes lane, microbatch, resource, phase,
// after_offset, after and duration, e.g. a pybubble Tasks), named "tasks.<name>" in messages.
ProblemInput read_tasks(py::handle tasks) {
  ProblemInput in;
  const std::string group = "tasks";
#define PYBUBBLE_READ_TASKS(grp, name, type, member, limit, limit_name, extra)                            \
  if (group == #grp) {                                                                                    \
    in.member = read_array<type>(read_attr(tasks, #name, field_name(#grp, #name)), field_name(#grp, #name), \
                                 {pybubble::limit, limit_name, extra});                                   \
  }
  PYBUBBLE_PROBLEM_ARRAYS(PYBUBBLE_READ_TASKS)
#undef PYBUBBLE_READ_TASKS
  return in;
}

py::dict write_problem(const Problem& p) {
  const ProblemInput& f = p.fields();
  py::dict out;
  out["horizon"] = f.horizon;
  auto group_dict = [&out](const char* group) -> py::dict {
    if (!*group) return out;
    if (!out.contains(group)) out[group] = py::dict();
    return out[group].cast<py::dict>();
  };
#define PYBUBBLE_WRITE(group, name, type, member, limit, limit_name, extra) group_dict(#group)[#name] = to_array(f.member);
  PYBUBBLE_PROBLEM_ARRAYS(PYBUBBLE_WRITE)
#undef PYBUBBLE_WRITE
  // The windows are the problem's own (fields() leaves them out: they may be shared).
  for (int r = 0; r < 2; ++r) {
    const pybubble::WindowSet& w = p.windows(r);
    py::dict d = out[r == pybubble::kCompute ? "compute_free" : "link_free"].cast<py::dict>();
    d["offset"] = to_array(w.offset);
    d["start"] = to_array(w.start);
    d["end"] = to_array(w.end);
  }
  return out;
}

}  // namespace

void register_problem(py::module_& m) {
  py::class_<Problem>(m, "Problem", "A checked pybubble.problem/1 held by the core.")
      .def(py::init([](py::handle arrays) {
             ProblemInput in = read_problem(arrays);
             // The checks and indexes are plain C++ over the copied vectors: other threads (the
             // planner's) run meanwhile.
             return without_gil([&] { return std::make_unique<Problem>(std::move(in)); });
           }),
           py::arg("arrays"),
           "Checks and holds a problem: `arrays` has a float `horizon`, `compute_free` and `link_free` (each "
           "with `offset`, `start`, `end`), `forward_needed`, `grad_ready` and `tasks` (`lane`, `microbatch`, "
           "`resource`, `phase`, `after_offset`, `after`, `duration`) as attributes.")
      .def_property_readonly("horizon", &Problem::horizon)
      .def_property_readonly("num_lanes", &Problem::num_lanes)
      .def_property_readonly("num_tasks", &Problem::num_tasks)
      .def_property_readonly("num_microbatches", &Problem::num_microbatches)
      .def(
          "with_tasks",
          [](const Problem& self, py::handle tasks) {
            ProblemInput in = read_tasks(tasks);
            return without_gil([&] { return std::make_unique<Problem>(self, std::move(in)); });
          },
          py::arg("tasks"),
          "A problem on this one's bubbles (horizon, lanes, windows, microbatches: shared, not copied or checked "
          "again) with the tasks of `tasks` (`lane`, `microbatch`, `resource`, `phase`, `after_offset`, `after`, "
          "`duration` as attributes), checked as the constructor checks them.")
      .def(
          "joined",
          [](const Problem& self, py::handle blocks, py::handle counts) {
            if (!py::isinstance<py::sequence>(blocks) || py::isinstance<py::str>(blocks)) {
              throw py::value_error("blocks: not a list of _core.Problem");
            }
            std::vector<const Problem*> bs;
            for (size_t b = 0; b < py::len(blocks); ++b) {
              bs.push_back(&read_bound<Problem>(blocks[py::int_(b)], "blocks[" + std::to_string(b) + "]",
                                                "_core.Problem"));
            }
            std::vector<int64_t> cs =
                read_array<int64_t>(counts, "counts", {pybubble::kMaxMicrobatches, "microbatches"});
            return without_gil([&] { return std::make_unique<Problem>(self, bs, cs); });
          },
          py::arg("blocks"), py::arg("counts"),
          "A problem on this one's bubbles whose tasks are `blocks` (problems made with_tasks of these bubbles, "
          "every task of microbatch 0) one after another, block b repeated counts[b] times, each copy a "
          "microbatch of its own numbered from 0: the blocks' checked tasks copied, not checked again.")
      .def(
          "longest_paths",
          [](const Problem& self) {
            const auto b = without_gil([&] { return pybubble::longest_paths(self); });
            return py::make_tuple(b[0], b[1], b[2], b[3]);
          },
          "The longest dependency paths by duration through the forward tasks and through the backward tasks "
          "(predecessors of the other phase do not count): (forward, backward, forward compute, backward "
          "compute), the last two counting compute tasks only.")
      .def("arrays", [](const Problem& p) { return write_problem(p); },
           "The problem's arrays as a nested dict with the constructor's names ({'horizon': float, "
           "'compute_free': {'offset', 'start', 'end'}, 'link_free': {...}, 'forward_needed', 'grad_ready', "
           "'tasks': {...}}).");
}
