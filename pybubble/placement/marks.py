"""Data-parallel replicas that wait for each other: each rank's predicted marks in its step (where
its collectives meet those of the other replicas) and the step of replicas in lockstep."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..config.checks import finite
from .measured import MeasuredCosts
from .step_placement import US, Placement, shift_front_s


def step_marks_s(plan: Placement, rank: int, costs: MeasuredCosts) -> np.ndarray:
    """Seconds from the step's start at which ``rank`` is predicted to begin each of its LLM ops (in
    the order they run), to end its last op, and to end the step's compute (the pipeline and the
    encoder's tasks, before the encoder's gradient sync): where its data-parallel collectives meet
    those of the other replicas (:func:`lockstep_s`). In megatron mode with chunks that vary per
    microbatch, the first stage's ops carry their own microbatch's encoder work (its timeline holds
    the mean): the marks after them move by what they carry over the mean."""
    ops = [op for op in plan.timeline.ops if op.rank == rank]
    if not ops:
        raise ValueError(f"rank: {rank} runs no op of the plan's {len(plan.timeline.ops)}")
    starts = np.array([op.start for op in ops], dtype=np.float64) / US
    end = ops[-1].end / US
    if plan.mode == "megatron" and plan.chunks and rank == plan.first_stage:
        over = np.asarray(plan.chunks, np.float64) - float(np.mean(plan.chunks))
        backward = "W" if any(op.kind == "W" for op in ops) else "B"  # where the timeline put the encoder's backward
        per = {"F": sum(costs.piece_fwd_s), backward: sum(costs.piece_bwd_s)}
        carried = np.array([over[op.microbatch] * per.get(op.kind, 0.0) if op.stage == 0 else 0.0 for op in ops])
        moved = np.concatenate([[0.0], np.cumsum(carried)])
        starts, end = starts + moved[:-1], end + moved[-1]
    front = shift_front_s(plan)
    compute = (plan.timeline.step_time if plan.schedule is None else plan.schedule.step_time) / US
    return np.concatenate([front + starts, [front + end, max(compute, front + end)]])

def lockstep(marks: np.ndarray | Sequence[Sequence[float]], meets_s: Sequence[float]) -> tuple[float, np.ndarray]:
    """:func:`lockstep_s`'s compute and :func:`lockstep_waits_s`'s waits, from one pass."""
    marks = np.asarray(marks, dtype=np.float64)
    if marks.ndim != 2 or marks.shape[0] < 1 or marks.shape[1] < 2:
        raise ValueError(f"marks: shape {marks.shape} is not one row per replica of n ops + 2 marks")
    n = marks.shape[1] - 2
    if len(meets_s) != n + 1:
        raise ValueError(f"meets_s: {len(meets_s)} values for {n} ops (need {n + 1})")
    for r, k in np.argwhere(~np.isfinite(marks))[:1]:
        finite(float(marks[r, k]), f"marks[{r}][{k}]")
    own = {k: finite(v, f"meets_s[{k}]", minimum=0.0) for k, v in enumerate(meets_s)
           if not (isinstance(v, (float, np.floating)) and math.isnan(v))}
    total, before = 0.0, np.zeros(len(marks))
    waits = np.full((len(marks), n + 1), np.nan)
    for k in [*own, n + 1]:
        stretch = marks[:, k] - before
        total += float(stretch.max()) + own.get(k, 0.0)
        if k <= n:
            waits[:, k] = stretch.max() - stretch
        before = marks[:, k]
    return total, waits

def lockstep_s(marks: np.ndarray | Sequence[Sequence[float]], meets_s: Sequence[float]) -> float:
    """The step's compute (s) of data-parallel replicas that wait for each other at their
    collectives: ``marks`` one row per replica, the :func:`step_marks_s` of the same rank in each
    (n ops, the last op's end, the compute's end); ``meets_s`` n + 1 values: where the replicas'
    collectives meet, at op k's start (k = n: after the last op), the collectives' time there
    beyond the replicas' waits for each other (NaN: none). The replicas also meet at the compute's
    end (the encoder's gradient sync over them). Each stretch up to a meeting takes as long as its
    slowest replica, then the collectives' time. With one replica and no meeting: its compute's
    end."""
    return lockstep(marks, meets_s)[0]

def lockstep_waits_s(marks: np.ndarray | Sequence[Sequence[float]], meets_s: Sequence[float]) -> np.ndarray:
    """How long each replica is predicted to wait for the slowest at each place where they meet
    (:func:`lockstep_s`'s arguments): one row per replica, one column per op and one after the
    last; NaN where they do not meet (the collectives' own time not included)."""
    return lockstep(marks, meets_s)[1]
