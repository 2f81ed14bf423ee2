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

Coarse. Beside the search, every plan is also scheduled under coarse-grained exploitation only
(Optimus §4.3's first step, the ``coarse`` baseline): the encoder's forward before the LLM's work and
its backward after it on each rank, that is the same greedy filler restricted to each rank's
leading and trailing bubbles (:func:`edge_windows`: the DP all-gather and PP warm-up; the PP
cool-down and DP reduce-scatter), the rest outside the step. The plan's best is never worse than
its coarse schedule.

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

from ..config.checks import integer
from ..config.schema import Config
from ..costs.kernels import splits_heads
from ..costs.memory import GB
from ..costs.roofline import CostModel
from ..llm.step import WARMUP_SCHEDULES, LLMStep, even_split
from ..llm.timeline import Timeline, Windows
from ..problem.encoder import EncoderPlan, EncoderWork
from ..problem.problem import Problem, prefetched_needs
from ..schedule.scheduler import Schedule, schedule_problem
from .bound import StepBound, encoder_load, step_bound

EXHAUSTIVE = 256
"""Partitions are enumerated whole up to this many compositions; above, local search."""


def encoder_tp_ok(config: Config, tp: int) -> bool:
    """Whether every encoder of the config can run at tensor parallelism `tp`."""
    return all(splits_heads(e.model, tp) for e in config.encoders)


def encoder_work(step: LLMStep, plan: EncoderPlan, separate: bool = False) -> EncoderWork:
    """The config's encoders under `plan`: colocated on the LLM's GPUs, or on GPUs of their own."""
    config = step.config
    return EncoderWork([e.model for e in config.encoders], plan=plan, micro_batch=config.encoder_images,
                       costs=step.costs, frozen=[e.frozen for e in config.encoders], separate=separate,
                       recompute=config.training.recompute)


def encoder_problem(step: LLMStep, plan: EncoderPlan, partition: Sequence[int]) -> Problem:
    """The problem of placing every encoder's kernels, under `plan` and `partition`, into the
    bubbles of the LLM step (colocated: the encoder runs on the LLM's GPUs)."""
    return Problem.on_timeline(step.timeline, encoder_work(step, plan).tasks(partition),
                               lanes_per_stage=plan.lanes_per_stage, windows=step.encoder_windows(plan.lanes_per_stage))


def edge_windows(timeline: Timeline) -> Windows:
    """Per rank, the compute-free windows before its first LLM action starts and after its last one
    ends: the bubbles that coarse-grained exploitation fills (the DP all-gather and PP warm-up; the PP
    cool-down and DP reduce-scatter)."""
    first = np.full(timeline.ranks, np.inf)
    last = np.full(timeline.ranks, -np.inf)
    for op in timeline.ops:
        first[op.rank] = min(first[op.rank], op.start)
        last[op.rank] = max(last[op.rank], op.end)
    free = timeline.compute_free
    rank = np.repeat(np.arange(free.lanes), np.diff(free.offset))
    keep = (free.end <= first[rank]) | (free.start >= last[rank])
    counts = np.bincount(rank[keep], minlength=free.lanes)
    return Windows(offset=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                   start=free.start[keep], end=free.end[keep])


def encoder_plans(config: Config) -> list[EncoderPlan]:
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
    spread: tuple[int, int] = (0, 0)
    """Encoder microbatches spread over every pipeline, at the head (feeding the first LLM
    microbatches) and at the tail (the last); `partition` then counts the whole ones between."""
    layout: list[int | tuple[int, ...]] | None = None
    """Where each encoder microbatch runs (:meth:`EncoderWork.layout_tasks`) when it is not the
    partition's pipeline-by-pipeline order; None for that order."""
    bound: StepBound | None = None
    """The lower bound of its plan on its LLM step (:mod:`pybubble.planner.bound`)."""
    step: LLMStep | None = None
    """The LLM step it fills (its warm-up may differ from the config's schedule)."""

    @property
    def step_time(self) -> float:
        """The scheduled step (us)."""
        return self.schedule.step_time

    @property
    def hidden_fraction(self) -> float:
        """Share of the encoder's compute inside the LLM step's bubbles."""
        return self.schedule.hidden_fraction(self.problem)

    def task_images(self) -> np.ndarray | None:
        """Per task, the images of each encoder its piece holds (tasks x encoders), or None when every
        microbatch runs whole (a partition)."""
        if self.layout is None or not self.spread_microbatches:
            return None
        return encoder_work(self.step, self.plan).layout_images(self.layout) if self.step else None

    @property
    def spread_microbatches(self) -> list[int]:
        """The encoder microbatches spread over the pipelines (empty for a partition)."""
        return [] if self.layout is None else [j for j, p in enumerate(self.layout) if not isinstance(p, int)]


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
class PlanSearched:
    """One encoder plan as the search left it."""

    plan: EncoderPlan
    """The encoder plan."""
    bound: StepBound
    """The lower bound on the step of any schedule of the plan on the LLM step."""
    states_fit: bool
    """Whether the LLM and the encoders' model states fit in memory under the plan (when they do
    not, no layout of the plan fits and the bound does not count)."""
    best: Candidate | None = None
    """Its best candidate, or None when the bounds pruned it or nothing of it fits in memory."""


@dataclass(kw_only=True, slots=True)
class WarmupTried:
    """One warm-up depth the search tried (:meth:`LLMStep.with_warmup`)."""

    extra: tuple[int, ...]
    """Extra warm-up forwards per pipeline rank."""
    step: LLMStep
    """The LLM step with that warm-up."""
    bound: StepBound | None
    """The least bound of the encoder plans whose model states fit on it (None: none fits)."""
    best: Candidate | None = None
    """The best plan's best layout on it, or None when memory or the bound ruled it out."""


@dataclass(kw_only=True, slots=True)
class Search:
    """The result of :func:`search`."""

    step: LLMStep
    """The LLM step searched on."""
    best: Candidate
    """The shortest step found."""
    coarse: Candidate
    """The best plan under the coarse policy (encoder before and after the LLM), even partition."""
    top: list[Candidate] = field(default_factory=list)
    """The best candidate of each plan that the bounds did not prune, best first (the first
    ``keep`` of them are the best plans)."""
    stats: SearchStats = field(default_factory=SearchStats)
    """What the search did."""
    plans: list[PlanSearched] = field(default_factory=list)
    """Every encoder plan the config allows, in the order the search took them."""
    warmups: list[WarmupTried] = field(default_factory=list)
    """The warm-up depths tried after the search on the config's own (:func:`warmup_variants`)."""
    default_best: Candidate | None = None
    """The best candidate on the config's own LLM step (:attr:`best` unless a warm-up depth won)."""

    @property
    def bound(self) -> StepBound | None:
        """The least lower bound of the plans whose model states fit, on the config's LLM step and
        on every warm-up depth tried: no schedule of any encoder plan in the bubbles of those steps
        is shorter (None when no plan's states fit)."""
        fitting = [p.bound for p in self.plans if p.states_fit] + [w.bound for w in self.warmups if w.bound]
        return min(fitting, key=lambda b: b.step_time) if fitting else None

    @property
    def config(self) -> Config:
        """The config searched."""
        return self.step.config

    @property
    def costs(self) -> CostModel:
        """The cost model used."""
        return self.step.costs

    @property
    def timeline(self) -> Timeline:
        """The LLM-only step."""
        return self.step.timeline

    @property
    def llm_memory_bytes(self) -> float:
        """The LLM's own memory on its busiest GPU (bytes)."""
        return float(self.step.memory.max())


class _PlanSpace:
    """One encoder plan's partitions: bounds, memory, and scheduling."""

    def __init__(self, step: LLMStep, plan: EncoderPlan, windows: tuple[Windows, Windows] | None = None,
                 edges: Windows | None = None, like: "_PlanSpace | None" = None, prefetch: int | None = None):
        """`like`: the same plan's space on another LLM step, whose encoder work and load are reused
        (they do not depend on the LLM's timeline). `prefetch`: instead of the config's
        ``training.prefetch``."""
        self.step, self.plan = step, plan
        self.windows = windows if windows is not None else step.encoder_windows(plan.lanes_per_stage)
        self.edges = edges if edges is not None else edge_windows(step.timeline).repeated(plan.lanes_per_stage)
        lanes = plan.pp_llm * plan.lanes_per_stage
        self.free = self.windows[0].free_time()
        if like is not None:
            self.work, self.per_phase, self.load = like.work, like.per_phase, like.load
        else:
            self.work = encoder_work(step, plan)
            # compute work per lane of one microbatch on each pipeline, forward and backward
            self.per_phase = np.zeros((2, plan.pipelines, lanes))
            for i in range(plan.pipelines):
                t = self.work.microbatch_tasks(i)
                for ph in (0, 1):
                    keep = (t.resource == 0) & (t.phase == ph)
                    self.per_phase[ph, i] = np.bincount(t.lane[keep], weights=t.duration[keep], minlength=lanes)
            self.load = encoder_load(self.work, microbatches=step.config.microbatches)
        self.per_mb = self.per_phase.sum(axis=0)
        self.horizon = step.timeline.step_time
        self.memory_limit = step.config.memory_gb * GB
        self.prefetch = step.config.training.prefetch if prefetch is None else prefetch
        """LLM microbatches whose encoder forward runs in the step before (frozen encoders)."""
        self.forward_needed, self.grad_ready = prefetched_needs(step.timeline, self.prefetch)
        self.step_bound = step_bound(step.timeline, self.load, step.config.llm_plan.tp, self.prefetch)
        """The lower bound on the step of any schedule of this plan (:func:`step_bound`)."""
        self.gpu_work = float(self.per_mb.sum()) * plan.tp_enc / plan.pipelines
        """GPU time of one microbatch's compute (us: kernel time times its TP group's GPUs)."""
        self.states_fit = self.memory([0] * plan.pipelines) <= self.memory_limit
        """Whether the LLM and the encoders' model states fit (no activations held)."""

    def plan_bound(self, microbatches: int) -> float:
        """A lower bound on the step of any schedule of this plan: the work that fits in no bubble
        spread over every lane, or :attr:`step_bound` when the config's microbatches are meant."""
        total = microbatches * float(self.per_mb.sum()) / self.plan.pipelines  # same work per microbatch
        spill = self.horizon + max(0.0, (total - float(self.free.sum())) / len(self.free))
        return max(spill, self.step_bound.step_time) if microbatches == self.step.config.microbatches else spill

    def bound(self, partition: Sequence[int]) -> float:
        over = np.asarray(partition, np.float64) @ self.per_mb - self.free
        return self.horizon + max(0.0, float(over.max()))

    def moves(self, cand: Candidate, donors: int = 2, receivers: int = 3) -> list[tuple[int, ...]]:
        """Partitions one microbatch away from `cand`'s: from the pipelines whose lanes run most
        encoder work outside the step to those that run least (the guided neighbourhood)."""
        t = cand.problem.arrays().tasks
        start, dur, lane = cand.schedule.start, t.duration, t.lane
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
        """The largest memory of any GPU with the encoder colocated under this plan and `partition`."""
        lanes = self.work.lane_bytes(partition)
        return float((np.repeat(self.step.memory, self.plan.lanes_per_stage) + lanes).max())

    def candidate(self, partition: Sequence[int], coarse: bool = False, memory: float | None = None) -> Candidate:
        """`partition` scheduled by the greedy filler into every bubble, or with `coarse` into the
        leading and trailing ones only (its problem then has those windows alone); `memory`: its
        :meth:`memory`, when known already."""
        windows = (self.edges, self.windows[1]) if coarse else self.windows
        problem = Problem.on_timeline(self.step.timeline, self.work.tasks(partition), self.plan.lanes_per_stage,
                                      windows, prefetch=0 if coarse else self.prefetch)
        return Candidate(plan=self.plan, partition=list(partition), problem=problem, schedule=schedule_problem(problem),
                         memory_bytes=self.memory(partition) if memory is None else memory, bound=self.step_bound,
                         step=self.step)

    def layout_candidate(self, layout: list[int | tuple[int, ...]], spread: tuple[int, int],
                         memory: float | None = None) -> Candidate:
        """`layout` (:meth:`EncoderWork.layout_tasks`) scheduled by the greedy filler into every
        bubble; its `partition` counts the whole microbatches per pipeline."""
        problem = Problem.on_timeline(self.step.timeline, self.work.layout_tasks(layout), self.plan.lanes_per_stage,
                                      self.windows, prefetch=self.prefetch)
        partition = [sum(1 for p in layout if p == i) for i in range(self.plan.pipelines)]
        return Candidate(plan=self.plan, partition=partition, problem=problem, schedule=schedule_problem(problem),
                         memory_bytes=self.layout_memory(layout) if memory is None else memory, spread=spread,
                         layout=layout, bound=self.step_bound, step=self.step)

    def layout_memory(self, layout: list[int | tuple[int, ...]]) -> float:
        """:meth:`memory` of a layout."""
        lanes = self.work.layout_bytes(layout)
        return float((np.repeat(self.step.memory, self.plan.lanes_per_stage) + lanes).max())

    def spread_layout(self, head: int, tail: int) -> list[int | tuple[int, ...]]:
        """A layout whose first `head` and last `tail` encoder microbatches (by the LLM microbatch
        they feed) are spread over every pipeline and the others run whole.

        A head microbatch k is shared out in proportion to each pipeline's compute-free time before
        LLM microbatch k needs it, less the head's earlier pieces there (the least over the
        pipeline's lanes); a tail microbatch likewise by the free time after its gradient is ready,
        from the last one back. The whole microbatches between go, as evenly as they divide, each
        to the pipeline with the most free time left before it is needed; they are numbered in the
        order of the LLM microbatches they feed, so the filler's deadline for each is its own."""
        plan, tl = self.plan, self.step.timeline
        m, total = plan.pipelines, self.step.config.microbatches
        lanes = [[plan.lane(i, e) for e in range(plan.pp_enc)] for i in range(m)]
        need, ready = self.forward_needed, self.grad_ready  # of LLM microbatch k, which layout[k] feeds
        # per pipeline and k, the least compute-free time over its lanes before F_k and after B_k
        lane_before, lane_ready = self.windows[0].free_before(need), self.windows[0].free_before(ready)
        before = np.array([lane_before[ls].min(axis=0) for ls in lanes])
        after = np.array([(self.free[ls][:, None] - lane_ready[ls]).min(axis=0) for ls in lanes])
        fwd = self.per_phase[0].max(axis=1)  # a whole microbatch's forward on each pipeline's busiest lane
        bwd = self.per_phase[1].max(axis=1)
        layout: list[int | tuple[int, ...]] = [0] * total
        used = np.zeros(m)
        for k in range(head):
            share = _share_of(before[:, k] - used)
            layout[k] = share
            used += fwd * np.array(share) / sum(share)
        used_back = np.zeros(m)
        for k in range(total - 1, total - 1 - tail, -1):
            share = _share_of(after[:, k] - used_back)
            layout[k] = share
            used_back += bwd * np.array(share) / sum(share)
        body = list(range(head, total - tail))
        left = even_split(len(body), m)
        for k in body:
            room = before[:, k] - used - fwd
            i = max((i for i in range(m) if left[i] > 0), key=lambda i: (room[i], -i))
            layout[k] = i
            left[i] -= 1
            used[i] += fwd[i]
        return layout

    def spread_choices(self) -> list[tuple[int, int]]:
        """The (head, tail) counts worth trying: the LLM microbatches needed before stage 0's first
        gradient is ready (the warm-up) and those whose gradient is ready after the last one is needed
        (the cool-down); and every microbatch spread, when those two leave some in between."""
        total = self.step.config.microbatches
        head = int((self.forward_needed < self.grad_ready.min()).sum())
        tail = int((self.grad_ready > self.forward_needed.max()).sum())
        half = (total + 1) // 2
        if head + tail >= total:
            head = min(head, total - min(tail, half))
            return [(head, total - head)]
        return [(head, tail), (half, total - half)]

    def in_every_bubble(self, cand: Candidate) -> Candidate:
        """A coarse candidate with the problem of every bubble (its schedule is valid there too)."""
        problem = Problem.on_timeline(self.step.timeline, self.work.tasks(cand.partition), self.plan.lanes_per_stage,
                                      self.windows, prefetch=self.prefetch)
        return Candidate(plan=cand.plan, partition=cand.partition, problem=problem, schedule=cand.schedule,
                         memory_bytes=cand.memory_bytes, bound=cand.bound, step=cand.step)


SHARE_STEPS = 1000
"""A spread microbatch's shares are whole weights out of this many (split_images rounds them to
whole images)."""


def _share_of(room: np.ndarray) -> tuple[int, ...]:
    """Whole weights in proportion to each pipeline's free time `room` (negative counts as none;
    all alike when no pipeline has any)."""
    r = np.clip(np.asarray(room, np.float64), 0.0, None)
    if r.max() <= 0.0:
        return tuple([1] * len(r))
    return tuple(int(x) for x in np.round(r / r.max() * SHARE_STEPS))


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write `total` as an ordered sum of `parts` non-negative integers."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total, -1, -1):
        for rest in compositions(total - first, parts - 1):
            yield (first, *rest)


def _search_plan(space: _PlanSpace, microbatches: int, incumbent: Callable[[], tuple[float, int]],
                 stats: SearchStats, lock: threading.Lock, spread: bool = True, rank: int = 0) -> Candidate | None:
    """The best layout of one plan (its spread layouts unless `spread` is False, then its
    partitions), or None when none fits in memory or beats `incumbent`: the (step, rank) of the
    candidate to beat, the plan's `rank` breaking ties between equal steps (the lower wins), so the
    threads' timing does not decide between plans that tie (often at their bound)."""
    m = space.plan.pipelines
    best: Candidate | None = None
    whole: Candidate | None = None  # the best partition, from which the local search moves
    seen: set[tuple[int, ...]] = set()
    counts = {"scheduled": 0, "bound_pruned": 0, "memory_pruned": 0}

    def beaten(bound: float) -> bool:
        """Whether no layout whose bound is `bound` can beat the incumbent or the plan's best."""
        own = (best.step_time, rank) if best is not None else (math.inf, rank)
        return (bound, rank) >= min(incumbent(), own)

    def keep(cand: Candidate) -> bool:
        nonlocal best
        if best is None or cand.step_time < best.step_time:
            best = cand
            return True
        return False

    for head, tail in space.spread_choices() if spread else []:
        if beaten(space.step_bound.step_time):
            break
        layout = space.spread_layout(head, tail)
        memory = space.layout_memory(layout)
        if memory > space.memory_limit:
            counts["memory_pruned"] += 1
            continue
        counts["scheduled"] += 1
        keep(space.layout_candidate(layout, (head, tail), memory))

    def consider(partition: tuple[int, ...]) -> bool:
        """Schedules `partition` unless pruned; True when it became the best partition."""
        nonlocal whole
        if partition in seen:
            return False
        seen.add(partition)
        if beaten(space.bound(partition)):
            counts["bound_pruned"] += 1
            return False
        memory = space.memory(partition)
        if memory > space.memory_limit:
            counts["memory_pruned"] += 1
            return False
        counts["scheduled"] += 1
        cand = space.candidate(partition, memory=memory)
        keep(cand)
        if whole is None or cand.step_time < whole.step_time:
            whole = cand
            return True
        return False

    if math.comb(microbatches + m - 1, m - 1) <= EXHAUSTIVE:
        # in order of bound: good partitions first make the bound prune more of the rest
        for partition in sorted(compositions(microbatches, m), key=space.bound):
            consider(partition)
    else:
        consider(tuple(even_split(microbatches, m)))  # when it is pruned, so is the local search
        improved = whole is not None
        while improved:
            improved = False
            assert whole is not None
            for partition in sorted(space.moves(whole), key=space.bound):
                improved |= consider(partition)
    with lock:
        stats.scheduled += counts["scheduled"]
        stats.bound_pruned += counts["bound_pruned"]
        stats.memory_pruned += counts["memory_pruned"]
    return best


def best_partition(step: LLMStep, plan: EncoderPlan) -> Candidate | None:
    """`plan`'s best partition on `step`, every microbatch whole (no spread): the search's partition
    search for that plan alone (None when no partition fits in memory)."""
    space = _PlanSpace(step, plan)
    return _search_plan(space, step.config.microbatches, lambda: (math.inf, 0), SearchStats(), threading.Lock(),
                        spread=False)


def without_prefetch(cand: Candidate) -> Candidate:
    """`cand`'s layout on its LLM step with every encoder forward in its own step (no prefetch)."""
    space = _PlanSpace(cand.step, cand.plan, prefetch=0) if cand.step else None
    if space is None:
        raise ValueError("candidate: it has no LLM step")
    if cand.layout is not None:
        return space.layout_candidate(cand.layout, cand.spread)
    return space.candidate(cand.partition)


def warmup_variants(step: LLMStep) -> list[tuple[int, ...]]:
    """The extra warm-up forwards per pipeline rank worth trying on `step` (a schedule of
    :data:`WARMUP_SCHEDULES` with more than one rank): one and two more on every rank but the last,
    and ``p - 1 - r`` more on rank r (Optimus's adjustment: the early ranks run further ahead, their
    warm-up bubble moves into the cool-down, where the encoder's backward waits for room)."""
    plan = step.config.llm_plan
    if plan.schedule not in WARMUP_SCHEDULES or plan.pp == 1 or step.warmup is not None:
        return []
    p = plan.pp
    return list(dict.fromkeys([tuple([k] * (p - 1) + [0]) for k in (1, 2)] + [tuple(p - 1 - r for r in range(p))]))


def _tune_warmup(step: LLMStep, spaces: list["_PlanSpace"], best: Candidate,
                 stats: SearchStats, spread: bool = True) -> tuple[list[WarmupTried], Candidate]:
    """`best`'s plan on each warm-up depth of :func:`warmup_variants`: its spread layouts and (when
    `best` is a partition) that partition, within memory; returns what was tried and the best."""
    tried: list[WarmupTried] = []
    space = next(s for s in spaces if s.plan == best.plan)
    tp = step.config.llm_plan.tp
    for extra in warmup_variants(step):
        try:
            other = step.with_warmup(extra)
        except ValueError:  # the table deadlocks
            continue
        limit = step.config.memory_gb * GB
        bounds = [step_bound(other.timeline, s.load, tp, s.prefetch) for s in spaces
                  if float((np.repeat(other.memory, s.plan.lanes_per_stage) + s.work.lane_bytes([0] * s.plan.pipelines)).max())
                  <= limit]
        here = WarmupTried(extra=extra, step=other, bound=min(bounds, key=lambda b: b.step_time) if bounds else None)
        tried.append(here)
        if other.memory.max() > limit:
            stats.memory_pruned += 1
            continue
        tuned = _PlanSpace(other, best.plan, like=space)
        if tuned.step_bound.step_time >= best.step_time:
            stats.bound_pruned += 1
            continue
        layouts = [(tuned.spread_layout(h, t), (h, t)) for h, t in tuned.spread_choices()] if spread else []
        if best.layout is None:
            layouts.append(([i for i, n in enumerate(best.partition) for _ in range(n)], (0, 0)))
        for layout, spread in layouts:
            memory = tuned.layout_memory(layout)
            if memory > limit:
                stats.memory_pruned += 1
                continue
            stats.scheduled += 1
            cand = tuned.layout_candidate(layout, spread, memory)
            if here.best is None or cand.step_time < here.best.step_time:
                here.best = cand
        if here.best is not None and here.best.step_time < best.step_time:
            best = here.best
    return tried, best


def search(step: LLMStep, *, workers: int = 2, progress: Callable[[int, int], None] | None = None,
           keep: int = 1, warmup: bool = True, spread: bool = True) -> Search:
    """Finds the encoder plan and partition with the shortest step on the LLM step `step` (see the
    module docstring).

    `workers`: threads (the machine's cores are a good choice). `progress(done, total)` is called
    after each plan. `keep`: the bounds prune against the `keep`-th best plan so far, so that the
    best `keep` plans are all exact in :attr:`Search.top`. `warmup`: then try the best plan on other
    warm-up depths of the LLM's schedule (:func:`warmup_variants`); its best there replaces it in
    :attr:`Search.top` when shorter. `spread`: try the layouts that spread microbatches over every
    pipeline (False: partitions of whole microbatches only). ValueError
    when no plan fits the LLM's stages or memory.
    """
    keep = integer(keep, "keep", minimum=1)
    t0 = time.perf_counter()
    config, timeline = step.config, step.timeline
    plans = encoder_plans(config)
    if not plans:
        raise ValueError("encoders: no encoder plan fits the LLM plan (too few layers for its stages?)")
    if step.memory.max() > config.memory_gb * GB:
        raise ValueError(f"memory_gb: the LLM alone needs {step.memory.max() / GB:.1f} GB on its busiest GPU, "
                         f"more than {config.memory_gb:g}")
    windows = {lps: step.encoder_windows(lps) for lps in {p.lanes_per_stage for p in plans}}
    edges = edge_windows(timeline)
    spaces = [_PlanSpace(step, p, windows[p.lanes_per_stage], edges.repeated(p.lanes_per_stage)) for p in plans]
    microbatches = config.microbatches
    # the lowest bound first; among equal bounds the least encoder work (GPU time), which leaves the
    # most room in the bubbles: a good incumbent early lets the bounds prune the rest
    spaces.sort(key=lambda s: (s.plan_bound(microbatches), s.gpu_work))
    stats = SearchStats(plans=len(plans))
    lock = threading.Lock()
    results: list[tuple[float, int, Candidate]] = []  # (step, the plan's rank, candidate)
    coarse: list[Candidate] = []
    done = 0
    rank = {id(space): r for r, space in enumerate(spaces)}

    def incumbent() -> tuple[float, int]:
        with lock:
            if len(results) < keep:
                return (math.inf, 0)
            return sorted((step, r) for step, r, _ in results)[keep - 1]

    searched = {id(space): PlanSearched(plan=space.plan, bound=space.step_bound, states_fit=space.states_fit)
                for space in spaces}

    def run(space: _PlanSpace) -> None:
        nonlocal done
        even = even_split(microbatches, space.plan.pipelines)
        memory = space.memory(even)
        fits = memory <= space.memory_limit
        base = space.candidate(even, coarse=True, memory=memory)
        r = rank[id(space)]
        if (space.plan_bound(microbatches), r) >= incumbent():
            best, pruned = None, True
        else:
            best, pruned = _search_plan(space, microbatches, incumbent, stats, lock, spread=spread, rank=r), False
        if fits and (base.step_time, r) < ((best.step_time, r) if best is not None else incumbent()):
            best = space.in_every_bubble(base)  # the greedy filler is a heuristic: keep the better
        with lock:
            coarse.append(base)
            searched[id(space)].best = best
            if best is not None:
                results.append((best.step_time, r, best))
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
        leanest = min(s.memory(even_split(microbatches, s.plan.pipelines)) for s in spaces)
        raise ValueError(f"memory_gb: no encoder plan fits in {config.memory_gb:g} GB per GPU (the leanest "
                         f"even partition needs {leanest / GB:.1f} GB)")
    top = [cand for _, _, cand in sorted(results, key=lambda x: x[:2])]
    default_best = top[0]
    tried: list[WarmupTried] = []
    if warmup:
        tried, tuned = _tune_warmup(step, spaces, default_best, stats, spread)
        if tuned is not default_best:
            top[0] = tuned
    stats.seconds = time.perf_counter() - t0
    fitting = [c for c in coarse if c.memory_bytes <= config.memory_gb * GB] or coarse
    return Search(step=step, best=top[0], coarse=min(fitting, key=lambda c: (c.step_time, c.plan.pp_enc, c.plan.tp_enc)),
                  top=top,
                  stats=stats, plans=[searched[id(space)] for space in spaces], warmups=tried,
                  default_best=default_best)


__all__ = ["EXHAUSTIVE", "SHARE_STEPS", "Candidate", "PlanSearched", "Search", "SearchStats", "WarmupTried",
           "best_partition", "warmup_variants", "without_prefetch", "compositions", "edge_windows", "encoder_plans",
           "encoder_problem", "encoder_tp_ok", "encoder_work", "search"]
