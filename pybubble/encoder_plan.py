"""An encoder's parallel plan over the LLM's GPUs, and the kernel tasks it gives the bubble scheduler.

Lane mapping. The encoder runs on the same GPUs as the LLM with its own plan (Optimus, §4):
``pp_enc`` divides ``pp_llm``, ``tp_enc`` divides ``tp_llm`` and ``dp_enc = m · dp_llm`` with
``m = (pp_llm / pp_enc) · (tp_llm / tp_enc)`` encoder pipelines inside one LLM data-parallel
replica. A lane is one encoder TP group, so LLM stage ``s`` has ``lanes_per_stage = tp_llm / tp_enc``
lanes, numbered ``lane = s · lanes_per_stage + k``. Encoder stage ``e`` lives on the
``r = pp_llm / pp_enc`` LLM stages ``e·r .. e·r + r - 1``; encoder pipeline ``i`` (0 <= i < m) puts
its stage ``e`` on LLM stage ``e·r + i // lanes_per_stage``, lane ``k = i % lanes_per_stage``. The
encoder pipelines thus tile the LLM stages: every lane holds exactly one stage of one pipeline.

Tasks. Encoder microbatch ``j`` runs on the pipeline that the partition gives it: its forward
through the encoder stages (one ``comm`` task for each stage boundary: the activation send), then
its backward in reverse (a ``comm`` task for each gradient send); a frozen encoder has no backward.
The LLM consumes the encoder's output on LLM stage 0: when the pipeline's last stage sits on another
LLM stage, one more ``comm`` task (on that last stage's lane) sends the output there, and the
backward starts with a ``comm`` task on lane ``i % lanes_per_stage`` of LLM stage 0 that sends its
gradient back. All sends are pipeline point-to-point transfers of ``micro_batch · tokens · hidden``
elements split over the ``tp_enc`` ranks, priced by ``CostModel.p2p_time`` (across nodes).
Several encoders give parallel chains in the same microbatch (all forwards of ``j`` first, then
all backwards). Tasks come out in ``pybubble.problem/1`` form without ``id`` (list index = id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .costmodel import CostModel
from .decompose import decompose_layer
from .models import EncoderConfig


@dataclass(kw_only=True, slots=True)
class EncoderPlan:
    """The encoder's parallel plan relative to the LLM's (per LLM data-parallel replica)."""

    pp_enc: int
    """Encoder pipeline stages; divides ``pp_llm``."""
    tp_enc: int
    """Encoder tensor-parallel degree; divides ``tp_llm``."""
    pp_llm: int
    """LLM pipeline stages."""
    tp_llm: int
    """LLM tensor-parallel degree."""

    def __post_init__(self) -> None:
        for name in ("pp_enc", "tp_enc", "pp_llm", "tp_llm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: {value!r} is not a positive integer")
        if self.pp_llm % self.pp_enc:
            raise ValueError(f"pp_enc: {self.pp_enc} does not divide pp_llm ({self.pp_llm})")
        if self.tp_llm % self.tp_enc:
            raise ValueError(f"tp_enc: {self.tp_enc} does not divide tp_llm ({self.tp_llm})")

    @property
    def lanes_per_stage(self) -> int:
        """Encoder TP groups per LLM stage."""
        return self.tp_llm // self.tp_enc

    @property
    def pipelines(self) -> int:
        """m: encoder pipelines per LLM data-parallel replica (dp_enc = m · dp_llm)."""
        return (self.pp_llm // self.pp_enc) * self.lanes_per_stage

    def llm_stage(self, pipeline: int, stage: int) -> int:
        """The LLM stage that holds encoder pipeline `pipeline`'s stage `stage`."""
        return stage * (self.pp_llm // self.pp_enc) + pipeline // self.lanes_per_stage

    def lane(self, pipeline: int, stage: int) -> int:
        """The lane of encoder pipeline `pipeline`'s stage `stage` (see the module docstring)."""
        return self.llm_stage(pipeline, stage) * self.lanes_per_stage + pipeline % self.lanes_per_stage

    def llm_input_lane(self, pipeline: int) -> int:
        """The lane on LLM stage 0 that exchanges pipeline `pipeline`'s output and its gradient."""
        return pipeline % self.lanes_per_stage

    def stage_layers(self, layers: int) -> list[int]:
        """Layers per encoder stage: as even as possible, the first stages taking the remainder."""
        base, extra = divmod(layers, self.pp_enc)
        return [base + (1 if e < extra else 0) for e in range(self.pp_enc)]


def encoder_tasks(encoders: EncoderConfig | Sequence[EncoderConfig], *, plan: EncoderPlan,
                  partition: Sequence[int], micro_batch: int, costs: CostModel,
                  tokens: int | None = None, frozen: bool | Sequence[bool] = False,
                  sequence_parallel: bool = False) -> list[dict[str, Any]]:
    """Kernel tasks of the encoder(s) for one training step.

    `partition[i]` is the number of encoder microbatches that encoder pipeline ``i`` runs
    (``len(partition) == plan.pipelines``); microbatches are numbered pipeline by pipeline, so
    pipeline 0 runs ``j = 0 .. partition[0] - 1`` and so on. Each microbatch has `micro_batch`
    images of `tokens` tokens (default: each encoder's own ``tokens``). `frozen` (one flag, or one
    per encoder) drops the backward. Durations come from `costs`.
    """
    models = [encoders] if isinstance(encoders, EncoderConfig) else list(encoders)
    if not models:
        raise ValueError("encoders: empty")
    for mdl in models:
        if not isinstance(mdl, EncoderConfig):
            raise ValueError(f"encoders: {mdl!r} is not an EncoderConfig")
    flags = [frozen] * len(models) if isinstance(frozen, bool) else list(frozen)
    if len(flags) != len(models):
        raise ValueError(f"frozen: {len(flags)} flags for {len(models)} encoders")
    if len(partition) != plan.pipelines:
        raise ValueError(f"partition: {len(partition)} entries, the plan has {plan.pipelines} encoder pipelines")
    for i, n in enumerate(partition):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"partition[{i}]: {n!r} is not a non-negative integer")
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch <= 0:
        raise ValueError(f"micro_batch: {micro_batch!r} is not a positive integer")

    # Per encoder: one layer's kernels with durations, forward and backward, computed once.
    layer_cost = []
    for mdl in models:
        s = tokens if tokens is not None else mdl.tokens
        per_phase = {}
        for phase in ("fwd", "bwd"):
            kernels = decompose_layer(mdl, micro_batch, s, tp=plan.tp_enc,
                                      sequence_parallel=sequence_parallel, phase=phase)
            per_phase[phase] = [(k, costs.kernel_time(k)) for k in kernels]
        send = costs.p2p_time(float(mdl.dtype_bytes * micro_batch * s * mdl.hidden) / plan.tp_enc)
        layer_cost.append((per_phase, send, plan.stage_layers(mdl.layers)))

    tasks: list[dict[str, Any]] = []

    def emit(lane: int, duration: float, resource: str, phase: str, j: int, after: list[int]) -> int:
        tasks.append({"lane": lane, "duration": duration, "resource": resource, "phase": phase,
                      "microbatch": j, "after": after})
        return len(tasks) - 1

    def run_layers(per_layer: list[tuple[Any, float]], count: int, lane: int, phase: str, j: int,
                   prev: int | None) -> int | None:
        """Emits `count` layers; returns the task that ends the last layer's dependency chain."""
        for _ in range(count):
            first = len(tasks)
            for k, t in per_layer:
                after = [first + a for a in k.after] if k.after else ([] if prev is None else [prev])
                emit(lane, t, k.resource, phase, j, after)
            # the chain continues from the last kernel that is not a dangling weight-gradient GEMM
            last = max(i for i, (k, _) in enumerate(per_layer) if not k.name.endswith("_wgrad"))
            prev = first + last
        return prev

    j = 0
    for pipeline, count in enumerate(partition):
        last_lane = plan.lane(pipeline, plan.pp_enc - 1)
        to_llm = plan.llm_stage(pipeline, plan.pp_enc - 1) != 0
        for _ in range(count):
            ends = []
            for per_phase, send, layers in layer_cost:
                prev: int | None = None
                for e, n in enumerate(layers):
                    lane = plan.lane(pipeline, e)
                    prev = run_layers(per_phase["fwd"], n, lane, "fwd", j, prev)
                    if e + 1 < plan.pp_enc:
                        prev = emit(lane, send, "comm", "fwd", j, [] if prev is None else [prev])
                if to_llm:  # the encoder's output goes to LLM stage 0
                    prev = emit(last_lane, send, "comm", "fwd", j, [] if prev is None else [prev])
                ends.append(prev)
            for (per_phase, send, layers), flag, end in zip(layer_cost, flags, ends):
                if flag:
                    continue
                prev = end
                if to_llm:  # its gradient comes back from LLM stage 0
                    prev = emit(plan.llm_input_lane(pipeline), send, "comm", "bwd", j,
                                [] if prev is None else [prev])
                for e in range(plan.pp_enc - 1, -1, -1):
                    lane = plan.lane(pipeline, e)
                    prev = run_layers(per_phase["bwd"], layers[e], lane, "bwd", j, prev)
                    if e > 0:
                        prev = emit(lane, send, "comm", "bwd", j, [] if prev is None else [prev])
            j += 1
    return tasks
