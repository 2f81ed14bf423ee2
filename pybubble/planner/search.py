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
from ..llm.step import LLMStep, even_split
from ..llm.timeline import Timeline, Windows
from ..problem.encoder import EncoderPlan, EncoderWork
from ..problem.problem import Problem
from ..schedule.scheduler import Schedule, schedule_problem

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

    @property
    def step_time(self) -> float:
        """The scheduled step (us)."""
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

    def __init__(self, step: LLMStep, plan: EncoderPlan, windows: tuple[Windows, Windows],
                 edges: Windows | None = None):
        self.step, self.plan, self.windows = step, plan, windows
        self.edges = edges if edges is not None else edge_windows(step.timeline).repeated(plan.lanes_per_stage)
        self.work = encoder_work(step, plan)
        lanes = plan.pp_llm * plan.lanes_per_stage
        self.free = windows[0].free_time()
        # compute work per lane of one microbatch on each pipeline
        self.per_mb = np.zeros((plan.pipelines, lanes))
        for i in range(plan.pipelines):
            t = self.work.microbatch_tasks(i)
            compute = t.resource == 0
            self.per_mb[i] = np.bincount(t.lane[compute], weights=t.duration[compute], minlength=lanes)
        self.horizon = step.timeline.step_time
        self.memory_limit = step.config.memory_gb * GB

    def plan_bound(self, microbatches: int) -> float:
        total = microbatches * float(self.per_mb.sum()) / self.plan.pipelines  # same work per microbatch
        return self.horizon + max(0.0, (total - float(self.free.sum())) / len(self.free))

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
                                      windows)
        return Candidate(plan=self.plan, partition=list(partition), problem=problem, schedule=schedule_problem(problem),
                         memory_bytes=self.memory(partition) if memory is None else memory)

    def in_every_bubble(self, cand: Candidate) -> Candidate:
        """A coarse candidate with the problem of every bubble (its schedule is valid there too)."""
        problem = Problem.on_timeline(self.step.timeline, self.work.tasks(cand.partition), self.plan.lanes_per_stage,
                                      self.windows)
        return Candidate(plan=cand.plan, partition=cand.partition, problem=problem, schedule=cand.schedule,
                         memory_bytes=cand.memory_bytes)


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
        consider(tuple(even_split(microbatches, m)))  # when it is pruned, so is the plan
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


def search(step: LLMStep, *, workers: int = 2, progress: Callable[[int, int], None] | None = None,
           keep: int = 1) -> Search:
    """Finds the encoder plan and partition with the shortest step on the LLM step `step` (see the
    module docstring).

    `workers`: threads (the machine's cores are a good choice). `progress(done, total)` is called
    after each plan. `keep`: the bounds prune against the `keep`-th best plan so far, so that the
    best `keep` plans are all exact in :attr:`Search.top`. ValueError when no plan fits the LLM's
    stages or memory.
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
    spaces.sort(key=lambda s: s.plan_bound(microbatches))
    stats = SearchStats(plans=len(plans))
    lock = threading.Lock()
    results: list[Candidate] = []
    coarse: list[Candidate] = []
    done = 0

    def incumbent() -> float:
        with lock:
            if len(results) < keep:
                return math.inf
            return sorted(c.step_time for c in results)[keep - 1]

    def run(space: _PlanSpace) -> None:
        nonlocal done
        even = even_split(microbatches, space.plan.pipelines)
        memory = space.memory(even)
        fits = memory <= space.memory_limit
        base = space.candidate(even, coarse=True, memory=memory)
        if space.plan_bound(microbatches) >= incumbent():
            best, pruned = None, True
        else:
            best, pruned = _search_plan(space, microbatches, incumbent, stats, lock), False
        if fits and base.step_time < (best.step_time if best is not None else incumbent()):
            best = space.in_every_bubble(base)  # the greedy filler is a heuristic: keep the better
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
        leanest = min(s.memory(even_split(microbatches, s.plan.pipelines)) for s in spaces)
        raise ValueError(f"memory_gb: no encoder plan fits in {config.memory_gb:g} GB per GPU (the leanest "
                         f"even partition needs {leanest / GB:.1f} GB)")
    results.sort(key=lambda c: c.step_time)
    stats.seconds = time.perf_counter() - t0
    fitting = [c for c in coarse if c.memory_bytes <= config.memory_gb * GB] or coarse
    return Search(step=step, best=results[0], coarse=min(fitting, key=lambda c: c.step_time), top=results,
                  stats=stats)


__all__ = ["EXHAUSTIVE", "Candidate", "Search", "SearchStats", "compositions", "edge_windows", "encoder_plans",
           "encoder_problem", "encoder_tp_ok", "encoder_work", "search"]
