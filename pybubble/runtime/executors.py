"""Where the filler's tasks run: one executor per device, behind one interface.

- :class:`HostExecutor` (CPU, gloo): a task runs on the rank's main thread while it would block in
  a wait, or is queued onto the :class:`~pybubble.runtime.idle_worker.IdleWorker` (the CPU's side
  stream: a thread the kernel runs only on a core that would idle) by the TP waits; a task's time
  is measured.
- :class:`CudaExecutor` (NCCL): a task's kernels are launched onto a lowest-priority
  :class:`~pybubble.runtime.cuda.SideStream`, ordered after the LLM's stream where its window opens;
  the LLM's stream waits for the forward tasks it consumes (events) and for everything at the end
  of the step. The CPU does not time the GPU's work: a task takes its measured duration.

The filler (:class:`~pybubble.runtime.filler.BubbleFiller`) decides which task runs when; the
executor only runs it. Both executors answer the same calls: :meth:`run`, :meth:`settle`,
:meth:`offload`, :meth:`join`, :meth:`drain`; those that mean nothing on a device do nothing there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext

from torch.profiler import record_function

from ..measure import names
from . import torch_seams
from .cuda import SideStream
from .idle_worker import IdleWorker
from .task import FillTask


def annotated(task: FillTask):
    """A torch.profiler annotation of ``task`` while the profiler records (``pybubble measure``
    counts the time in it busy), else nothing."""
    return record_function(names.task_name(task.name)) if torch_seams.profiler_enabled() else nullcontext()


class HostExecutor:
    """Runs tasks on the host: on the calling thread, or queued onto an idle worker."""

    timed = True
    """A task's time is measured (its run)."""

    def __init__(self) -> None:
        self.idle: IdleWorker | None = None
        """The idle worker tasks were queued onto in this step (None before any)."""
        self._queued: list[FillTask] = []
        self.trace: list[tuple[str, float, float]] | None = None
        """Where the idle worker's tasks are traced (the filler's trace)."""

    def run(self, task: FillTask) -> float:
        """Runs ``task`` on this thread; returns its time."""
        t = time.perf_counter()
        with annotated(task):
            task.run()
        task.done = task.finished = True
        task.took_s = time.perf_counter() - t
        return task.took_s

    def queue(self, task: FillTask, worker: IdleWorker) -> float:
        """Hands ``task`` to ``worker`` (it runs after the tasks queued before it, when a core would
        idle; its ``took_s`` is the worker thread's CPU time in it); returns its measured duration."""
        if self.idle is not None and worker is not self.idle:
            self.settle()
        self.idle = worker
        task.done = True
        self._queued.append(task)
        trace = self.trace

        def run() -> None:
            c, t = time.thread_time(), time.perf_counter()
            with annotated(task):
                task.run()
            task.took_s = time.thread_time() - c
            task.finished = True
            if trace is not None:
                trace.append((task.name, t, time.perf_counter()))

        worker.launch(run, task)
        return task.duration_s

    def queued_s(self) -> float:
        """The measured durations of the queued tasks not finished yet."""
        self._queued = [t for t in self._queued if not t.finished]
        return sum(t.duration_s for t in self._queued)

    def _wait(self, done: Callable[[], bool] | None) -> float:
        t = time.perf_counter()
        if done is None:
            self.idle.drain()
        else:
            self.idle.wait_until(done)
        return time.perf_counter() - t

    def settle(self) -> float | None:
        """Blocks until the queued tasks have run (the worker gets this thread's core meanwhile);
        returns the seconds it waited (None: nothing was queued). Raises what a task raised."""
        if self.idle is None or not self._queued:
            return None
        try:
            return self._wait(None)
        finally:
            self._queued.clear()

    def offload(self, tasks: Sequence[FillTask]) -> tuple[int, float | None] | None:
        """Once this step queued tasks onto the idle worker: ``tasks`` (forward tasks the LLM needs
        now) go onto it too, and this thread waits until they are finished (the worker's later
        tasks go on in the idle time to come). Returns (tasks queued here, seconds waited or None);
        None when this cannot be (no worker in use, or a task that must run on this thread)."""
        if self.idle is None or any(t.host_only and not t.done for t in tasks):
            return None
        fresh = [t for t in tasks if not t.done]
        for t in fresh:
            self.queue(t, self.idle)
        if all(t.finished for t in tasks):
            return len(fresh), None
        return len(fresh), self._wait(lambda: all(t.finished for t in tasks))

    def join(self, needed_by: int) -> None:
        """Nothing to order on the host: a task that ran here is finished."""

    def drain(self) -> None:
        """Nothing left on the host once settled."""

    def open_gap(self) -> None:
        """Nothing to reset: the host measures a gap with the clock."""


class CudaExecutor:
    """Launches tasks onto a :class:`~pybubble.runtime.cuda.SideStream` (or any object with its
    ``launch``/``mark``/``join``/``drain``)."""

    timed = False
    """A launch is not the task's time: it takes its measured duration."""

    def __init__(self, side: SideStream):
        self.side = side
        self.gap_launched_s = 0.0
        """The measured seconds of the tasks launched into the current gap."""
        self._marks: list[tuple[int, object]] = []

    def run(self, task: FillTask) -> float:
        """Launches ``task``; returns its measured duration."""
        self.side.launch(task.run)
        if task.needed_by is not None:
            self._marks.append((task.needed_by, self.side.mark()))
        self.gap_launched_s += task.duration_s
        task.done = True
        return task.duration_s

    def settle(self) -> None:
        """Nothing to wait for on the host."""

    def offload(self, tasks: Sequence[FillTask]) -> None:
        """No idle worker on CUDA."""

    def join(self, needed_by: int) -> None:
        """The current stream waits for the forward tasks LLM microbatches <= ``needed_by`` need."""
        rest = []
        for mb, mark in self._marks:
            if mb <= needed_by:
                self.side.join(mark)
            else:
                rest.append((mb, mark))
        self._marks = rest

    def drain(self) -> None:
        """The current stream waits for everything launched."""
        self.side.drain()
        self._marks.clear()

    def open_gap(self) -> None:
        """A new gap opens: nothing launched into it yet."""
        self.gap_launched_s = 0.0


def executor_for(side: SideStream | None) -> HostExecutor | CudaExecutor:
    """The executor of a runtime's device: on the host without a side stream, else on it."""
    return HostExecutor() if side is None else CudaExecutor(side)


__all__ = ["CudaExecutor", "HostExecutor", "annotated", "executor_for"]
