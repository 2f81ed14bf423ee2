"""Other warm-up depths of the LLM's pipeline schedule tried for the search's best plan
(Optimus's adjustment, :meth:`LLMStep.with_warmup`): the early ranks run further ahead, their
warm-up bubble moves into the cool-down, where the encoder's backward waits for room. Times are
microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..costs.memory import GB
from ..llm.step import WARMUP_SCHEDULES, LLMStep
from .bound import StepBound, step_bound
from .candidate import Candidate
from .partitions import SearchStats
from .space import PlanSpace


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
    plan_bounds: list[tuple[PlanSpace, StepBound]] = field(default_factory=list)
    """Each plan whose model states fit on it (its space on the config's step), with its bound there."""


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



def warmup_bounds(other: LLMStep, spaces: list[PlanSpace]) -> list[tuple[PlanSpace, StepBound]]:
    """Each plan of `spaces` whose model states fit on the warm-up step `other`, with its bound there."""
    limit, tp = other.config.memory_gb * GB, other.config.llm_plan.tp
    return [(s, step_bound(other.timeline, s.load, tp, s.prefetch)) for s in spaces
            if float((np.repeat(other.memory, s.plan.lanes_per_stage) + s.work.lane_bytes([0] * s.plan.pipelines)).max())
            <= limit]


def tune_warmup(step: LLMStep, spaces: list[PlanSpace], best: Candidate,
                stats: SearchStats, spread: bool = True) -> tuple[list[WarmupTried], Candidate]:
    """`best`'s plan on each warm-up depth of :func:`warmup_variants`: its spread layouts and (when
    `best` is a partition) that partition, within memory; returns what was tried and the best."""
    tried: list[WarmupTried] = []
    space = next(s for s in spaces if s.plan == best.plan)
    # `best` as the search left it: a partition is tried on every depth, whichever depth wins
    whole = [i for i, n in enumerate(best.partition) for _ in range(n)] if best.layout is None else None
    for extra in warmup_variants(step):
        try:
            other = step.with_warmup(extra)
        except ValueError:  # the table deadlocks
            continue
        limit = step.config.memory_gb * GB
        fits = warmup_bounds(other, spaces)
        here = WarmupTried(extra=extra, step=other, bound=min((b for _, b in fits), key=lambda b: b.step_time, default=None),
                           plan_bounds=fits)
        tried.append(here)
        if other.memory.max() > limit:
            stats.memory_pruned += 1
            continue
        tuned = PlanSpace(other, best.plan, like=space)
        if tuned.step_bound.step_time >= best.step_time:
            stats.bound_pruned += 1
            continue
        layouts = [(tuned.spread_layout(h, t), (h, t)) for h, t in tuned.spread_choices()] if spread else []
        if whole is not None:
            layouts.append((whole, (0, 0)))
        for layout, spread_counts in layouts:
            memory = tuned.layout_memory(layout)
            if memory > limit:
                stats.memory_pruned += 1
                continue
            stats.scheduled += 1
            cand = tuned.layout_candidate(layout, spread_counts, memory)
            if here.best is None or cand.step_time < here.best.step_time:
                here.best = cand
        if here.best is not None and here.best.step_time < best.step_time:
            best = here.best
    return tried, best



__all__ = ["WarmupTried", "tune_warmup", "warmup_bounds", "warmup_variants"]
