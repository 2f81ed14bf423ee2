"""The LLM step of a config, derived once and handed on: its cost model, one layer's forward and
backward time, the simulated LLM-only step (with its bubbles and the encoder's dependency points)
and the memory each pipeline rank needs for the LLM alone.

Everything later in the data flow (the planner's search, the baselines, the report, dynamic data)
takes an :class:`LLMStep` instead of re-deriving these from the config. Times are microseconds,
memory in bytes.

What the simulated step holds, as Megatron-LM runs it:

- each pipeline action is its chunk's layers (forward; backward with the recomputed forward work of
  ``training.recompute``); the embedding lookup and the output layer are left out (GPT-175B's
  logits add a third of a layer to the last stage's work);
- the TP collectives of each action open as ``tp`` bubbles where they leave the compute stream
  idle (:func:`~pybubble.costs.roofline.stream_schedule`: every forward collective, recomputed ones
  included; the backward's input-gradient all-reduces run under the weight-gradient GEMMs, as
  Megatron-LM's asynchronous TP all-reduce does). The core takes one count and one duration for
  every action, so a layer's forward and backward gaps are averaged into
  ``round((n_fwd + n_bwd) / 2)`` gaps of equal length, which keeps their total per forward-backward
  pair;
- pipeline sends of one microbatch's activations between stages (across nodes);
- the distributed optimizer's exposed parameter all-gather (bf16) at the step's start and gradient
  reduce-scatter at its end, over the data-parallel group; gradients are reduced in fp32 (Megatron-LM
  keeps bf16 training's main gradients in fp32), so the reduce-scatter moves twice the bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config.checks import integer, one_of, positive_int, shown
from ..config.schema import Config, LLMPlan
from ..costs.memory import activation_bytes, encoder_layer_bytes, recompute_bytes, state_bytes
from ..costs.roofline import CostModel, stream_schedule
from .tables import ACTION_KINDS, Table, build_table, interleaved_1f1b, interleaved_warmup
from .timeline import Timeline, Windows, simulate_pipeline

GRAD_BYTES = 4
"""Bytes per gradient element in the data-parallel reduce-scatter (fp32 main gradients)."""


def activation_peak(timeline: Timeline, held: np.ndarray) -> np.ndarray:
    """Per pipeline rank, the peak activation bytes over the step: ``held[rank, chunk]`` bytes are
    taken when a forward F of that chunk starts and given back when the backward that frees them
    ends (W where the table splits one off, else B or I)."""
    o = timeline.op_columns
    kind = np.asarray(ACTION_KINDS)[o["kind"]]
    rank, w = o["rank"], np.asarray(held, np.float64)[o["rank"], o["chunk"]]
    key = (rank * (int(o["chunk"].max(initial=0)) + 1) + o["chunk"]) * (int(o["microbatch"].max(initial=0)) + 1) \
        + o["microbatch"]
    take = kind == "F"
    free = (kind == "W") | (np.isin(kind, ("B", "I")) & ~np.isin(key, key[kind == "W"]))
    ranks = np.concatenate([rank[take], rank[free]])
    times = np.concatenate([o["start"][take], o["end"][free]])
    deltas = np.concatenate([w[take], -w[free]])
    order = np.lexsort((deltas, times, ranks))  # per rank, by time; at equal times the frees (negative) first
    ranks, deltas = ranks[order], deltas[order]
    peak = np.zeros(timeline.ranks)
    bounds = np.searchsorted(ranks, np.arange(timeline.ranks + 1))
    for r in range(timeline.ranks):  # a running sum per rank, in order, as the events come
        if bounds[r + 1] > bounds[r]:
            peak[r] = max(0.0, float(np.cumsum(deltas[bounds[r]:bounds[r + 1]]).max()))
    return peak


def cost_model(config: Config) -> CostModel:
    """The cost model of `config`'s GPU with the calibration file the config names (a ValueError
    naming ``cluster.calibration`` when that file is missing or malformed)."""
    if not config.cluster.calibration:
        return CostModel(config.cluster.gpu)
    try:
        return CostModel(config.cluster.gpu, calibration=config.cluster.calibration)
    except ValueError as e:
        raise ValueError(f"cluster.calibration: {e}") from None


def even_split(total: int, parts: int) -> list[int]:
    """`total` split into `parts` whole shares as even as possible, the first ones taking the
    remainder (layers over pipeline stages, microbatches over encoder pipelines)."""
    q, r = divmod(integer(total, "total", minimum=0), positive_int(parts, "parts"))
    return [q + (i < r) for i in range(parts)]


def chunk_layers(plan: LLMPlan, layers: int) -> np.ndarray:
    """LLM layers per (rank, chunk) of the even layout: the layers split over the plan's ``pp x vpp``
    stages as evenly as they go, the first stages taking one more where they do not divide (stage
    ``rank + chunk x pp``; under zbv, ``rank`` and ``2 pp - 1 - rank``)."""
    per_stage = even_split(layers, plan.pp * plan.vpp)
    out = np.zeros((plan.pp, plan.vpp), np.int64)
    for r in range(plan.pp):
        for c in range(plan.vpp):
            stage = (r if c == 0 else 2 * plan.pp - 1 - r) if plan.schedule == "zbv" else r + c * plan.pp
            out[r, c] = per_stage[stage]
    return out


def wgrad_share(costs: CostModel) -> float:
    """The weight-gradient half W's share of an LLM backward at `costs`' op factors (1/2 without
    them): ``llm_wgrad`` over twice :meth:`CostModel.backward_factor`."""
    return costs.op_factor("llm_wgrad") / (2 * costs.backward_factor())


def step_comm(config: Config, costs: CostModel) -> tuple[float, float, float]:
    """The communication of `config`'s LLM step at `costs` (us): one pipeline send of a microbatch's
    activations (0 without pipeline parallelism), and the distributed optimizer's exposed parameter
    all-gather and gradient reduce-scatter (0 without data parallelism). Each DP rank holds 1/dp of
    its stage's parameters (bf16) and gathers the rest; gradients (fp32) are reduce-scattered the
    same way; the rank with the most layers sets the time."""
    llm, plan, tr = config.llm, config.llm_plan, config.training
    activation = float(llm.dtype_bytes * tr.micro_batch * tr.seq_len * llm.hidden) / plan.tp
    p2p = costs.p2p_time(activation) if plan.pp > 1 else 0.0
    stage_params = float(llm.params_per_layer * chunk_layers(plan, llm.layers).sum(axis=1).max()) / plan.tp
    dp = plan.dp
    gather = costs.collective_time("all_gather", stage_params * llm.dtype_bytes, dp) if dp > 1 else 0.0
    scatter = costs.collective_time("reduce_scatter", stage_params * GRAD_BYTES, dp) if dp > 1 else 0.0
    return p2p, gather, scatter


WARMUP_SCHEDULES = ("1f1b", "interleaved_1f1b")
"""The schedules whose warm-up depth per rank can change (:meth:`LLMStep.with_warmup`)."""


def default_warmup(plan: LLMPlan, microbatches: int) -> list[int]:
    """The warm-up forwards per rank of `plan`'s schedule (one of :data:`WARMUP_SCHEDULES`): 1F1B's
    ``p - 1 - r``, interleaved 1F1B's Megatron count (:func:`interleaved_warmup`)."""
    one_of(plan.schedule, WARMUP_SCHEDULES, "llm_plan.schedule")
    if plan.schedule == "1f1b":
        return [min(plan.pp - 1 - r, microbatches) for r in range(plan.pp)]
    return interleaved_warmup(plan.pp, microbatches, plan.vpp)


