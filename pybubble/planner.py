"""The planner (Optimus §4.2-4.4): the encoder's parallel plan and microbatch partition that give
the shortest MLLM step, found with the bubble predictor, the cost model and the core's scheduler.

Search. For every encoder plan (PP_enc dividing PP_llm, TP_enc dividing TP_llm; DP_enc = m · DP_llm
with m encoder pipelines per LLM replica) the planner lays out microbatch partitions over the m
pipelines, prunes those that do not fit in memory, schedules the rest with the core and keeps the
best. Two bounds cut the work:

- a plan's bound: ``horizon + max(0, (M · W - F) / L)``, with M microbatches of W compute each,
  F the compute-free time of its L lanes: the work that fits nowhere in the step must run outside
  it on some lane. A plan whose bound is no better than the best step so far is skipped whole.
- a partition's bound: ``horizon + max over lanes (work on the lane - free time on the lane)``.
  A partition whose bound is no better than the best step so far is not scheduled.

Partitions: all of them when there are few (at most ``EXHAUSTIVE`` compositions of M into m
parts), otherwise a local search from the even partition that moves one microbatch at a time
between pipelines, trying the moves in order of their bound, until no move improves the step.
Plans are searched on a thread pool (the scheduler releases the GIL). Times are microseconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .config import Config
from .costmodel import CostModel
from .decompose import splits_heads
from .encoder_plan import EncoderPlan, EncoderWork
from .memory import GB, colocated_bytes, encoder_images, encoder_lane_bytes, stage_bytes
from .problem import Problem
from .scheduler import Schedule, schedule
from .timeline import Timeline, simulate_pipeline

EXHAUSTIVE = 256
"""Partitions are enumerated whole up to this many compositions; above, local search."""


def cost_model(config: Config) -> CostModel:
    """The cost model of the config's GPU."""
    return CostModel(config.cluster.gpu)


def llm_layer_times(config: Config, costs: CostModel) -> tuple[float, float]:
    """One LLM layer's forward and backward time for one microbatch on one GPU (TP collectives in)."""
    llm, plan, tr = config.llm, config.llm_plan, config.training
    return (costs.layer_time(llm, tr.micro_batch, tr.seq_len, tp=plan.tp, phase="fwd"),
            costs.layer_time(llm, tr.micro_batch, tr.seq_len, tp=plan.tp, phase="bwd"))


