#include "arrays.h"
#include "pybubble/pipeline.h"
#include "register.h"

#include <utility>

namespace py = pybind11;

void register_pipeline(py::module_& m) {
  m.def(
      "simulate_pipeline",
      [](int32_t ranks, int32_t chunks, int32_t microbatches, const carray<int64_t>& row_offset,
         const carray<int32_t>& stage, const carray<uint8_t>& kind, const carray<int32_t>& microbatch,
         const carray<double>& fwd, const carray<double>& bwd, const carray<double>& wgrad, double p2p,
         int32_t tp_count, double tp_duration, double dp_allgather, double dp_reducescatter) {
        pybubble::PipelineSpec sp;
        sp.ranks = ranks;
        sp.chunks = chunks;
        sp.microbatches = microbatches;
        sp.row_offset = to_vector(row_offset);
        sp.stage = to_vector(stage);
        sp.kind = to_vector(kind);
        sp.microbatch = to_vector(microbatch);
        sp.fwd = to_vector(fwd);
        sp.bwd = to_vector(bwd);
        sp.wgrad = to_vector(wgrad);
        sp.p2p = p2p;
        sp.tp_count = tp_count;
        sp.tp_duration = tp_duration;
        sp.dp_allgather = dp_allgather;
        sp.dp_reducescatter = dp_reducescatter;
        pybubble::PipelineTimeline tl;
        pybubble::FreeWindows free;
        {
          // Pure C++ on data copied out of Python objects: other threads may run meanwhile.
          py::gil_scoped_release release;
          tl = pybubble::simulate_pipeline(sp);
          free = pybubble::free_windows(tl, sp.ranks);
        }
        py::dict d;
        d["step_time"] = tl.step_time;
        d["op_rank"] = to_array(std::move(tl.op_rank));
        d["op_chunk"] = to_array(std::move(tl.op_chunk));
        d["op_stage"] = to_array(std::move(tl.op_stage));
        d["op_kind"] = to_array(std::move(tl.op_kind));
        d["op_microbatch"] = to_array(std::move(tl.op_microbatch));
        d["op_start"] = to_array(std::move(tl.op_start));
        d["op_end"] = to_array(std::move(tl.op_end));
        d["bubble_rank"] = to_array(std::move(tl.bubble_rank));
        d["bubble_kind"] = to_array(std::move(tl.bubble_kind));
        d["bubble_start"] = to_array(std::move(tl.bubble_start));
        d["bubble_end"] = to_array(std::move(tl.bubble_end));
        d["link_busy_rank"] = to_array(std::move(tl.link_busy_rank));
        d["link_busy_start"] = to_array(std::move(tl.link_busy_start));
        d["link_busy_end"] = to_array(std::move(tl.link_busy_end));
        d["forward_needed"] = to_array(std::move(tl.forward_needed));
        d["grad_ready"] = to_array(std::move(tl.grad_ready));
        for (auto [name, w] : {std::pair{"compute_free", &free.compute}, std::pair{"link_free", &free.link}}) {
          d[(std::string(name) + "_offset").c_str()] = to_array(std::move(w->offset));
          d[(std::string(name) + "_start").c_str()] = to_array(std::move(w->start));
          d[(std::string(name) + "_end").c_str()] = to_array(std::move(w->end));
        }
        return d;
      },
      py::arg("ranks"), py::arg("chunks"), py::arg("microbatches"), py::arg("row_offset"), py::arg("stage"),
      py::arg("kind"), py::arg("microbatch"), py::arg("fwd"), py::arg("bwd"), py::arg("wgrad"), py::arg("p2p"),
      py::arg("tp_count"), py::arg("tp_duration"), py::arg("dp_allgather"), py::arg("dp_reducescatter"),
      "Simulates an action table; returns the timeline as flat arrays (see pybubble.timeline).");
}