def warmup_table(plan: LLMPlan, microbatches: int, extra: Sequence[int]) -> Table:
    """The action table of `plan`'s schedule with ``extra[r]`` more warm-up forwards on rank r (at
    most every forward of the rank): interleaved 1F1B's table with those counts, which for one chunk
    per rank and no extra is 1F1B's (Optimus's warm-up adjustment: a rank that runs more forwards
    before its first backward holds more microbatches and idles elsewhere)."""
    if isinstance(extra, (str, bytes)) or not isinstance(extra, Sequence) or len(extra) != plan.pp:
        raise ValueError(f"warmup: {shown(extra)} is not one count for each of the {plan.pp} pipeline ranks")
    total = microbatches * plan.vpp
    counts = [min(total, w + integer(e, f"warmup[{r}]", minimum=0))
              for r, (w, e) in enumerate(zip(default_warmup(plan, microbatches), extra))]
    return interleaved_1f1b(plan.pp, microbatches, plan.vpp, counts)


def _simulate(config: Config, costs: CostModel, fwd: float | np.ndarray, bwd: float | np.ndarray,
              tp_comm: tuple[int, float] | None, wgrad: float | np.ndarray | None = None,
              warmup: Sequence[int] | None = None) -> Timeline:
    plan = config.llm_plan
    p2p, gather, scatter = step_comm(config, costs)
    if wgrad is None:  # where the schedule splits a backward, W takes its weight-gradient half
        wgrad = np.asarray(bwd) * wgrad_share(costs)
    schedule = plan.schedule if warmup is None else warmup_table(plan, config.microbatches, warmup)
    return simulate_pipeline(schedule, ranks=plan.pp, microbatches=config.microbatches,
                             chunks=plan.vpp, fwd=fwd, bwd=bwd, wgrad=wgrad, p2p=p2p, tp_comm=tp_comm,
                             dp_allgather=gather, dp_reducescatter=scatter)