def llm_timeline(config: Config, costs: CostModel | None = None, *, fwd: np.ndarray | None = None,
                 bwd: np.ndarray | None = None) -> Timeline:
    """The LLM-only step of one pipeline: per-chunk forward and backward times from the cost model
    (TP collectives included, and opened as `tp` bubbles), point-to-point activation transfers, and
    the distributed optimizer's exposed parameter all-gather and gradient reduce-scatter.

    `fwd`, `bwd`: per (stage, chunk) times instead of the even layout's (the baselines use them
    to add encoder layers); the TP bubbles are then left out (they do not change the step time)."""
    costs = costs or cost_model(config)
    llm, plan, tr = config.llm, config.llm_plan, config.training
    tp_comm = None
    if fwd is None or bwd is None:
        per_chunk = llm.layers // (plan.pp * plan.vpp)
        f_layer, b_layer = llm_layer_times(config, costs)
        fwd, bwd = per_chunk * f_layer, per_chunk * b_layer
        collectives = costs.tp_collective_times(llm, tr.micro_batch, tr.seq_len, tp=plan.tp, phase="fwd")
        if plan.tp > 1 and collectives:
            tp_comm = (per_chunk * len(collectives), sum(collectives) / len(collectives))
    activation = float(llm.dtype_bytes * tr.micro_batch * tr.seq_len * llm.hidden) / plan.tp
    p2p = costs.p2p_time(activation) if plan.pp > 1 else 0.0
    # Each DP rank holds 1/dp of its stage's parameters (bf16) and gathers the rest; gradients
    # are reduce-scattered the same way.
    stage_params = float(llm.params_per_layer * (llm.layers // plan.pp) * llm.dtype_bytes) / plan.tp
    dp = plan.dp
    gather = costs.collective_time("all_gather", stage_params, dp) if dp > 1 else 0.0
    scatter = costs.collective_time("reduce_scatter", stage_params, dp) if dp > 1 else 0.0
    return simulate_pipeline(plan.schedule, stages=plan.pp, microbatches=config.microbatches,
                             chunks=plan.vpp, fwd=fwd, bwd=bwd, p2p=p2p, tp_comm=tp_comm,
                             dp_allgather=gather, dp_reducescatter=scatter)


def encoder_tp_ok(config: Config, tp: int) -> bool:
    """Whether every encoder of the config can run at tensor parallelism `tp`."""
    return all(splits_heads(e.model, tp) for e in config.encoders)


def even_partition(microbatches: int, pipelines: int) -> list[int]:
    """Microbatches spread over the encoder pipelines as evenly as possible (earlier ones get the
    remainder)."""
    q, r = divmod(microbatches, pipelines)
    return [q + (i < r) for i in range(pipelines)]


def encoder_work(config: Config, plan: EncoderPlan, costs: CostModel | None = None,
                 separate: bool = False) -> EncoderWork:
    """The config's encoders under `plan`: colocated on the LLM's GPUs, or on GPUs of their own."""
    return EncoderWork([e.model for e in config.encoders], plan=plan, micro_batch=encoder_images(config),
                       costs=costs or cost_model(config), frozen=[e.frozen for e in config.encoders],
                       separate=separate)


def encoder_problem(config: Config, timeline: Timeline, plan: EncoderPlan, partition: list[int],
                    costs: CostModel | None = None) -> Problem:
    """The problem of placing every encoder's kernels, under `plan` and `partition`, into the
    bubbles of `timeline` (colocated: the encoder runs on the LLM's GPUs)."""
    work = encoder_work(config, plan, costs)
    return timeline.to_problem(work.arrays(partition), lanes_per_stage=plan.lanes_per_stage)


def candidates(config: Config) -> list[EncoderPlan]:
    """Every encoder plan the config allows: PP_enc dividing PP_llm, TP_enc dividing TP_llm, as
    many encoder pipelines per LLM replica as there are LLM microbatches at most, at least one
    layer of every encoder on each encoder stage, and TP_enc splitting every encoder's heads."""
    p = config.llm_plan
    out = []
    for pp_enc in (d for d in range(1, p.pp + 1) if p.pp % d == 0):
        for tp_enc in (d for d in range(1, p.tp + 1) if p.tp % d == 0 and encoder_tp_ok(config, d)):
            plan = EncoderPlan(pp_enc=pp_enc, tp_enc=tp_enc, pp_llm=p.pp, tp_llm=p.tp)
            if plan.pipelines <= config.microbatches and all(plan.stage_layers(e.model.layers)[-1] > 0
                                                            for e in config.encoders):
                out.append(plan)
    return out


@dataclass(kw_only=True, slots=True)
class Candidate:
    """One encoder plan and partition, scheduled."""

    plan: EncoderPlan
    """The encoder's parallel plan."""
    partition: list[int]
    """Encoder microbatches per encoder pipeline."""
    problem: Problem
    """The scheduling problem it gives."""
    schedule: Schedule
    """The greedy schedule of that problem."""
    memory_bytes: float = 0.0
    """The largest memory of any GPU (bytes)."""

    @property
    def step_time(self) -> float:
        return self.schedule.step_time

    @property
    def hidden_fraction(self) -> float:
        """Share of the encoder's compute inside the LLM step's bubbles."""
        return self.schedule.hidden_fraction(self.problem)


@dataclass(kw_only=True, slots=True)
class SearchStats:
    """What the search did."""

    plans: int = 0
    """Encoder plans the config allows."""
    plans_pruned: int = 0
    """Plans skipped whole by their bound."""
    plans_out_of_memory: int = 0
    """Plans with no partition that fits in memory."""
    scheduled: int = 0
    """Partitions scheduled with the core."""
    bound_pruned: int = 0
    """Partitions skipped by their bound."""
    memory_pruned: int = 0
    """Partitions skipped for memory."""
    seconds: float = 0.0
    """Wall time of the search."""


@dataclass(kw_only=True, slots=True)
class Search:
    """The result of :func:`search`."""

    config: Config
    costs: CostModel
    timeline: Timeline
    """The LLM-only step."""
    best: Candidate
    """The shortest step found."""
    coarse: Candidate
    """The best plan under the coarse policy (encoder before and after the LLM), even partition."""
    top: list[Candidate] = field(default_factory=list)
    """The best candidate of each plan, best first."""
    llm_memory_bytes: float = 0.0
    """The LLM's own memory on its busiest GPU (bytes)."""
    stats: SearchStats = field(default_factory=SearchStats)


class _PlanSpace:
    """One encoder plan's partitions: bounds, memory, and scheduling."""

    def __init__(self, config: Config, costs: CostModel, timeline: Timeline, plan: EncoderPlan,
                 windows: dict[str, np.ndarray], llm_memory: np.ndarray):
        self.config, self.timeline, self.plan = config, timeline, plan
        self.windows, self.llm_memory = windows, llm_memory
        self.work = encoder_work(config, plan, costs)
        lanes = plan.pp_llm * plan.lanes_per_stage
        offset = windows["compute_offset"]
        widths = np.concatenate([[0.0], np.cumsum(windows["compute_end"] - windows["compute_start"])])
        self.free = widths[offset[1:]] - widths[offset[:-1]]
        # compute work per lane of one microbatch on each pipeline
        self.per_mb = np.zeros((plan.pipelines, lanes))
        for i in range(plan.pipelines):
            t = self.work.microbatch_tasks(i)
            compute = t["resource"] == 0
            self.per_mb[i] = np.bincount(t["lane"][compute], weights=t["duration"][compute], minlength=lanes)
        self.horizon = timeline.step_time
        self.memory_limit = config.memory_gb * GB

    def plan_bound(self, microbatches: int) -> float:
        total = microbatches * float(self.per_mb.sum()) / self.plan.pipelines  # same work per microbatch
        return self.horizon + max(0.0, (total - float(self.free.sum())) / len(self.free))

    def bound(self, partition: Sequence[int]) -> float:
        over = np.asarray(partition, np.float64) @ self.per_mb - self.free
        return self.horizon + max(0.0, float(over.max()))

    def moves(self, cand: Candidate, donors: int = 2, receivers: int = 3) -> list[tuple[int, ...]]:
        """Partitions one microbatch away from `cand`'s: from the pipelines whose lanes run most
        encoder work outside the step to those that run least (the guided neighbourhood)."""
        a = cand.problem.arrays()
        start, dur, lane = cand.schedule.start, a["duration"], a["lane"]
        outside = np.clip(np.minimum(start + dur, 0.0) - start, 0.0, None)
        outside += np.clip(start + dur - np.maximum(start, self.horizon), 0.0, None)
        per_lane = np.bincount(lane, weights=outside, minlength=len(self.free))
        score = (self.per_mb > 0) @ per_lane  # outside work on the lanes each pipeline uses
        order = np.argsort(score, kind="stable")
        part = cand.partition
        give = [int(i) for i in order[::-1] if part[i] > 0][:donors]
        take = [int(i) for i in order][:receivers]
        out = []
        for i in give:
            for j in take:
                if i != j:
                    nxt = list(part)
                    nxt[i] -= 1
                    nxt[j] += 1
                    out.append(tuple(nxt))
        return out

    def memory(self, partition: Sequence[int]) -> float:
        return colocated_bytes(self.config, self.timeline, self.plan, partition, self.llm_memory)

    def candidate(self, partition: Sequence[int], policy: str = "greedy", memory: float | None = None) -> Candidate:
        """`partition` scheduled under `policy`; `memory`: its :meth:`memory`, when known already."""
        problem = self.timeline.to_problem(self.work.arrays(partition), self.plan.lanes_per_stage, self.windows)
        return Candidate(plan=self.plan, partition=list(partition), problem=problem, schedule=schedule(problem, policy),
                         memory_bytes=self.memory(partition) if memory is None else memory)


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write `total` as an ordered sum of `parts` non-negative integers."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total, -1, -1):
        for rest in compositions(total - first, parts - 1):
            yield (first, *rest)


def _search_plan(space: _PlanSpace, microbatches: int, incumbent: Callable[[], float],
                 stats: SearchStats, lock: threading.Lock) -> Candidate | None:
    """The best partition of one plan, or None when none fits in memory or beats `incumbent`."""
    m = space.plan.pipelines
    best: Candidate | None = None
    seen: set[tuple[int, ...]] = set()
    counts = {"scheduled": 0, "bound_pruned": 0, "memory_pruned": 0}

    def limit() -> float:
        return min(incumbent(), best.step_time if best is not None else math.inf)

    def consider(partition: tuple[int, ...]) -> bool:
        """Schedules `partition` unless pruned; True when it became the plan's best."""
        nonlocal best
        if partition in seen:
            return False
        seen.add(partition)
        if space.bound(partition) >= limit():
            counts["bound_pruned"] += 1
            return False
        memory = space.memory(partition)
        if memory > space.memory_limit:
            counts["memory_pruned"] += 1
            return False
        counts["scheduled"] += 1
        cand = space.candidate(partition, memory=memory)
        if best is None or cand.step_time < best.step_time:
            best = cand
            return True
        return False

    if math.comb(microbatches + m - 1, m - 1) <= EXHAUSTIVE:
        # in order of bound: good partitions first make the bound prune more of the rest
        for partition in sorted(compositions(microbatches, m), key=space.bound):
            consider(partition)
    else:
        consider(tuple(even_partition(microbatches, m)))  # when it is pruned, so is the plan
        improved = best is not None
        while improved:
            improved = False
            for partition in sorted(space.moves(best), key=space.bound):
                improved |= consider(partition)
    with lock:
        stats.scheduled += counts["scheduled"]
        stats.bound_pruned += counts["bound_pruned"]
        stats.memory_pruned += counts["memory_pruned"]
    return best


def search(config: Config, costs: CostModel | None = None, *, workers: int = 2,
           progress: Callable[[int, int], None] | None = None) -> Search:
    """Finds the encoder plan and partition with the shortest step (see the module docstring).

    `workers`: threads (the machine's cores are a good choice). `progress(done, total)` is called
    after each plan. ValueError when no plan fits the LLM's stages or memory.
    """
    t0 = time.perf_counter()
    costs = costs or cost_model(config)
    timeline = llm_timeline(config, costs)
    plans = candidates(config)
    if not plans:
        raise ValueError("encoders: no encoder plan fits the LLM plan (too few layers for its stages?)")
    llm_memory = stage_bytes(config, timeline)
    if llm_memory.max() > config.memory_gb * GB:
        raise ValueError(f"memory_gb: the LLM alone needs {llm_memory.max() / GB:.1f} GB on its busiest GPU, "
                         f"more than {config.memory_gb:g}")
    windows = {lps: timeline.lane_windows(lps) for lps in {p.lanes_per_stage for p in plans}}
    spaces = [_PlanSpace(config, costs, timeline, p, windows[p.lanes_per_stage], llm_memory) for p in plans]
    microbatches = config.microbatches
    spaces.sort(key=lambda s: s.plan_bound(microbatches))
    stats = SearchStats(plans=len(plans))
    lock = threading.Lock()
    results: list[Candidate] = []
    coarse: list[Candidate] = []
    done = 0

    def incumbent() -> float:
        with lock:
            return min((c.step_time for c in results), default=math.inf)

    def run(space: _PlanSpace) -> None:
        nonlocal done
        even = even_partition(microbatches, space.plan.pipelines)
        memory = space.memory(even)
        fits = memory <= space.memory_limit
        base = space.candidate(even, "coarse", memory)
        if space.plan_bound(microbatches) >= incumbent():
            best, pruned = None, True
        else:
            best, pruned = _search_plan(space, microbatches, incumbent, stats, lock), False
        with lock:
            coarse.append(base)
            if best is not None:
                results.append(best)
            elif pruned:
                stats.plans_pruned += 1
            elif not fits:
                stats.plans_out_of_memory += 1
            done += 1
            if progress is not None:
                progress(done, len(spaces))

    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run, spaces))
    else:
        for space in spaces:
            run(space)
    if not results:
        leanest = min(s.memory(even_partition(microbatches, s.plan.pipelines)) for s in spaces)
        raise ValueError(f"memory_gb: no encoder plan fits in {config.memory_gb:g} GB per GPU (the leanest "
                         f"even partition needs {leanest / GB:.1f} GB)")
    results.sort(key=lambda c: c.step_time)
    stats.seconds = time.perf_counter() - t0
    fitting = [c for c in coarse if c.memory_bytes <= config.memory_gb * GB] or coarse
    return Search(config=config, costs=costs, timeline=timeline, best=results[0],
                  coarse=min(fitting, key=lambda c: c.step_time), top=results, stats=stats,
                  llm_memory_bytes=float(llm_memory.max()))


