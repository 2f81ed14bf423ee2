"""Justification (``pybubble.schedule.scheduler.justified``) in plain Python: slow and obvious, a
twin of the C++ core's ``csrc/pybubble/justify.cc``, which must give exactly the same schedule (the
differential tests).

The free intervals are the problem's windows (touching ones merged) with both ends of the step
open, less the other phase's tasks where they are (each cut out of whatever intervals it overlaps).
Then, per phase:

- forward (only where some forward task starts before 0): each task, by increasing ``(start, id)``,
  in the earliest free interval from the first forward start and its predecessors' new ends; then,
  from the same free intervals, each by decreasing ``(end of that pass, id)``, in the latest ending by
  ``forward_needed`` of the LLM microbatch its microbatch feeds, its successors' new starts and the
  starts of the backward tasks that follow it. Kept where the first start moved later;
- backward (only where some backward task ends after the horizon): each task, by decreasing
  ``(end, id)``, in the latest free interval ending by the last end and its successors' new starts,
  starting at or after ``grad_ready`` of its LLM microbatch (none: the phase stays); then each by
  increasing ``(start of that pass, id)``, in the earliest from that ``grad_ready`` and its
  predecessors' ends (the forward's where they are). Kept where the last end moved earlier.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ..problem.problem import Problem
from ..schedule.scheduler import Schedule
from ..schedule.validator import validate
from .holes import Free, earliest, latest, merged, open_back, open_front, take
from .reference import _Twin


def occupy(S: list[float], E: list[float], s: float, d: float) -> None:
    """Takes [s, s + d) out of whatever free intervals it overlaps."""
    if not d > 0.0:
        return
    end = s + d
    i = max(bisect.bisect_right(S, s) - 1, 0)
    while i < len(S) and S[i] < end:
        a, b = max(s, S[i]), min(end, E[i])
        if b > a:
            before = len(S)
            take(S, E, i, a, b - a)
            i += 1 + len(S) - before
        else:
            i += 1


class _Justify(_Twin):
    """One problem and one schedule as the core justifies it."""

    def __init__(self, problem: Problem, schedule: Schedule):
        super().__init__(problem)
        t = problem.arrays().tasks
        self.phase = [int(x) for x in t.phase]
        self.microbatch = [int(x) for x in t.microbatch]
        self.start = [float(x) for x in schedule.start]
        self.end = [s + d for s, d in zip(self.start, self.dur)]
        self.assignment = [int(x) for x in schedule.assignment]
        self.limit = [math.inf] * len(self.dur)  # the first start of a backward task after it
        for q in range(len(self.dur)):
            if self.phase[q] == 1:
                for p in self.preds[q]:
                    self.limit[p] = min(self.limit[p], self.start[q])

    def free(self, other: int) -> Free:
        """The windows, both ends open, less the tasks of phase `other`."""
        lists = {}
        for k, w in self.windows.items():
            S, E = (list(x) for x in merged(w))
            open_front(S, E)
            open_back(S, E, self.horizon)
            lists[k] = (S, E)
        for j in range(self.m):
            for q in self.tasks[(j, other)]:
                occupy(*lists[self.key[q]], self.start[q], self.dur[q])
        return Free(lists)

    def phase_tasks(self, ph: int) -> list[int]:
        """The tasks of phase `ph`, microbatch by microbatch."""
        return [q for j in range(self.m) for q in self.tasks[(j, ph)]]

    def forward(self) -> None:
        ts = self.phase_tasks(0)
        first = min([0.0] + [self.start[q] for q in ts])
        if not first < 0.0:
            return
        base = self.free(1)
        one, packed = base.trial(), {}  # pass 1 on a copy, pass 2 on base
        for q in sorted(ts, key=lambda q: (self.start[q], q)):
            ready = max([first] + [packed[p] + self.dur[p] for p in self.preds[q]])
            S, E = one.mut(self.key[q])
            i, s = earliest(S, E, ready, self.dur[q], math.inf)
            take(S, E, i, s, self.dur[q])
            packed[q] = s
        moved, new = 0.0, {}
        for q in sorted(ts, key=lambda q: (-(packed[q] + self.dur[q]), -q)):
            late = min(self.fn[self.assignment[self.microbatch[q]]], self.limit[q])
            for v in self.succs[q]:
                late = min(late, new[v])
            S, E = base.mut(self.key[q])
            i, s = latest(S, E, late, self.dur[q], -math.inf)
            take(S, E, i, s, self.dur[q])
            new[q] = s
            moved = min(moved, s)
        if moved > first:
            for q in ts:
                self.start[q], self.end[q] = new[q], new[q] + self.dur[q]

    def backward(self) -> None:
        ts = self.phase_tasks(1)
        last = max([self.horizon] + [self.end[q] for q in ts])
        if not last > self.horizon:
            return
        base = self.free(0)
        one, packed = base.trial(), {}  # pass 1 on a copy, pass 2 on base
        ready_of = [self.gr[self.assignment[j]] for j in range(self.m)]
        for q in sorted(ts, key=lambda q: (-self.end[q], -q)):
            late = last
            for v in self.succs[q]:
                late = min(late, packed[v])
            S, E = one.mut(self.key[q])
            fit = latest(S, E, late, self.dur[q], ready_of[self.microbatch[q]])
            if fit is None:
                return
            take(S, E, fit[0], fit[1], self.dur[q])
            packed[q] = fit[1]
        moved, new = self.horizon, {}
        for q in sorted(ts, key=lambda q: (packed[q], q)):
            ready = ready_of[self.microbatch[q]]
            for p in self.preds[q]:
                ready = max(ready, new[p] + self.dur[p] if self.phase[p] == 1 else self.end[p])
            S, E = base.mut(self.key[q])
            i, s = earliest(S, E, ready, self.dur[q], math.inf)
            take(S, E, i, s, self.dur[q])
            new[q] = s
            moved = max(moved, s + self.dur[q])
        if moved < last:
            for q in ts:
                self.start[q], self.end[q] = new[q], new[q] + self.dur[q]


def reference_justified(problem: Problem, schedule: Schedule) -> Schedule:
    """The same schedule as ``pybubble.schedule.scheduler.justified(problem, schedule)``, in plain
    Python."""
    wrong = validate(problem, schedule)
    if wrong:
        raise ValueError(f"schedule: not valid for the problem: {wrong[0]}")
    twin = _Justify(problem, schedule)
    twin.forward()
    twin.backward()
    first, last = min([0.0] + twin.start), max([twin.horizon] + twin.end)
    return Schedule(step_time=last - first, shift_front=-first, shift_back=last - twin.horizon,
                    start=np.array(twin.start, np.float64), assignment=np.array(twin.assignment, np.int64))


__all__ = ["occupy", "reference_justified"]
