"""Scheduling encoder tasks into the bubbles (the C++ core), and the schedule format
(pybubble.schedule/1)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..config.checks import array, integer, number, one_of, required
from ..config.documents import PathOrDict, naming, read_document, write_document
from ..problem.problem import Problem

SCHEDULE_FORMAT = "pybubble.schedule/1"
"""The format key of a schedule document."""
POLICIES = ("greedy", "coarse", "holes")
"""How tasks are placed: kernel-level filling of the bubbles; all forwards before the step and all
backwards after it; or the greedy's filling into every free interval left (docs/scheduler.md)."""


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
        # + 0.0 turns -0.0 (a task the core placed at -0 us) into 0.0
        return {
            "format": SCHEDULE_FORMAT,
            "step_time": float(self.step_time) + 0.0,
            "shift_front": float(self.shift_front) + 0.0,
            "shift_back": float(self.shift_back) + 0.0,
            "start": (np.asarray(self.start, dtype=np.float64) + 0.0).tolist(),
            "assignment": [int(x) for x in self.assignment],
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the schedule as pybubble.schedule/1 JSON."""
        write_document(path, self.to_dict())

    def hidden_fraction(self, problem: Problem) -> float:
        """Share of the encoder's compute time that runs inside the LLM step [0, horizon]
        (1.0 when there is no encoder compute)."""
        t = problem.arrays().tasks
        compute = t.resource == 0
        d = t.duration[compute]
        total = float(d.sum())
        if total == 0.0:
            return 1.0
        s = self.start[compute]
        inside = (s >= 0.0) & (s + d <= problem.horizon)
        return float(d[inside].sum()) / total


def from_core(result: tuple) -> Schedule:
    """The schedule of the core's ``Scheduler.run`` result."""
    start, assignment, step_time, shift_front, shift_back = result
    return Schedule(step_time=step_time, shift_front=shift_front, shift_back=shift_back,
                    start=start, assignment=assignment)


def check_policy(policy: str) -> str:
    """`policy` if it is one of :data:`POLICIES`."""
    return one_of(policy, POLICIES, "policy")


HOLES_ORDERS: int = _core.HOLES_ORDERS
"""How many orders the ``holes`` policy tries (the core's; docs/scheduler.md: numbered 0-4)."""


def schedule_problem(problem: Problem, policy: str = "greedy", *, fixed_assignment: bool = False,
                     orders: Sequence[int] | None = None) -> Schedule:
    """Schedules `problem`'s tasks into its bubbles with the C++ core.

    policy: ``greedy`` (default; encoder microbatches moved into the step's windows where they
    fit), ``coarse`` (all forwards before the step, all backwards after it) or ``holes`` (the
    greedy's rules, each task in any free interval left on its lane and resource instead of after
    the lane's last task, in up to five orders, the shortest kept; slower, never passes over free time).
    fixed_assignment: encoder microbatch j feeds LLM microbatch j (data that varies per
    microbatch: its tasks' durations are those of its own data); by default the LLM microbatches
    take the encoder's microbatches in the order their forwards finish. orders: with ``holes``, the
    orders to try (numbers 0-4; an order that does not apply to the problem runs as order 2), the
    shortest kept; None: all five.
    """
    mask = (1 << HOLES_ORDERS) - 1
    if orders is not None:
        given = list(orders) if isinstance(orders, tuple) else array(orders, "orders")
        picked = [integer(o, "orders", minimum=0, maximum=HOLES_ORDERS - 1) for o in given]
        if not picked:
            raise ValueError(f"orders: empty, expected at least one of 0..{HOLES_ORDERS - 1}")
        mask = sum(1 << o for o in set(picked))
    return from_core(_core.Scheduler(problem.core).run(check_policy(policy), fixed_assignment=bool(fixed_assignment),
                                                       orders=mask))


def check_shape(schedule: Schedule) -> None:
    """ValueError unless `schedule`'s starts and assignment are one-dimensional (what the core reads)."""
    if np.ndim(schedule.start) != 1 or np.ndim(schedule.assignment) != 1:
        raise ValueError("start, assignment: expected one-dimensional arrays")


def justified(problem: Problem, schedule: Schedule) -> Schedule:
    """`schedule` (a valid schedule of `problem`, of any policy) justified by the C++ core: each
    phase's tasks packed towards the end of the step away from the one it grows (the forward from
    its first start, the backward up to its last end), then back, each task in turn by where the last
    pass put it, which closes the gaps a one-pass filler leaves between one chain's kernels and
    another's collectives (docs/scheduler.md, "Justification"). A phase's move is kept only where
    the step shrinks: never longer. ValueError when `schedule` is not a valid schedule of `problem`."""
    check_shape(schedule)
    core = _core.Scheduler(problem.core)
    return from_core(core.justify(schedule.start, schedule.assignment, schedule.step_time, schedule.shift_front,
                                  schedule.shift_back))


def holes_schedule(problem: Problem) -> tuple[Schedule, int]:
    """``schedule_problem(problem, "holes")`` and the order (0-4) that gave it."""
    core = _core.Scheduler(problem.core)
    schedule = from_core(core.run("holes"))
    return schedule, int(core.holes_order)


def load_schedule(source: PathOrDict) -> Schedule:
    """Loads a pybubble.schedule/1 from a JSON file path or a parsed dict (structure only; use
    :func:`pybubble.validate` to check it against a problem)."""
    doc = read_document(source, SCHEDULE_FORMAT)
    with naming(source):
        return _schedule(doc)


def _schedule(doc: Any) -> Schedule:
    start = [number(x, f"start[{i}]") for i, x in enumerate(array(required(doc, "start", ""), "start"))]
    assignment = [integer(x, f"assignment[{j}]")
                  for j, x in enumerate(array(required(doc, "assignment", ""), "assignment"))]
    return Schedule(
        step_time=number(required(doc, "step_time", ""), "step_time"),
        shift_front=number(required(doc, "shift_front", ""), "shift_front"),
        shift_back=number(required(doc, "shift_back", ""), "shift_back"),
        start=np.array(start, np.float64),
        assignment=np.array(assignment, np.int64),
    )


__all__ = ["HOLES_ORDERS", "SCHEDULE_FORMAT", "POLICIES", "Schedule", "check_policy", "check_shape", "from_core", "holes_schedule",
           "justified",
           "load_schedule", "schedule_problem"]