def best_plan(config: Config, costs: CostModel | None = None) -> Candidate:
    """The encoder plan and partition whose greedy schedule gives the shortest step."""
    return search(config, costs).best


@dataclass(kw_only=True, slots=True)
class Separate:
    """The encoder on GPUs of its own (non-colocated placement), scheduled against the LLM step."""

    plan: EncoderPlan
    """pp_enc x tp_enc per pipeline; ``plan.lanes_per_stage`` pipelines per LLM replica."""
    candidate: Candidate
    """Its problem (one lane per encoder GPU group, free the whole step) and schedule."""
    extra_gpus: int
    """GPUs added to the cluster for the encoder (all LLM replicas)."""

    @property
    def step_time(self) -> float:
        return self.candidate.step_time


def separate(config: Config, costs: CostModel | None = None, timeline: Timeline | None = None) -> Separate:
    """The best non-colocated layout: the encoder on ``dp · n · pp_enc · tp_enc`` GPUs of its own
    (pp_enc dividing the encoders' layers up to PP_llm, tp_enc up to a node, n pipelines per LLM
    replica up to the microbatches), chosen for the least GPU time (step time x all GPUs), within
    memory. Its output and gradient cross to and from LLM stage 0 as pipeline sends."""
    costs = costs or cost_model(config)
    timeline = timeline or llm_timeline(config, costs)
    p, horizon = config.llm_plan, timeline.step_time
    layers = min(e.model.layers for e in config.encoders)
    best: Separate | None = None
    for pp_enc in (d for d in range(1, p.pp + 1) if layers >= d):
        for tp_enc in (d for d in (1, 2, 4, 8, 16) if d <= config.cluster.gpus_per_node and encoder_tp_ok(config, d)):
            n = 1
            while n <= config.microbatches:
                plan = EncoderPlan(pp_enc=pp_enc, tp_enc=tp_enc, pp_llm=pp_enc, tp_llm=tp_enc * n)
                partition = even_partition(config.microbatches, n)
                memory = float(encoder_lane_bytes(config, plan, partition).max())
                if memory <= config.memory_gb * GB:
                    lanes = pp_enc * n
                    whole = {f"{k}_offset": np.arange(lanes + 1, dtype=np.int64) for k in ("compute", "link")}
                    for k in ("compute", "link"):
                        whole[f"{k}_start"], whole[f"{k}_end"] = np.zeros(lanes), np.full(lanes, horizon)
                    problem = timeline.to_problem(
                        encoder_work(config, plan, costs, separate=True).arrays(partition), windows=whole,
                        lane_names=[f"enc{e}.lane{i}" for e in range(pp_enc) for i in range(n)])
                    cand = Candidate(plan=plan, partition=partition, problem=problem, schedule=schedule(problem),
                                     memory_bytes=memory)
                    extra = p.dp * lanes * tp_enc
                    option = Separate(plan=plan, candidate=cand, extra_gpus=extra)
                    cost = option.step_time * (config.cluster.gpus + extra)
                    if best is None or cost < best.step_time * (config.cluster.gpus + best.extra_gpus):
                        best = option
                    if cand.step_time <= horizon * (1 + 1e-9):
                        break  # all hidden: more pipelines only add GPUs
                n *= 2
    if best is None:
        raise ValueError(f"memory_gb: no non-colocated encoder layout fits in {config.memory_gb:g} GB per GPU")
    return best


