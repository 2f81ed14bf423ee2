#include "arrays.h"
#include "pybubble/synthetic.h"
#include "register.h"

namespace py = pybind11;

void register_synthetic(py::module_& m) {
  m.def(
      "synthetic_problem",
      [](int32_t stages, int32_t lanes_per_stage, int32_t microbatches, int32_t encoder_layers,
         int32_t kernels_per_layer, double llm_fwd, double llm_bwd, int32_t tp_gaps_per_op, double tp_gap,
         double encoder_scale, double jitter, uint64_t seed) {
        pybubble::SyntheticSpec s;
        s.stages = stages;
        s.lanes_per_stage = lanes_per_stage;
        s.microbatches = microbatches;
        s.encoder_layers = encoder_layers;
        s.kernels_per_layer = kernels_per_layer;
        s.llm_fwd = llm_fwd;
        s.llm_bwd = llm_bwd;
        s.tp_gaps_per_op = tp_gaps_per_op;
        s.tp_gap = tp_gap;
        s.encoder_scale = encoder_scale;
        s.jitter = jitter;
        s.seed = seed;
        return pybubble::Problem(pybubble::synthetic_problem(s));
      },
      py::arg("stages"), py::arg("lanes_per_stage"), py::arg("microbatches"), py::arg("encoder_layers"),
      py::arg("kernels_per_layer"), py::arg("llm_fwd"), py::arg("llm_bwd"), py::arg("tp_gaps_per_op"),
      py::arg("tp_gap"), py::arg("encoder_scale"), py::arg("jitter"), py::arg("seed"),
      "A generated 1F1B problem with TP gaps and a ViT-like encoder (see pybubble.problems).");
}
