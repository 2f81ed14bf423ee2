#include "arrays.h"
#include "pybubble/limits.h"
#include "pybubble/pipeline.h"
#include "register.h"
#include "without_gil.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace py = pybind11;
using pybubble::PipelineSpec;
using pybubble::PipelineTimeline;

namespace {

// Readers of the spec's arguments, with their limits (limits.h).
template <typename T>
std::vector<T> actions(py::handle v, const std::string& name) {
  return read_array<T>(v, name, {pybubble::kMaxActions, "actions"});
}
std::vector<int64_t> row_offsets(py::handle v, const std::string& name) {
  return read_array<int64_t>(v, name, {pybubble::kMaxStages, "stages", 1});
}
// One cost per (rank, chunk): a table holds a forward and a backward of each, so as many as half
// its actions.
std::vector<double> costs(py::handle v, const std::string& name) {
  return read_array<double>(v, name, {pybubble::kMaxActions / 2, "actions"});
}

// The spec's fields, each once: X(field, reader). Its arguments in Python carry the same names.
#define PYBUBBLE_SPEC_FIELDS(X)       \
  X(ranks, read_int<int32_t>)         \
  X(chunks, read_int<int32_t>)        \
  X(microbatches, read_int<int32_t>)  \
  X(row_offset, row_offsets)          \
  X(stage, actions<int32_t>)          \
  X(kind, actions<uint8_t>)           \
  X(microbatch, actions<int32_t>)     \
  X(fwd, costs)                       \
  X(bwd, costs)                       \
  X(wgrad, costs)                     \
  X(p2p, read_float)                  \
  X(tp_count, read_int<int32_t>)      \
  X(tp_duration, read_float)          \
  X(dp_allgather, read_float)         \
  X(dp_reducescatter, read_float)

// The spec from keyword arguments: every field required, no other name taken.
PipelineSpec read_spec(const py::kwargs& kw) {
  static const char* const names[] = {
#define PYBUBBLE_NAME(field, reader) #field,
      PYBUBBLE_SPEC_FIELDS(PYBUBBLE_NAME)
#undef PYBUBBLE_NAME
  };
  for (const auto& item : kw) {
    const std::string key = py::str(item.first);
    if (std::none_of(std::begin(names), std::end(names), [&](const char* n) { return key == n; })) {
      throw py::value_error(pybubble::quote_capped(key) + ": not an argument of the simulation");
    }
  }
  PipelineSpec sp;
#define PYBUBBLE_READ(field, reader)                                                 \
  if (!kw.contains(#field)) throw py::value_error(#field ": missing");               \
  sp.field = reader(kw[#field], #field);
  PYBUBBLE_SPEC_FIELDS(PYBUBBLE_READ)
#undef PYBUBBLE_READ
  return sp;
}

// The timeline's arrays, each once; Python reads them by these names (pybubble.timeline).
#define PYBUBBLE_TIMELINE_ARRAYS(X)                                                                    \
  X(op_rank) X(op_chunk) X(op_stage) X(op_kind) X(op_microbatch) X(op_start) X(op_end) X(bubble_rank) \
  X(bubble_kind) X(bubble_start) X(bubble_end) X(forward_needed) X(grad_ready)

// The timeline as a dict of NumPy arrays that take over its vectors (no copy).
py::dict timeline_dict(PipelineTimeline&& tl) {
  py::dict d;
  d["step_time"] = tl.step_time;
#define PYBUBBLE_MOVE(field) d[#field] = to_array(std::move(tl.field));
  PYBUBBLE_TIMELINE_ARRAYS(PYBUBBLE_MOVE)
#undef PYBUBBLE_MOVE
  for (auto [name, w] : {std::pair{"compute_free", &tl.compute_free}, std::pair{"link_free", &tl.link_free}}) {
    d[(std::string(name) + "_offset").c_str()] = to_array(std::move(w->offset));
    d[(std::string(name) + "_start").c_str()] = to_array(std::move(w->start));
    d[(std::string(name) + "_end").c_str()] = to_array(std::move(w->end));
  }
  return d;
}

}  // namespace

void register_pipeline(py::module_& m) {
  m.def(
      "one_f_one_b",
      [](py::handle ranks, py::handle microbatches) {
        PipelineSpec sp;
        sp.ranks = read_int<int32_t>(ranks, "ranks");
        sp.microbatches = read_int<int32_t>(microbatches, "microbatches");
        pybubble::fill_one_f_one_b(sp);
        return py::make_tuple(to_array(std::move(sp.row_offset)), to_array(std::move(sp.stage)),
                              to_array(std::move(sp.kind)), to_array(std::move(sp.microbatch)));
      },
      py::arg("ranks"), py::arg("microbatches"),
      "The 1F1B table of `ranks` ranks and `microbatches` microbatches as (row_offset, stage, kind, "
      "microbatch) arrays (the table the generated problems use).");
  m.def(
      "simulate_pipeline",
      [](const py::kwargs& kw) {
        const PipelineSpec sp = read_spec(kw);
        // Pure C++ on data copied out of Python objects: other threads may run meanwhile.
        return timeline_dict(without_gil([&] { return pybubble::simulate_pipeline(sp); }));
      },
      "Simulates an action table (keyword arguments: ranks, chunks, microbatches, row_offset, stage, kind, "
      "microbatch, fwd, bwd, wgrad, p2p, tp_count, tp_duration, dp_allgather, dp_reducescatter); returns the "
      "timeline as flat arrays (see pybubble.timeline).");
  m.def(
      "simulate_pipeline_seconds",
      [](py::handle repeat, const py::kwargs& kw) {
        const int32_t runs = read_int<int32_t>(repeat, "repeat");
        if (runs < 1) throw py::value_error("repeat: " + pybubble::format_number(runs) + " is < 1");
        const PipelineSpec sp = read_spec(kw);
        std::vector<double> seconds(static_cast<size_t>(runs));
        without_gil([&] {  // timing plain C++
          for (double& s : seconds) {
            // As BM_SimulateInterleaved: the timeline's memory is taken and given back each run.
            const auto t0 = std::chrono::steady_clock::now();
            pybubble::simulate_pipeline(sp);
            s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          }
        });
        std::sort(seconds.begin(), seconds.end());
        return seconds[seconds.size() / 2];
      },
      py::arg("repeat"),
      "The median seconds of `repeat` simulations of the same spec in C++ (the arguments of "
      "simulate_pipeline), for the benchmark's ratio of the Python call to the core.");
}
