"""Checking a schedule against its problem: the C++ validator, which shares no code with the
scheduler."""

from __future__ import annotations

from .. import _core
from ..problem.problem import Problem
from .scheduler import Schedule, check_shape

TIME_TOLERANCE: float = _core.TIME_TOLERANCE
"""Slack (us) in every time comparison of the validator."""


def validate(problem: Problem, schedule: Schedule) -> list[str]:
    """Every violation of `schedule` against `problem` as a sentence; an empty list means valid.

    Raises ValueError when the schedule does not fit the problem's shape (wrong number of starts or
    assignment entries).
    """
    check_shape(schedule)
    return _core.validate(problem.core, schedule.start, schedule.assignment, schedule.step_time,
                          schedule.shift_front, schedule.shift_back)
