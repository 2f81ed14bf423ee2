"""One encoder plan's space of layouts on an LLM step: the bounds that prune it, the memory of each
layout, the layouts that spread microbatches over every pipeline, and each layout scheduled into
the step's bubbles as a :class:`~pybubble.planner.candidate.Candidate`.

Bounds (see :mod:`pybubble.planner.search`): a plan's, ``horizon + max(0, (M · W - F) / L)``, with
M microbatches of W compute each, F the compute-free time of its L lanes; a partition's, ``horizon +
max over lanes (work on the lane - free time on the lane)``. The coarse policy's windows are the
leading and trailing bubbles of each rank (:func:`edge_windows`). Times are microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..costs.memory import GB
from ..llm.step import LLMStep, even_split
from ..llm.timeline import Timeline, Windows
from ..problem.arrays import Tasks
from ..problem.encoder import EncoderPlan
from ..problem.problem import Problem, prefetched_needs
from ..schedule.scheduler import holes_schedule, schedule_problem
from .bound import StepBound, encoder_load, image_piece_tasks, least_costs, piece_costs, step_bound, whole_image_bound
from .candidate import Candidate, encoder_work
from .short_windows import long_windows, piece_runs, short_theta, short_window_bound
from .stage_waits import stage_chains, staged_bound

SHARE_STEPS = 1000
"""A spread microbatch's shares are whole weights out of this many (split_images rounds them to
whole images)."""


def edge_windows(timeline: Timeline) -> Windows:
    """Per rank, the compute-free windows before its first LLM action starts and after its last one
    ends: the bubbles that coarse-grained exploitation fills (the DP all-gather and PP warm-up; the PP
    cool-down and DP reduce-scatter)."""
    o = timeline.op_columns
    first = np.full(timeline.ranks, np.inf)
    last = np.full(timeline.ranks, -np.inf)
    np.minimum.at(first, o["rank"], o["start"])
    np.maximum.at(last, o["rank"], o["end"])
    free = timeline.compute_free
    rank = np.repeat(np.arange(free.lanes), np.diff(free.offset))
    keep = (free.end <= first[rank]) | (free.start >= last[rank])
    counts = np.bincount(rank[keep], minlength=free.lanes)
    return Windows(offset=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                   start=free.start[keep], end=free.end[keep])



class PlanSpace:
    """One encoder plan's layouts on an LLM step: bounds, memory, and scheduling."""

    def __init__(self, step: LLMStep, plan: EncoderPlan, windows: tuple[Windows, Windows] | None = None,
                 edges: Windows | None = None, like: "PlanSpace | None" = None, prefetch: int | None = None):
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
            self._pieces = like._pieces
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
            self._pieces: list[tuple | None] = []  # the work's piece costs, least_costs and runs per theta, once known (shared with `like`)
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
        self._bubbles: Problem | None = None
        self._whole: StepBound | None = None  # whole_image_bound() on this space's own step, once known

    @property
    def bubbles(self) -> Problem:
        """The problem of every bubble with no task: each layout's problem is this one with its
        tasks (:meth:`Problem.with_tasks`: the windows checked once, shared by every candidate)."""
        if self._bubbles is None:
            self._bubbles = Problem.on_timeline(self.step.timeline, Tasks.empty(), self.plan.lanes_per_stage,
                                                self.windows, prefetch=self.prefetch)
        return self._bubbles

    def partition_problem(self, partition: Sequence[int]) -> Problem:
        """The problem of `partition` in every bubble (:meth:`EncoderWork.problem`: the pipelines'
        one-microbatch blocks, checked once, copied per microbatch)."""
        return self.work.problem(self.bubbles, partition)

    def whole_image_bound(self, on: tuple[LLMStep, StepBound] | None = None) -> StepBound:
        """:attr:`step_bound` tightened by whole images lane by lane (:func:`~pybubble.planner.bound.whole_image_bound`,
        one encoder or several of as many images each), then, with one encoder, by the windows too
        short for its long kernels (:func:`~pybubble.planner.short_windows.short_window_bound`), then, with several encoder
        stages, by each stage waiting for the ones after it (:func:`~pybubble.planner.stage_waits.staged_bound`);
        or, with `on` (another LLM step, a warm-up depth, and this plan's bound there), that bound
        tightened. Costs a piece's tasks per image count with one encoder (several: their sums from
        one layer's kernels, :meth:`EncoderWork.piece_compute`), once per work (and once more per
        short-window length; on this space's own step, the bound once): the search asks it of the least
        bounds only, and the re-fill of a plan whose shaped layout may be within its gap
        (:mod:`~pybubble.planner.refill`)."""
        if on is None and self._whole is not None:
            return self._whole
        if not self._pieces:
            # a piece's tasks for one encoder's short windows (piece_runs); several encoders need only their costs
            tasks = image_piece_tasks(self.work) if len(self.work.images) == 1 else None
            costs = piece_costs(self.work, tasks)
            self._pieces.append(None if costs is None else (costs, least_costs(costs, self.step.config.microbatches),
                                                            tasks, {}))
        got = self.step_bound if on is None else on[1]
        step = self.step if on is None else on[0]
        if on is None:
            windows, need, ready = self.windows[0], self.forward_needed, self.grad_ready
        else:
            windows = on[0].encoder_windows(self.plan.lanes_per_stage)[0]
            need, ready = prefetched_needs(on[0].timeline, self.prefetch)
        theta = short_theta(self.work, windows) if self._pieces[0] is not None or self.plan.pp_enc > 1 else None
        if self._pieces[0] is not None:
            costs, least, tasks, runs = self._pieces[0]
            lanes = [np.array([self.plan.lane(i, e) for i in range(self.plan.pipelines)])
                     for e in range(self.plan.pp_enc)]
            got = whole_image_bound(got, least, self.work.images[0], windows, need, ready, lanes)
            if theta is not None and len(self.work.images) == 1:  # piece_runs: one encoder's spine
                if theta not in runs:
                    runs[theta] = piece_runs(self.work, theta, tasks)
                got = short_window_bound(got, costs, runs[theta], theta, windows, need, ready, lanes)
        if self.plan.pp_enc > 1:
            ranks = step.timeline.compute_free
            got = staged_bound(got, self.load, stage_chains(self.work, theta), ranks,
                               ranks if theta is None else long_windows(ranks, theta), need, ready,
                               self.step.config.llm_plan.tp)
        if on is None:
            self._whole = got
        return got

    def plan_bound(self, microbatches: int) -> float:
        """A lower bound on the step of any schedule of this plan: the work that fits in no bubble
        spread over every lane, or :attr:`step_bound` when the config's microbatches are meant."""
        total = microbatches * float(self.per_mb.sum()) / self.plan.pipelines  # same work per microbatch
        spill = self.horizon + max(0.0, (total - float(self.free.sum())) / len(self.free))
        return max(spill, self.step_bound.step_time) if microbatches == self.step.config.microbatches else spill

    def bound(self, partition: Sequence[int]) -> float:
        """A lower bound on the step of `partition`: the horizon grown by the most work any lane
        has beyond its free time."""
        over = np.asarray(partition, np.float64) @ self.per_mb - self.free
        return self.horizon + max(0.0, float(over.max()))

    def moves(self, cand: Candidate, donors: int = 2, receivers: int = 3) -> list[tuple[int, ...]]:
        """Partitions one microbatch away from `cand`'s: from the pipelines whose lanes run most
        encoder work outside the step to those that run least (the guided neighbourhood)."""
        lane, dur = self.work.lanes_durations(cand.partition)  # its problem's tasks' (ids in the same order)
        start = cand.schedule.start
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
        if coarse:
            problem = Problem.on_timeline(self.step.timeline, self.work.tasks(partition), self.plan.lanes_per_stage,
                                          (self.edges, self.windows[1]), prefetch=0)
        else:
            problem = self.partition_problem(partition)
        return Candidate(plan=self.plan, partition=list(partition), problem=problem, schedule=schedule_problem(problem),
                         memory_bytes=self.memory(partition) if memory is None else memory, bound=self.step_bound,
                         step=self.step)

    def layout_candidate(self, layout: list[int | tuple[int, ...]], spread: tuple[int, int],
                         memory: float | None = None, policy: str = "greedy", problem: Problem | None = None) -> Candidate:
        """`layout` (:meth:`EncoderWork.layout_tasks`) scheduled into every bubble by the filler
        `policy` (:func:`~pybubble.schedule.scheduler.schedule_problem`); its `partition` counts the
        whole microbatches per pipeline. `problem`: the layout's problem, when already made."""
        if problem is None:
            problem = self.bubbles.with_tasks(self.work.layout_tasks(layout))
        partition = self.layout_partition(layout)
        schedule, order = holes_schedule(problem) if policy == "holes" else (schedule_problem(problem, policy), None)
        return Candidate(plan=self.plan, partition=partition, problem=problem, schedule=schedule,
                         memory_bytes=self.layout_memory(layout) if memory is None else memory, spread=spread,
                         layout=layout, bound=self.step_bound, step=self.step, policy=policy, holes_order=order)

    def layout_partition(self, layout: list[int | tuple[int, ...]]) -> list[int]:
        """The whole microbatches of `layout` per pipeline (a :class:`Candidate`'s ``partition``)."""
        return [sum(1 for p in layout if p == i) for i in range(self.plan.pipelines)]

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
        problem = self.partition_problem(cand.partition)
        return Candidate(plan=cand.plan, partition=cand.partition, problem=problem, schedule=cand.schedule,
                         memory_bytes=cand.memory_bytes, bound=cand.bound, step=cand.step)




