"""The bubble filler: runs this rank's planned encoder tasks while the training loop waits.

CPU path (gloo): while a point-to-point or collective ``Work`` has not completed, run the next
planned task if it fits in what is left of the predicted idle gap, then look again. A task that
would overrun the gap is deferred to a later gap or to the end of the step; a forward task that a
later pipeline op depends on is forced before the rank blocks, so the step never deadlocks.

gloo's send/recv ``Work.is_completed()`` stays False until ``wait()`` is called, so completion is
observed by one waiter thread per work that blocks in ``wait()`` (which releases the GIL); the
main thread polls that thread's flag. This works for every backend.

CUDA path (NCCL, a :class:`~pybubble.runtime.cuda.SideStream`): the CPU does not block in
``wait()``, so the filler enqueues instead of running: at a wait, the next planned tasks go onto
the side stream, ordered after the LLM's stream at that point (where its window opens), as long as
their measured durations fit in what is left of the gap's predicted length; then the LLM's stream
waits on the works. The order, the deferral and the forcing are the same code as on the CPU; only
the measure of what is left of a gap differs (the clock on the CPU, the durations already launched
into the gap on CUDA).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch.distributed as dist

from .cuda import SideStream


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
    """Ran (CPU) or was launched on the side stream (CUDA)."""


@dataclass(slots=True)
class FillerStats:
    filled: int = 0
    """Tasks run (launched, on CUDA) inside waits."""
    filled_s: float = 0.0
    """Their time: measured on the CPU; on CUDA their measured durations (the launch is not timed)."""
    deferred: int = 0
    forced: int = 0
    waits: int = 0


class BubbleFiller:
    """Holds this rank's planned task order and runs tasks inside the waits of the step.

    ``gaps_s[n]``: predicted idle time before this rank's n-th pipeline op (the last entry: after
    its last op, up to the end of the step); ``next_ops[n]``: that op as (kind, microbatch).
    Tasks planned before 0 run in :meth:`run_front`, tasks planned at or after ``horizon_s`` in
    :meth:`drain`, the others inside waits.

    ``side``: None runs the tasks on the host (CPU path); a :class:`~pybubble.runtime.cuda.SideStream`
    (or any object with its ``launch``/``mark``/``join``/``drain``) launches them on it (CUDA
    path): a task is then "done" once launched, :meth:`force` makes the current stream wait for
    the forward tasks it needs and :meth:`drain` for everything.
    """

    def __init__(self, tasks: Sequence[FillTask], gaps_s: Sequence[float],
                 next_ops: Sequence[tuple[str, int]], horizon_s: float, fill: bool = True,
                 side: SideStream | None = None):
        if len(gaps_s) != len(next_ops) + 1:
            raise ValueError(f"gaps_s: {len(gaps_s)} gaps for {len(next_ops)} ops (need ops + 1)")
        self.tasks = sorted(tasks, key=lambda t: t.planned_start_s)
        self.gaps_s = list(gaps_s)
        self.next_ops = list(next_ops)
        self.horizon_s = horizon_s
        self.fill = fill
        self.side = side
        self.stats = FillerStats()
        self._op = 0
        self._in_op = False
        self._gap_start = 0.0
        self._gap_launched_s = 0.0
        """CUDA: measured seconds of the tasks launched into the current gap."""
        self._forward_marks: list[tuple[int, object]] = []
        """CUDA: (needed_by, side-stream event after that forward task) not joined yet."""
        self._cursor = 0
        self.trace: list[tuple[str, float, float]] | None = None
        """When a list: (what, start, end) of every task, op and wait, perf_counter seconds."""
        self._op_start = 0.0

    # -- step structure -------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Marks frame 0: this rank enters the pipeline step."""
        self._op, self._in_op, self._gap_start = 0, False, time.perf_counter()
        self._gap_launched_s = 0.0

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
        self._gap_launched_s = 0.0

    # -- running tasks --------------------------------------------------------------------------
    def _run(self, task: FillTask) -> float:
        """Runs ``task`` (CPU) or launches it on the side stream (CUDA); returns the time it takes
        from its window: measured on the CPU, its measured duration on CUDA."""
        t = time.perf_counter()
        if self.side is None:
            task.run()
        else:
            self.side.launch(task.run)
            if task.needed_by is not None:
                self._forward_marks.append((task.needed_by, self.side.mark()))
            self._gap_launched_s += task.duration_s
        task.done = True
        end = time.perf_counter()
        if self.trace is not None:
            self.trace.append((task.name, t, end))  # on CUDA: the launch, not the kernels
        return end - t if self.side is None else task.duration_s

    def _next(self) -> FillTask | None:
        while self._cursor < len(self.tasks) and self.tasks[self._cursor].done:
            self._cursor += 1
        return self.tasks[self._cursor] if self._cursor < len(self.tasks) else None

    def _run_needed(self, needed_by: int) -> None:
        """Runs (launches, on CUDA) every forward task that LLM microbatches <= ``needed_by``
        depend on and that has not run, in plan order."""
        for task in self.tasks:
            if not task.done and task.needed_by is not None and task.needed_by <= needed_by:
                self.stats.forced += 1
                self._run(task)

    def force(self, needed_by: int) -> None:
        """Runs every forward task that LLM microbatches <= ``needed_by`` depend on, in plan order.
        On CUDA the current stream then waits for them (an event after each), so the op that
        consumes their output next on that stream sees it."""
        self._run_needed(needed_by)
        if self.side is not None:
            rest = []
            for mb, mark in self._forward_marks:
                if mb <= needed_by:
                    self.side.join(mark)
                else:
                    rest.append((mb, mark))
            self._forward_marks = rest

    def run_front(self) -> None:
        """Runs the tasks planned before the step (the step grows by shift_front)."""
        while (task := self._next()) is not None and task.planned_start_s < 0.0:
            task.wait_ready()
            self._run(task)

    def drain(self) -> None:
        """Runs every task left, in plan order, waiting for inputs from other ranks. On CUDA the
        current stream then waits for everything launched on the side stream."""
        while (task := self._next()) is not None:
            task.wait_ready()
            self._run(task)
        if self.side is not None:
            self.side.drain()
            self._forward_marks.clear()

    def wait(self, works: Sequence[dist.Work]) -> None:
        """Waits for ``works``, running planned tasks while they are not complete (on CUDA: launches
        the tasks that fit in the gap, then the current stream waits on the works)."""
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
            self._run_needed(mb)
        if self.fill and not self._in_op and self._next() is not None:
            gap_s = self.gaps_s[min(self._op, len(self.gaps_s) - 1)]
            if self.side is None:
                # CPU: run tasks while the works are pending, each if it ends by the gap's end.
                probes = [WorkProbe(w) for w in works]
                deadline = self._gap_start + gap_s
                self._fill(lambda: deadline - time.perf_counter(), lambda: not all(p.done() for p in probes))
                for p in probes:
                    p.result()
                return
            # CUDA: the works are stream dependencies and the window opens here on the LLM's
            # stream: launch what fits in what the gap's earlier launches left of it.
            self._fill(lambda: gap_s - self._gap_launched_s, lambda: True)
        for w in works:
            w.wait()

    def _fill(self, room_s: Callable[[], float], pending: Callable[[], bool]) -> None:
        """While ``pending()``: runs the next task in plan order if it is planned inside the step,
        its input has arrived and its measured duration fits in ``room_s()`` (seconds left of the
        gap); a task that does not fit is deferred and ends the filling, as does one that is not
        ready."""
        while pending():
            task = self._next()
            if task is None or not (0.0 <= task.planned_start_s < self.horizon_s) or not task.ready():
                return
            if task.duration_s > room_s():
                self.stats.deferred += 1
                return
            self.stats.filled_s += self._run(task)
            self.stats.filled += 1

    @property
    def remaining(self) -> int:
        return sum(not t.done for t in self.tasks)
