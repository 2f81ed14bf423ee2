"""The bubble filler: runs this rank's planned encoder tasks while the training loop waits.

CPU path (gloo): while a point-to-point or collective ``Work`` has not completed, run the next
planned task if it fits in what is left of the predicted idle gap, then look again. A task that
would overrun the gap is deferred to a later gap or to the end of the step; a forward task that a
later pipeline op depends on is forced before the rank blocks, so the step never deadlocks.

gloo's send/recv ``Work.is_completed()`` stays False until ``wait()`` is called, so completion is
observed by one waiter thread per work that blocks in ``wait()`` (which releases the GIL); the
main thread polls that thread's flag. This works for every backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch.distributed as dist


class WorkProbe:
    """Completion of one ``dist.Work`` that can be polled without blocking."""

    __slots__ = ("work", "_done", "_error", "_thread")

    def __init__(self, work: dist.Work):
        self.work = work
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        try:
            self.work.wait()
        except BaseException as e:  # re-raised on the main thread by result()
            self._error = e
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> None:
        """Blocks until the work completed; raises what its ``wait()`` raised."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"work not completed within {timeout} s")
        if self._error is not None:
            raise self._error


@dataclass(slots=True)
class FillTask:
    """One planned encoder task on this rank."""

    name: str
    duration_s: float
    """Measured duration, used to decide whether it fits in what is left of a gap."""
    planned_start_s: float
    """Start in the plan, LLM frame (0 = this rank enters the pipeline step)."""
    run: Callable[[], None]
    ready: Callable[[], bool] = lambda: True
    """False while an input from another rank (an output gradient) has not arrived."""
    wait_ready: Callable[[], None] = lambda: None
    """Blocks until ``ready()``."""
    needed_by: int | None = None
    """For forward tasks: the LLM microbatch whose first-stage forward needs this task's result."""
    done: bool = field(default=False)


@dataclass(slots=True)
class FillerStats:
    filled: int = 0
    filled_s: float = 0.0
    deferred: int = 0
    forced: int = 0
    waits: int = 0


class BubbleFiller:
    """Holds this rank's planned task order and runs tasks inside the waits of the step.

    ``gaps_s[n]``: predicted idle time before this rank's n-th pipeline op (the last entry: after
    its last op, up to the end of the step); ``next_ops[n]``: that op as (kind, microbatch).
    Tasks planned before 0 run in :meth:`run_front`, tasks planned at or after ``horizon_s`` in
    :meth:`drain`, the others inside waits.
    """

    def __init__(self, tasks: Sequence[FillTask], gaps_s: Sequence[float],
                 next_ops: Sequence[tuple[str, int]], horizon_s: float, fill: bool = True):
        if len(gaps_s) != len(next_ops) + 1:
            raise ValueError(f"gaps_s: {len(gaps_s)} gaps for {len(next_ops)} ops (need ops + 1)")
        self.tasks = sorted(tasks, key=lambda t: t.planned_start_s)
        self.gaps_s = list(gaps_s)
        self.next_ops = list(next_ops)
        self.horizon_s = horizon_s
        self.fill = fill
        self.stats = FillerStats()
        self._op = 0
        self._in_op = False
        self._gap_start = 0.0
        self._cursor = 0
        self.trace: list[tuple[str, float, float]] | None = None
        """When a list: (what, start, end) of every task, op and wait, perf_counter seconds."""
        self._op_start = 0.0

    # -- step structure -------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Marks frame 0: this rank enters the pipeline step."""
        self._op, self._in_op, self._gap_start = 0, False, time.perf_counter()

    def op_begin(self) -> None:
        self._in_op = True
        self._op_start = time.perf_counter()

    def op_end(self) -> None:
        self._in_op = False
        if self.trace is not None and self._op < len(self.next_ops):
            kind, mb = self.next_ops[self._op]
            self.trace.append((f"{kind}{mb}", self._op_start, time.perf_counter()))
        self._op += 1
        self._gap_start = time.perf_counter()

    # -- running tasks --------------------------------------------------------------------------
    def _run(self, task: FillTask) -> None:
        t = time.perf_counter()
        task.run()
        task.done = True
        if self.trace is not None:
            self.trace.append((task.name, t, time.perf_counter()))

    def _next(self) -> FillTask | None:
        while self._cursor < len(self.tasks) and self.tasks[self._cursor].done:
            self._cursor += 1
        return self.tasks[self._cursor] if self._cursor < len(self.tasks) else None

    def force(self, needed_by: int) -> None:
        """Runs every forward task that LLM microbatches <= ``needed_by`` depend on, in plan order."""
        for task in self.tasks:
            if not task.done and task.needed_by is not None and task.needed_by <= needed_by:
                self.stats.forced += 1
                self._run(task)

    def run_front(self) -> None:
        """Runs the tasks planned before the step (the step grows by shift_front)."""
        while (task := self._next()) is not None and task.planned_start_s < 0.0:
            task.wait_ready()
            self._run(task)

    def drain(self) -> None:
        """Runs every task left, in plan order, waiting for inputs from other ranks."""
        while (task := self._next()) is not None:
            task.wait_ready()
            self._run(task)

    def wait(self, works: Sequence[dist.Work]) -> None:
        """Waits for ``works``, running planned tasks while they are not complete."""
        works = [w for w in works if w is not None]
        if not works:
            return
        self.stats.waits += 1
        t = time.perf_counter()
        try:
            self._wait(works)
        finally:
            if self.trace is not None:
                self.trace.append(("wait", t, time.perf_counter()))

    def _wait(self, works: list[dist.Work]) -> None:
        if not self._in_op and self._op < len(self.next_ops):
            kind, mb = self.next_ops[self._op]
            # The op after this wait may depend (through other ranks) on stage 0's forward of
            # microbatch mb: produce what it needs before blocking.
            self.force(mb)
        if not self.fill or self._in_op or self._next() is None:
            for w in works:
                w.wait()
            return
        probes = [WorkProbe(w) for w in works]
        deadline = self._gap_start + self.gaps_s[min(self._op, len(self.gaps_s) - 1)]
        while not all(p.done() for p in probes):
            task = self._next()
            if task is None or not (0.0 <= task.planned_start_s < self.horizon_s) or not task.ready():
                break
            now = time.perf_counter()
            if now + task.duration_s > deadline:
                self.stats.deferred += 1
                break
            self._run(task)
            self.stats.filled += 1
            self.stats.filled_s += time.perf_counter() - now
        for p in probes:
            p.result()

    @property
    def remaining(self) -> int:
        return sum(not t.done for t in self.tasks)