def layout_entry(counts: Sequence[int]) -> int | tuple[int, ...]:
    """One microbatch's entry of a layout (:meth:`EncoderWork.layout_tasks`) from its images per
    pipeline `counts`: the pipeline that holds them all, else the counts."""
    held = np.flatnonzero(counts)
    return int(held[0]) if len(held) == 1 else tuple(int(c) for c in counts)


def _share_of(room: np.ndarray) -> tuple[int, ...]:
    """Whole weights in proportion to each pipeline's free time `room` (negative counts as none;
    all alike when no pipeline has any)."""
    r = np.clip(np.asarray(room, np.float64), 0.0, None)
    if r.max() <= 0.0:
        return tuple([1] * len(r))
    return tuple(int(x) for x in np.round(r / r.max() * SHARE_STEPS))



def without_prefetch(cand: Candidate) -> Candidate:
    """`cand`'s layout on its LLM step with every encoder forward in its own step (no prefetch)."""
    space = PlanSpace(cand.step, cand.plan, prefetch=0) if cand.step else None
    if space is None:
        raise ValueError("candidate: it has no LLM step")
    if cand.layout is not None:
        return space.layout_candidate(cand.layout, cand.spread)
    return space.candidate(cand.partition)


__all__ = ["SHARE_STEPS", "PlanSpace", "edge_windows", "layout_entry", "without_prefetch"]
