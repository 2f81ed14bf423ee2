"""Where a rank is in its step: which of its LLM ops runs or comes next, when the current gap
opened, how late the last input arrived against the plan, and how much of the time between two
ops was the LLM's own (the rest: waits and encoder tasks).

:class:`StepProgress` is driven by the torch adapters (a stage's op begins and ends; a wait is
entered) and read by the filler's policy; it runs nothing itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from torch.profiler import record_function

from ..measure import names
from ..placement.plan import PlannedOp


class StepProgress:
    """One rank's progress through its ``ops`` (:class:`~pybubble.placement.plan.PlannedOp`, in the
    order they run) in one step."""

    def __init__(self, ops: Sequence[PlannedOp], on_gap: Callable[[], None] = lambda: None):
        self.ops = list(ops)
        self.on_gap = on_gap
        """Called when a gap opens (the step begins, an op ends)."""
        self.op_busy_s: list[float] = [0.0] * len(self.ops)
        """The LLM's own time of each op: from its start to the next op's start, less the waits
        and encoder tasks in between (the schedule's bookkeeping after an op counts as its own)."""
        self.lead_busy_s = 0.0
        """The LLM's own time before the first op (the schedule's set-up)."""
        self.op_clock: Callable[[], float] = time.perf_counter
        """The clock of the ops' own time (on CUDA, for a profiling step: one that synchronizes
        the device first)."""
        self.trace: list[tuple[str, float, float]] | None = None
        """When a list: (what, start, end) of every task, op and wait, perf_counter seconds."""
        self.begin_step()

    def begin_step(self, frame0: float | None = None) -> None:
        """Marks the frame origin (default: now): the time the ops' planned starts count from."""
        now = time.perf_counter()
        self.frame0 = now if frame0 is None else frame0
        """The step's frame origin, ``time.perf_counter()`` seconds."""
        self.op_index = 0
        """The index of the op running or next (``len(ops)`` after the last)."""
        self.in_op = False
        """Whether one of the LLM's ops is running."""
        self.gap_start = now
        """When the current gap opened."""
        self.drift = 0.0
        """Seconds the last observed arrival came after its prediction."""
        self._op_start = now
        self._mark, self._excluded = now, 0.0
        self.in_wait = False
        """Whether the LLM is inside a wait (:meth:`waiting`)."""
        self.on_gap()

    @property
    def next_op(self) -> PlannedOp | None:
        """The op this rank runs next (or is running); None after its last."""
        return self.ops[self.op_index] if self.op_index < len(self.ops) else None

    def exclude(self, seconds: float) -> None:
        """``seconds`` spent outside any wait on the encoder's work: not the LLM op's own time."""
        if not self.in_wait:
            self._excluded += seconds

    def _close_busy(self, now: float) -> None:
        busy = max(0.0, now - self._mark - self._excluded)
        if self.op_index == 0:
            self.lead_busy_s = busy
        elif self.op_index - 1 < len(self.op_busy_s):
            self.op_busy_s[self.op_index - 1] = busy
        self._mark, self._excluded = now, 0.0

    def op_begin(self) -> None:
        """Marks the start of one of the LLM's ops (no task runs inside it)."""
        self.in_op = True
        self._op_start = self.op_clock()
        self._close_busy(self._op_start)

    def op_end(self) -> None:
        """Marks the end of one of the LLM's ops (the next gap begins)."""
        self.in_op = False
        if self.trace is not None and (op := self.next_op) is not None:
            self.trace.append((f"{op.action.kind}{op.action.microbatch}", self._op_start, time.perf_counter()))
        self.op_index += 1
        self.gap_start = time.perf_counter()
        self.on_gap()

    def end_pipeline(self) -> None:
        """Marks the end of the pipeline's part of the step (closes the last op's own time)."""
        self._close_busy(self.op_clock())

    def deadline(self, arrival_s: float | None, gap_s: float) -> float:
        """The predicted end of the current gap (perf_counter seconds): the predicted arrival
        (``arrival_s`` after the frame origin, moved by the drift seen at the last arrival), or
        ``gap_s`` after the gap opened."""
        return self.gap_start + gap_s if arrival_s is None else self.frame0 + arrival_s + self.drift

    def arrived(self, arrival_s: float, at: float) -> None:
        """What was predicted ``arrival_s`` after the frame origin arrived at ``at``."""
        self.drift = at - (self.frame0 + arrival_s)

    @contextmanager
    def waiting(self, label: str, annotation: str = names.WAIT) -> Iterator[float]:
        """The block is a wait of the LLM (yields ``time.perf_counter()`` at its start): annotated
        for torch.profiler with ``annotation``, traced as ``label``, and left out of the op's own
        time; a wait inside another (a TP wait inside a pipeline wait, a data-parallel one inside an
        op's TP wait) leaves that to the enclosing one."""
        t = time.perf_counter()
        outer = self.in_wait
        self.in_wait = True
        try:
            with record_function(annotation):
                yield t
        finally:
            self.in_wait = outer
            end = time.perf_counter()
            if not outer:
                self._excluded += end - t
            if self.trace is not None:
                self.trace.append((label, t, end))


__all__ = ["StepProgress"]
