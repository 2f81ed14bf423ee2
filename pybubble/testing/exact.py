"""The shortest step any valid schedule of a problem reaches, from OR-Tools CP-SAT.

The greedy scheduler is a heuristic; this module states the same problem as a constraint program
and asks CP-SAT for its optimum, so that a schedule can be measured against it: the tests compare
the greedy with it on tiny problems, and ``bench/plan_ceiling.py`` asks how much any schedule of
a real step could gain. The model is the core's: each task in one free window of its lane's
resource (its start's domain: the windows that hold it, with holes between), after its
predecessors, no two tasks of a lane's resource at once nor with the LLM's work there (the time
between the windows, as fixed intervals in the same no-overlap: redundant with the domains, it lets
CP-SAT's scheduling reasoning count the lane's busy time and prove bounds sooner), an encoder
microbatch's forward tasks done before the LLM microbatch it feeds needs them and its backward
tasks after that microbatch's gradient is ready (the microbatches' assignment free, a
permutation, or given), tasks before the step's frame allowed (the step grows by them); the
objective is the span from the first task's start (or the frame's) to the last end (or the
horizon's).

:func:`within` asks the decision question instead (is there a schedule within a given step?), which
CP-SAT often settles far sooner than the optimum.

CP-SAT needs integer times: they are multiplied by ``scale`` and must then be whole
(``round_times=False``, for problems built on a grid) or are rounded (the error is at most half a
unit per task). OR-Tools is a test dependency (``pip install pybubble[test]``), imported when
called.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config.checks import finite
from ..problem.arrays import ProblemArrays
from ..problem.problem import Problem
from ..schedule.scheduler import Schedule


@dataclass(frozen=True, slots=True)
class Exact:
    """CP-SAT's answer for one problem, in the problem's time unit (us)."""

    step_time: float
    """The best step found (the optimum when :attr:`optimal`)."""
    bound: float
    """A lower bound of every schedule's step (equal to :attr:`step_time` when optimal)."""
    optimal: bool
    """Whether CP-SAT proved :attr:`step_time` optimal within its budget."""
    schedule: Schedule
    """The schedule of :attr:`step_time` (us; on the rounded times where ``round_times`` rounded
    them, so that the core's validator may then find a task a rounding error off its window)."""


def _free_intervals(offset: np.ndarray, start: np.ndarray, end: np.ndarray, lane: int, horizon: int,
                    big: int) -> list[tuple[int, int]]:
    """The lane's free intervals: before the frame, its windows, after the horizon (touching ones merged)."""
    b, e = int(offset[lane]), int(offset[lane + 1])
    ivs = [(-big, 0), *((int(s), int(w)) for s, w in zip(start[b:e], end[b:e])), (horizon, big)]
    merged: list[tuple[int, int]] = []
    for lo, hi in ivs:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _integers(values: np.ndarray, scale: float, round_times: bool, name: str) -> np.ndarray:
    scaled = np.asarray(values, np.float64) * scale
    if not round_times and not np.allclose(scaled, np.round(scaled), atol=1e-9):
        raise ValueError(f"{name}: times x scale {scale} are not whole numbers (round_times=True rounds them)")
    return np.round(scaled).astype(np.int64)


def optimum(problem: Problem, *, scale: float = 1.0, round_times: bool = False,
            assignment: Sequence[int] | None = None, max_deterministic_time: float = 100.0,
            workers: int = 1) -> Exact:
    """CP-SAT's best step for ``problem`` (see the module's notes): ``assignment[j]``, the LLM
    microbatch encoder microbatch j feeds (None: any permutation); ``max_deterministic_time``:
    CP-SAT's budget in its own deterministic units (the same on every machine, not seconds)."""
    from ortools.sat.python import cp_model

    model, start, feeds, first, last, horizon = _model(problem, scale, round_times, assignment)
    model.Minimize(last - first)
    solver = _solver(max_deterministic_time, workers)
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT found no schedule within max_deterministic_time {max_deterministic_time} "
                           f"({solver.StatusName(status)})")
    m = problem.num_microbatches
    chosen = [int(assignment[j]) if feeds is None else next(k for k in range(m) if solver.Value(feeds[j][k]))
              for j in range(m)]
    schedule = Schedule(step_time=solver.ObjectiveValue() / scale, shift_front=-solver.Value(first) / scale,
                        shift_back=(solver.Value(last) - horizon) / scale,
                        start=np.array([solver.Value(s) for s in start], np.float64) / scale,
                        assignment=np.array(chosen, np.int64))
    return Exact(step_time=schedule.step_time, bound=solver.BestObjectiveBound() / scale,
                 optimal=status == cp_model.OPTIMAL, schedule=schedule)


def within(problem: Problem, limit: float, *, scale: float = 1.0, round_times: bool = False,
           assignment: Sequence[int] | None = None, max_deterministic_time: float = 100.0,
           workers: int = 1) -> bool | None:
    """Whether some schedule of ``problem`` has a step of at most ``limit`` (us; on the times as
    scaled, and rounded with ``round_times``): True where CP-SAT finds one, False where it proves
    there is none, None where its budget runs out first (arguments as :func:`optimum`'s). The
    question is often settled far sooner than the optimum: ``bench/plan_gap.py --within`` asks it of
    every layout to prove that no schedule comes within a share of the plans' lower bound."""
    from ortools.sat.python import cp_model

    finite(limit, "limit")
    model, _, _, first, last, _ = _model(problem, scale, round_times, assignment)
    model.Add(last - first <= int(np.floor(limit * scale + 1e-9)))
    status = _solver(max_deterministic_time, workers).Solve(model)
    return True if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else False if status == cp_model.INFEASIBLE else None