def _action_gaps(layers: np.ndarray, tp_comm: tuple[int, float] | None) -> tuple[int, float] | None:
    """The TP gaps the core opens in every action: one count for all, the mean chunk's."""
    return (round(layers.mean() * tp_comm[0]), tp_comm[1]) if tp_comm else None


def _stage_memory(config: Config, timeline: Timeline, encoder_layers: np.ndarray | None = None,
                  llm_layers: np.ndarray | None = None, encoder_tp: int | None = None) -> np.ndarray:
    llm, plan, tr = config.llm, config.llm_plan, config.training
    recompute = tr.recompute
    shape = (timeline.ranks, timeline.chunks)
    if llm_layers is None:
        llm_layers = chunk_layers(plan, llm.layers)
    if encoder_layers is None:
        encoder_layers = np.zeros(shape)
    states = state_bytes(llm, plan.tp) * llm_layers
    held = activation_bytes(llm, tr.micro_batch, tr.seq_len, plan.tp, recompute) * llm_layers
    working = np.where(llm_layers.sum(axis=1) > 0,
                       recompute_bytes(llm, tr.micro_batch, tr.seq_len, plan.tp, recompute), 0.0)
    total_layers = sum(e.model.layers for e in config.encoders)
    for enc, images in zip(config.encoders, config.encoder_images):
        s_bytes = encoder_layer_bytes(enc.model, images, encoder_tp or plan.tp, enc.frozen)[0]
        a_bytes = encoder_layer_bytes(enc.model, images, plan.tp, enc.frozen, recompute)[1]
        share = enc.model.layers / total_layers
        states = states + s_bytes * share * encoder_layers
        held = held + a_bytes * share * encoder_layers
        if not enc.frozen:
            rebuilt = recompute_bytes(enc.model, images, enc.model.tokens, plan.tp, recompute)
            working = np.maximum(working, np.where(encoder_layers.sum(axis=1) > 0, rebuilt, 0.0))
    return states.sum(axis=1) + activation_peak(timeline, held) + working


