#include <memory>

#include "arrays.h"
#include "pybubble/synthetic.h"
#include "register.h"
#include "without_gil.h"

namespace py = pybind11;

namespace {
// The spec's fields, each once: X(field, reader). Its arguments in Python carry the same names.
#define PYBUBBLE_SYNTHETIC_FIELDS(X)     \
  X(stages, read_int<int32_t>)           \
  X(lanes_per_stage, read_int<int32_t>)  \
  X(twin_lanes, read_int<int32_t>)       \
  X(microbatches, read_int<int32_t>)     \
  X(encoder_layers, read_int<int32_t>)   \
  X(kernels_per_layer, read_int<int32_t>) \
  X(llm_fwd, read_float)                 \
  X(llm_bwd, read_float)                 \
  X(tp_gaps_per_op, read_int<int32_t>)   \
  X(tp_gap, read_float)                  \
  X(encoder_scale, read_float)           \
  X(jitter, read_float)                  \
  X(seed, read_int<uint64_t>)
}  // namespace

void register_synthetic(py::module_& m) {
  m.def(
      "synthetic_problem",
      [](const py::kwargs& kw) {
        pybubble::SyntheticSpec s;
        for (const auto& item : kw) {
          const std::string key = py::str(item.first);
#define PYBUBBLE_READ(field, reader)   \
  if (key == #field) {                 \
    s.field = reader(item.second, key); \
    continue;                          \
  }
          PYBUBBLE_SYNTHETIC_FIELDS(PYBUBBLE_READ)
#undef PYBUBBLE_READ
          throw py::value_error(pybubble::quote_capped(key) + ": not a field of a generated problem");
        }
        // Plain C++ from the spec's numbers.
        return without_gil([&] { return std::make_unique<pybubble::Problem>(pybubble::synthetic_problem(s)); });
      },
      "A generated 1F1B problem with TP gaps and a ViT-like encoder (keyword arguments: stages, "
      "lanes_per_stage, twin_lanes, microbatches, encoder_layers, kernels_per_layer, llm_fwd, llm_bwd, tp_gaps_per_op, "
      "tp_gap, encoder_scale, jitter, seed; those left out keep their defaults; see pybubble.problems).");
}