def _model(problem: Problem, scale: float, round_times: bool, assignment: Sequence[int] | None) -> tuple:
    """The constraint program of ``problem`` (see the module's notes), checked arguments: (model,
    the tasks' starts, the assignment's booleans or None, the first start, the last end, the horizon)."""
    from ortools.sat.python import cp_model

    finite(scale, "scale", minimum=0.0)
    if scale <= 0.0:
        raise ValueError(f"scale: {scale} is not > 0")
    arr, m = problem.arrays(), problem.num_microbatches
    if assignment is not None and sorted(int(k) for k in assignment) != list(range(m)):
        raise ValueError(f"assignment: {list(assignment)!r} is not a permutation of 0..{m - 1}")
    ints = _scaled_times(arr, scale, round_times)
    horizon, dur = int(ints["horizon"][0]), ints["duration"].tolist()
    big = horizon + sum(dur) + 1
    model = cp_model.CpModel()
    start = _placed_tasks(model, arr, ints, big)
    feeds = _deadlines(model, arr, m, start, ints, assignment)
    first, last = model.NewIntVar(-big, 0, "first"), model.NewIntVar(horizon, 2 * big, "last")
    for i, d in enumerate(dur):
        model.Add(first <= start[i])
        model.Add(last >= start[i] + d)
    return model, start, feeds, first, last, horizon


def _solver(max_deterministic_time: float, workers: int) -> Any:
    """A CP-SAT solver with its budget (deterministic units) and workers."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_deterministic_time = max_deterministic_time
    return solver


def _scaled_times(arr: ProblemArrays, scale: float, round_times: bool) -> dict[str, np.ndarray]:
    """The problem's times times `scale`, as integers, by name."""
    t = arr.tasks
    return {name: _integers(v, scale, round_times, name) for name, v in (
        ("horizon", [arr.horizon]), ("forward_needed", arr.forward_needed), ("grad_ready", arr.grad_ready),
        ("duration", t.duration), ("compute_start", arr.compute_free.start), ("compute_end", arr.compute_free.end),
        ("link_start", arr.link_free.start), ("link_end", arr.link_free.end))}


def _placed_tasks(model: Any, arr: ProblemArrays, ints: dict[str, np.ndarray], big: int) -> list[Any]:
    """Each task's start in `model`: in one free interval of its lane's resource that holds it (the
    start's domain, with holes), after its predecessors, no two tasks of a lane's resource at once."""
    from ortools.sat.python import cp_model

    t, horizon, dur = arr.tasks, int(ints["horizon"][0]), ints["duration"].tolist()
    free: dict[tuple[int, int], list[tuple[int, int]]] = {}  # per (lane, resource): its merged free intervals
    by_key: dict[tuple[int, int], list] = {}
    start = []
    for i, d in enumerate(dur):
        key = (int(t.lane[i]), int(t.resource[i]))
        if key not in free:
            prefix, windows = ("compute", arr.compute_free) if key[1] == 0 else ("link", arr.link_free)
            free[key] = _free_intervals(windows.offset, ints[f"{prefix}_start"], ints[f"{prefix}_end"], key[0],
                                        horizon, big)
        fits = [[lo, hi - d] for lo, hi in free[key] if hi - lo >= d]
        start.append(model.NewIntVarFromDomain(cp_model.Domain.FromIntervals(fits), f"s{i}"))
        by_key.setdefault(key, []).append(model.NewFixedSizeIntervalVar(start[i], d, ""))
        for p in t.after[t.after_offset[i]:t.after_offset[i + 1]]:
            model.Add(start[int(p)] + dur[int(p)] <= start[i])
    for key, ivs in by_key.items():
        busy = [model.NewFixedSizeIntervalVar(hi, lo - hi, "") for (_, hi), (lo, _) in zip(free[key], free[key][1:])]
        model.AddNoOverlap(ivs + busy)  # the LLM's busy time, redundant with the windows: CP-SAT reasons on it
    return start


def _deadlines(model: Any, arr: ProblemArrays, m: int, start: list[Any], ints: dict[str, np.ndarray],
               assignment: Sequence[int] | None) -> list[list[Any]] | None:
    """Each encoder microbatch's forward tasks done by the ``forward_needed`` of the LLM microbatch
    it feeds, its backward tasks after that one's ``grad_ready``: under `assignment`, or under a
    permutation of the model's choosing (None; returns its booleans, ``[j][k]``: j feeds k)."""
    t, dur = arr.tasks, ints["duration"].tolist()
    need, ready = ints["forward_needed"].tolist(), ints["grad_ready"].tolist()
    if assignment is None:
        x = [[model.NewBoolVar("") for _ in range(m)] for _ in range(m)]
        for j in range(m):
            model.AddExactlyOne(x[j])
            model.AddExactlyOne(x[i][j] for i in range(m))
    for i, d in enumerate(dur):
        j = int(t.microbatch[i])
        for k in (range(m) if assignment is None else [int(assignment[j])]):
            rule = (model.Add(start[i] + d <= need[k]) if t.phase[i] == 0 else model.Add(start[i] >= ready[k]))
            if assignment is None:
                rule.OnlyEnforceIf(x[j][k])
    return x if assignment is None else None


__all__ = ["Exact", "optimum", "within"]