@dataclass(kw_only=True, slots=True, eq=False)
class LLMStep:
    """The LLM-only step of one pipeline under a config's plan (see the module docstring). Build it
    with :meth:`of`."""

    config: Config
    """The config it was derived from."""
    costs: CostModel
    """The cost model of the config's GPU and calibration."""
    layer_fwd: float
    """One LLM layer's forward for one microbatch on one GPU, its exposed TP collectives included (us)."""
    layer_bwd: float
    """One LLM layer's backward, likewise, with its recomputed forward work (us)."""
    tp_comm: tuple[int, float] | None
    """TP bubbles per layer and action as the simulator opens them: (count, duration), or None
    without TP."""
    timeline: Timeline
    """The simulated LLM-only step: even layer layout, TP collectives opened as ``tp`` bubbles."""
    memory: np.ndarray
    """Per pipeline rank, the LLM's model states and peak activations on one GPU (bytes)."""
    warmup: tuple[int, ...] | None = None
    """Extra warm-up forwards per pipeline rank over the schedule's own (:meth:`with_warmup`), or
    None for the schedule as it is."""

    @classmethod
    def of(cls, config: Config, costs: CostModel | None = None) -> "LLMStep":
        """Derives the step of `config` (with `costs`, default: :func:`cost_model` of the config)."""
        costs = costs or cost_model(config)
        llm, plan, tr = config.llm, config.llm_plan, config.training
        (fwd, fwd_gaps), (bwd, bwd_gaps) = (stream_schedule(costs.layer_kernels(
            llm, tr.micro_batch, tr.seq_len, tp=plan.tp, phase=phase, recompute=tr.recompute)) for phase in ("fwd", "bwd"))
        gaps = fwd_gaps + bwd_gaps
        tp_comm = None
        if plan.tp > 1 and gaps:
            count = max(1, round(len(gaps) / 2))
            tp_comm = (count, sum(gaps) / (2 * count))
        layers = chunk_layers(plan, llm.layers)
        timeline = _simulate(config, costs, layers * fwd, layers * bwd, _action_gaps(layers, tp_comm))
        return cls(config=config, costs=costs, layer_fwd=fwd, layer_bwd=bwd, tp_comm=tp_comm, timeline=timeline,
                   memory=_stage_memory(config, timeline))

    def with_warmup(self, extra: Sequence[int]) -> "LLMStep":
        """The same step with ``extra[r]`` more warm-up forwards on pipeline rank r (a schedule of
        :data:`WARMUP_SCHEDULES`; :func:`warmup_table`), simulated from that table, its memory
        counting the microbatches each rank then holds. ValueError when the table deadlocks."""
        layers = self.chunk_layers
        extra = tuple(int(e) for e in extra) if isinstance(extra, Sequence) else extra
        timeline = _simulate(self.config, self.costs, layers * self.layer_fwd, layers * self.layer_bwd,
                             _action_gaps(layers, self.tp_comm), warmup=extra)
        return LLMStep(config=self.config, costs=self.costs, layer_fwd=self.layer_fwd, layer_bwd=self.layer_bwd,
                       tp_comm=self.tp_comm, timeline=timeline, memory=_stage_memory(self.config, timeline),
                       warmup=extra)

    def action_table(self) -> Table:
        """The LLM's action table this step simulates (torch's notation; :func:`pybubble.llm.tables.save_csv`
        writes it in the CSV form torch's pipelining loads)."""
        plan = self.config.llm_plan
        if self.warmup is not None:
            return warmup_table(plan, self.config.microbatches, self.warmup)
        return build_table(plan.schedule, plan.pp, self.config.microbatches, plan.vpp)

    def with_plan(self, plan: LLMPlan) -> "LLMStep":
        """The step of the same config and cost model under another LLM plan (this step when it is
        the same plan)."""
        if plan == self.config.llm_plan:
            return self
        return LLMStep.of(self.config.with_plan(plan), self.costs)

    @property
    def chunk_layers(self) -> np.ndarray:
        """LLM layers per (rank, chunk) of the even layout (:func:`chunk_layers`)."""
        return chunk_layers(self.config.llm_plan, self.config.llm.layers)

    def encoder_windows(self, lanes_per_stage: int = 1) -> tuple[Windows, Windows]:
        """The (compute_free, link_free) windows of each encoder lane colocated on the LLM's GPUs,
        `lanes_per_stage` lanes per pipeline rank: the rank's bubbles, and its links inside the node
        free of the LLM's TP collectives (:attr:`Timeline.nvlink_free`). The encoder's
        communication is its TP collectives, inside a node, and a few pipeline sends per microbatch;
        those sends are treated alike, so they may overlap the LLM's DP collectives (sharing the
        network with them) and wait out its TP collectives (which do not use the network)."""
        tl = self.timeline
        return tl.compute_free.repeated(lanes_per_stage), tl.nvlink_free.repeated(lanes_per_stage)

    def simulate(self, fwd: float | np.ndarray, bwd: float | np.ndarray,
                 tp_comm: tuple[int, float] | None = None, wgrad: float | np.ndarray | None = None) -> Timeline:
        """The step with `fwd` and `bwd` per (rank, chunk) (a scalar: every one alike), the config's
        point-to-point activation transfers and the distributed optimizer's exposed parameter
        all-gather and gradient reduce-scatter; `tp_comm` opens TP collectives as bubbles (the
        baselines leave them closed: they do not change the step time); `wgrad`: the W part of each
        backward where the schedule splits one off (default: the LLM's, :func:`wgrad_share`)."""
        return _simulate(self.config, self.costs, fwd, bwd, tp_comm, wgrad)

    def stage_memory(self, timeline: Timeline, encoder_layers: np.ndarray | None = None,
                     llm_layers: np.ndarray | None = None, encoder_tp: int | None = None) -> np.ndarray:
        """Per pipeline rank, model states and peak activations on one GPU when chunk ``c`` of rank
        ``r`` holds ``llm_layers[r, c]`` LLM layers and ``encoder_layers[r, c]`` layers of the
        encoders, on `timeline`. The encoders' weights are split over `encoder_tp` GPUs (default:
        the LLM's TP); their activations over all of the rank's GPUs (TP groups below the LLM's split
        the images). With several encoders, an encoder layer's bytes are their average weighted by
        layer count. Full recomputation adds one layer's rebuilt activations (the largest kind on the
        rank). Default: the LLM's even layout and no encoder."""
        return _stage_memory(self.config, timeline, encoder_layers, llm_layers, encoder_tp)


__all__ = ["GRAD_BYTES", "WARMUP_SCHEDULES", "LLMStep", "activation_peak", "chunk_layers", "cost_model",
           "default_warmup", "even_split", "step_comm", "warmup_table", "wgrad_share"]
