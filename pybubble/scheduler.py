"""Scheduling encoder tasks into the bubbles (the C++ core), and the schedule format
(pybubble.schedule/1)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core
from .formats import PathOrDict, array, field, integer, number, read_document, write_document
from .problem import Problem

FORMAT = "pybubble.schedule/1"
POLICIES = ("greedy", "coarse")


@dataclass(frozen=True, slots=True, eq=False)
class Schedule:
    """Start times of every task in the LLM frame and the encoder -> LLM microbatch assignment."""

    step_time: float
    """max(horizon, last end) - min(0, first start) (us)."""
    shift_front: float
    """How much the step grows before 0 (us)."""
    shift_back: float
    """How much the step grows after the horizon (us)."""
    start: np.ndarray
    """Start of each task (us), float64."""
    assignment: np.ndarray
    """assignment[j]: the LLM microbatch that encoder microbatch j feeds, int64."""

    def to_dict(self) -> dict[str, Any]:
        """The schedule as a pybubble.schedule/1 document."""
        return {
            "format": FORMAT,
            "step_time": float(self.step_time),
            "shift_front": float(self.shift_front),
            "shift_back": float(self.shift_back),
            "start": [float(x) for x in self.start],
            "assignment": [int(x) for x in self.assignment],
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the schedule as pybubble.schedule/1 JSON."""
        write_document(path, self.to_dict())

    def hidden_fraction(self, problem: Problem) -> float:
        """Share of the encoder's compute time that runs inside the LLM step [0, horizon]
        (1.0 when there is no encoder compute)."""
        a = problem.arrays()
        compute = a["resource"] == 0
        d = a["duration"][compute]
        total = float(d.sum())
        if total == 0.0:
            return 1.0
        s = self.start[compute]
        inside = (s >= 0.0) & (s + d <= problem.horizon)
        return float(d[inside].sum()) / total


def _from_core(result: tuple) -> Schedule:
    start, assignment, step_time, shift_front, shift_back = result
    return Schedule(step_time=step_time, shift_front=shift_front, shift_back=shift_back,
                    start=start, assignment=assignment)


def _check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}")
    return policy


def schedule(problem: Problem, policy: str = "greedy") -> Schedule:
    """Schedules `problem`'s tasks into its bubbles with the C++ core.

    policy: ``greedy`` (default; encoder microbatches moved into the step's windows where they
    fit) or ``coarse`` (all forwards before the step, all backwards after it).
    """
    return _from_core(_core.Scheduler(problem.core).run(_check_policy(policy)))


def load_schedule(source: PathOrDict) -> Schedule:
    """Loads a pybubble.schedule/1 from a JSON file path or a parsed dict (structure only; use
    :func:`pybubble.validate` to check it against a problem)."""
    doc = read_document(source, FORMAT)
    start = [number(x, f"start[{i}]") for i, x in enumerate(array(field(doc, "start", ""), "start"))]
    assignment = [integer(x, f"assignment[{j}]")
                  for j, x in enumerate(array(field(doc, "assignment", ""), "assignment"))]
    return Schedule(
        step_time=number(field(doc, "step_time", ""), "step_time"),
        shift_front=number(field(doc, "shift_front", ""), "shift_front"),
        shift_back=number(field(doc, "shift_back", ""), "shift_back"),
        start=np.array(start, np.float64),
        assignment=np.array(assignment, np.int64),
    )
