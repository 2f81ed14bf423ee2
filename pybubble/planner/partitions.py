"""The layouts of one encoder plan searched for the shortest step: its spread layouts, then its
partitions of whole microbatches over the encoder pipelines, all of them when there are few (at
most :data:`EXHAUSTIVE` compositions), otherwise a local search from the even partition that moves
one microbatch at a time between pipelines, trying the moves in order of their bound, until no
move improves the step. A layout is scheduled only when its bound beats the best step so far (the
plan's own or the search's incumbent) and it fits in memory; :class:`SearchStats` counts what was
scheduled and what was pruned. Times are microseconds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..llm.step import LLMStep, even_split
from ..problem.encoder import EncoderPlan
from .candidate import Candidate
from .space import PlanSpace

EXHAUSTIVE = 256
"""Partitions are enumerated whole up to this many compositions; above, local search."""


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


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write `total` as an ordered sum of `parts` non-negative integers."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total, -1, -1):
        for rest in compositions(total - first, parts - 1):
            yield (first, *rest)


Incumbent = Callable[[], tuple[float, int]]
"""The (step, rank) of the candidate to beat, read when a layout is considered (other threads may
have lowered it)."""


class _PlanLayouts:
    """One plan's layouts as :func:`best_layout` tries them: the best so far, the best partition
    (from which the local search moves), the partitions seen and the counts for the stats.
    `whole_incumbent`: partitions are pruned against it and the plan's best partition instead of the
    best of any layout (the search for the best partition of whole microbatches, Optimus's)."""

    def __init__(self, space: PlanSpace, incumbent: Incumbent, rank: int, whole_incumbent: Incumbent | None = None):
        self.space, self.incumbent, self.rank, self.whole_incumbent = space, incumbent, rank, whole_incumbent
        self.best: Candidate | None = None
        self.whole: Candidate | None = None
        self.seen: set[tuple[int, ...]] = set()
        self.counts = {"scheduled": 0, "bound_pruned": 0, "memory_pruned": 0}
        self.whole_alone = whole_incumbent is not None
        """Whether :attr:`whole` is the plan's best partition as :func:`best_partition` finds it: no
        partition was pruned by another plan's (only by this plan's best partition)."""

    def beaten(self, bound: float, whole: bool = False) -> bool:
        """Whether no layout whose bound is `bound` can beat the incumbent or the plan's best (with
        `whole`, a partition: against the whole incumbent and the plan's best partition, when given)."""
        incumbent, own = self.incumbent, self.best
        if whole and self.whole_incumbent is not None:
            incumbent, own = self.whole_incumbent, self.whole
        mine = (own.step_time, self.rank) if own is not None else (math.inf, self.rank)
        pruned = (bound, self.rank) >= min(incumbent(), mine)
        if pruned and whole and (bound, self.rank) < mine:
            self.whole_alone = False
        return pruned

    def keep(self, cand: Candidate) -> None:
        """Keeps `cand` when it is the plan's best so far."""
        if self.best is None or cand.step_time < self.best.step_time:
            self.best = cand

    def spread(self) -> None:
        """Schedules the spread layouts (:meth:`PlanSpace.spread_choices`) that fit in memory, while
        the plan's bound can beat the best so far."""
        space = self.space
        for head, tail in space.spread_choices():
            if self.beaten(space.step_bound.step_time):
                break
            layout = space.spread_layout(head, tail)
            memory = space.layout_memory(layout)
            if memory > space.memory_limit:
                self.counts["memory_pruned"] += 1
                continue
            self.counts["scheduled"] += 1
            self.keep(space.layout_candidate(layout, (head, tail), memory))

    def consider(self, partition: tuple[int, ...]) -> bool:
        """Schedules `partition` unless pruned; True when it became the best partition."""
        space = self.space
        if partition in self.seen:
            return False
        self.seen.add(partition)
        if self.beaten(space.bound(partition), whole=True):
            self.counts["bound_pruned"] += 1
            return False
        memory = space.memory(partition)
        if memory > space.memory_limit:
            self.counts["memory_pruned"] += 1
            return False
        self.counts["scheduled"] += 1
        cand = space.candidate(partition, memory=memory)
        self.keep(cand)
        if self.whole is None or cand.step_time < self.whole.step_time:
            self.whole = cand
            return True
        return False

    def partitions(self, microbatches: int) -> None:
        """Every partition of `microbatches` in order of bound when there are few, else the local
        search from the even partition."""
        space, m = self.space, self.space.plan.pipelines
        if math.comb(microbatches + m - 1, m - 1) <= EXHAUSTIVE:
            # in order of bound: good partitions first make the bound prune more of the rest
            for partition in sorted(compositions(microbatches, m), key=space.bound):
                self.consider(partition)
            return
        self.consider(tuple(even_split(microbatches, m)))  # when it is pruned, so is the local search
        improved = self.whole is not None
        while improved:
            improved = False
            assert self.whole is not None
            for partition in sorted(space.moves(self.whole), key=space.bound):
                improved |= self.consider(partition)


def best_layout(space: PlanSpace, microbatches: int, incumbent: Incumbent,
                stats: SearchStats, lock: threading.Lock, spread: bool = True, rank: int = 0) -> Candidate | None:
    """The best layout of one plan (its spread layouts unless `spread` is False, then its
    partitions), or None when none fits in memory or beats `incumbent`: the (step, rank) of the
    candidate to beat, the plan's `rank` breaking ties between equal steps (the lower wins), so the
    threads' timing does not decide between plans that tie (often at their bound). Adds what it
    scheduled and pruned to `stats` (under `lock`)."""
    return plan_layouts(space, microbatches, incumbent, stats, lock, spread=spread, rank=rank)[0]


def plan_layouts(space: PlanSpace, microbatches: int, incumbent: Incumbent, stats: SearchStats,
                 lock: threading.Lock, spread: bool = True, rank: int = 0,
                 whole_incumbent: Incumbent | None = None) -> tuple[Candidate | None, Candidate | None, bool]:
    """:func:`best_layout`, the plan's best partition of whole microbatches, and whether that
    partition is :func:`best_partition`'s for the plan. With `whole_incumbent`, the partitions are
    pruned against it (the best partition of the plans so far) and the plan's best partition only,
    so that the second is exact whatever the spread layouts reach: the search with partitions only
    (``spread=False``) would find the same; the third says whether no other plan's partition
    pruned any of its partitions (then it is :func:`best_partition`'s)."""
    layouts = _PlanLayouts(space, incumbent, rank, whole_incumbent)
    if spread:
        layouts.spread()
    layouts.partitions(microbatches)
    with lock:
        stats.scheduled += layouts.counts["scheduled"]
        stats.bound_pruned += layouts.counts["bound_pruned"]
        stats.memory_pruned += layouts.counts["memory_pruned"]
    return layouts.best, layouts.whole, layouts.whole_alone


def best_partition(step: LLMStep, plan: EncoderPlan) -> Candidate | None:
    """`plan`'s best partition on `step`, every microbatch whole (no spread): the search's partition
    search for that plan alone (None when no partition fits in memory)."""
    space = PlanSpace(step, plan)
    return best_layout(space, step.config.microbatches, lambda: (math.inf, 0), SearchStats(), threading.Lock(),
                       spread=False)


__all__ = ["EXHAUSTIVE", "Incumbent", "SearchStats", "best_layout", "best_partition", "compositions", "plan_layouts"]