def model_flops(config: Config) -> float:
    """Model FLOPs of one training step over the whole cluster: every layer's kernels (forward and
    backward; a frozen encoder's forward only) and the LLM's output layer, per sample, times the
    global batch. Recomputation is not counted (the MFU convention)."""
    from .decompose import decompose_layer

    def layer(model, tokens: int, phases: tuple[str, ...]) -> float:
        return sum(k.flops for ph in phases for k in decompose_layer(model, 1, tokens, phase=ph))

    llm, tr = config.llm, config.training
    per_sample = llm.layers * layer(llm, tr.seq_len, ("fwd", "bwd")) + 3 * 2.0 * tr.seq_len * llm.hidden * llm.vocab
    for enc in config.encoders:
        images = max(1, enc.tokens_per_sample // enc.model.tokens)
        phases = ("fwd",) if enc.frozen else ("fwd", "bwd")
        per_sample += images * enc.model.layers * layer(enc.model, enc.model.tokens, phases)
    return per_sample * tr.global_batch


def mfu(config: Config, step_time: float, gpus: int | None = None, costs: CostModel | None = None) -> float:
    """Model FLOPs utilisation of a step of `step_time` us on `gpus` GPUs (default: the cluster's)."""
    costs = costs or cost_model(config)
    gpus = gpus or config.cluster.gpus
    return model_flops(config) / (step_time * 1e-6 * gpus * costs.hardware.peak_flops)
