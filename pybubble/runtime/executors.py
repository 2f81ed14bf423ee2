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
executor only runs it. Both executors answer the same calls, the :class:`Executor` protocol: what
differs between the host and a device is in these methods, so no caller asks which executor it
has. Those that mean nothing on a device do nothing there; the three kinds of wait
(:mod:`pybubble.runtime.waits`) ask the executor how to spend each wait (``pipeline_wait``,
``output_wait``, ``data_parallel_wait``, ``tp_wait``), and it calls back the wait's way for its
device (the ``waits`` argument: the caller, a ``PipelineWaits``, ``DataParallelWaits`` or
``TensorParallelWaits``; typed ``Any`` here so that the two modules do not import each other).
"""

from __future__ import annotations

import time
import contextlib
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Protocol

from torch.profiler import record_function

from ..measure import names
from . import torch_seams
from .cuda import SideStream
from .idle_worker import IdleWorker
from .task import FillTask

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from .probe import WorkProbe


def annotated(task: FillTask):
    """A torch.profiler annotation of ``task`` while the profiler records (``pybubble measure``
    counts the time in it busy), else nothing."""
    return record_function(names.task_name(task.name)) if torch_seams.profiler_enabled() else nullcontext()


class Executor(Protocol):
    """Where a step's tasks run, as the filler and the waits see it (:class:`HostExecutor`,
    :class:`CudaExecutor`)."""

    def run(self, task: FillTask) -> float:
        """Runs (or launches) ``task``; returns the time it takes from its window."""

    def settle(self) -> float | None:
        """Blocks until queued tasks have run; the seconds waited (None: nothing was queued)."""

    def offload(self, tasks: Sequence[FillTask]) -> tuple[int, float | None] | None:
        """Hands ``tasks`` (that the LLM needs now) to a worker and waits for them, where one is in
        use: (tasks queued, seconds waited or None); None: the caller runs them itself."""

    def join(self, needed_by: int) -> None:
        """Makes the forward tasks LLM microbatches <= ``needed_by`` need visible to the LLM."""

    def drain(self) -> None:
        """Makes everything run so far visible to the LLM."""

    def open_gap(self) -> None:
        """A new gap opens."""

    def may_fill(self, task: FillTask, horizon_s: float) -> bool:
        """Whether ``task`` may run in a wait of the step whose LLM frame ends at ``horizon_s``."""

    def blocked_s(self, seconds: float) -> float:
        """Of ``seconds`` this thread was blocked, what counts as the rank's idle time."""

    def spent_s(self, task: FillTask) -> float:
        """The time ``task`` took from its window (after it ran)."""

    def measured_s(self, task: FillTask) -> float:
        """``task``'s measured time (NaN where the executor does not time tasks)."""

    def record_trace(self, trace: list[tuple[str, float, float]]) -> None:
        """From now on (name, start, end) of the tasks run off this thread go to ``trace``."""

    def pipeline_wait(self, waits: Any, works: Sequence[dist.Work], gap_s: float, fill: bool) -> None:
        """Waits for a pipeline op's p2p ``works`` (predicted gap ``gap_s``), filling it when ``fill``."""

    def output_wait(self, waits: Any, probe: WorkProbe, arrival_s: float | None) -> None:
        """Inside the first stage's op: fills the wait for an encoder output from another rank."""

    def data_parallel_wait(self, waits: Any, works: Sequence[dist.Work], room_s: float,
                           entered: float) -> Any:
        """Waits for a data-parallel collective's ``works`` with ``room_s`` to fill."""

    def tp_wait(self, waits: Any, tensor: torch.Tensor, real_wait: Callable[[torch.Tensor], Any],
                guard: Callable[[], contextlib.AbstractContextManager], entered: float, launched: float) -> Any:
        """Waits for a TP collective whose result is ``tensor``; returns ``real_wait(tensor)``."""


class HostExecutor:
    """Runs tasks on the host: on the calling thread, or queued onto an idle worker."""

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

    def may_fill(self, task: FillTask, horizon_s: float) -> bool:
        """Any task may run in a wait: the host times what it runs."""
        return True

    def blocked_s(self, seconds: float) -> float:
        """All of it: the host's time blocked is the rank's idle time."""
        return seconds

    def spent_s(self, task: FillTask) -> float:
        """Its measured run."""
        return task.took_s or 0.0

    def measured_s(self, task: FillTask) -> float:
        """Its measured run."""
        return task.took_s

    def record_trace(self, trace: list[tuple[str, float, float]]) -> None:
        """The idle worker's tasks go to ``trace`` as they end."""
        self.trace = trace

    def pipeline_wait(self, waits: Any, works: Sequence[dist.Work], gap_s: float, fill: bool) -> None:
        """Runs tasks while the works are pending (when ``fill``), else blocks in them."""
        if fill:
            waits.fill_until_done(works, gap_s)
        else:
            waits.block(works)

    def output_wait(self, waits: Any, probe: WorkProbe, arrival_s: float | None) -> None:
        """Runs this rank's tasks while the output comes."""
        waits.wait_for([probe], arrival_s)

    def data_parallel_wait(self, waits: Any, works: Sequence[dist.Work], room_s: float,
                           entered: float) -> Any:
        """Runs tasks while the collective is pending (see :meth:`DataParallelWaits.fill_until_done`)."""
        return waits.fill_until_done(works, room_s, entered)

    def tp_wait(self, waits: Any, tensor: torch.Tensor, real_wait: Callable[[torch.Tensor], Any],
                guard: Callable[[], contextlib.AbstractContextManager], entered: float, launched: float) -> Any:
        """Queues pieces onto the idle worker, then blocks in the real wait."""
        return waits.queue_then_wait(self, tensor, real_wait, entered, launched)


class CudaExecutor:
    """Launches tasks onto a :class:`~pybubble.runtime.cuda.SideStream` (or any object with its
    ``launch``/``mark``/``join``/``drain``)."""

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

    def may_fill(self, task: FillTask, horizon_s: float) -> bool:
        """Only a task planned inside the step's frame: a launch is not timed, so a wait gives it
        the planned room only."""
        return task.planned_start_s < horizon_s

    def blocked_s(self, seconds: float) -> float:
        """None of it: the CPU's time blocked is not the device's idle time."""
        return 0.0

    def spent_s(self, task: FillTask) -> float:
        """Its measured duration (the launch is not timed)."""
        return task.duration_s

    def measured_s(self, task: FillTask) -> float:
        """NaN: the CPU's clock does not time the GPU's work."""
        return float("nan")

    def record_trace(self, trace: list[tuple[str, float, float]]) -> None:
        """Nothing runs off the main thread: the filler traces the launches."""

    def pipeline_wait(self, waits: Any, works: Sequence[dist.Work], gap_s: float, fill: bool) -> None:
        """Launches what fits in the gap (when ``fill``), then the current stream waits on the works."""
        if fill:
            waits.launch_into_gap(lambda: gap_s - self.gap_launched_s)
        for w in works:
            w.wait()

    def output_wait(self, waits: Any, probe: WorkProbe, arrival_s: float | None) -> None:
        """Nothing to fill: the output's arrival is a stream dependency."""

    def data_parallel_wait(self, waits: Any, works: Sequence[dist.Work], room_s: float,
                           entered: float) -> Any:
        """The works become the current stream's dependencies; nothing is measured (0 s)."""
        for w in works:
            w.wait()
        return None

    def tp_wait(self, waits: Any, tensor: torch.Tensor, real_wait: Callable[[torch.Tensor], Any],
                guard: Callable[[], contextlib.AbstractContextManager], entered: float, launched: float) -> Any:
        """Launches the pieces that fit in the measured gap, then the real wait orders the stream."""
        with guard():
            waits.launch_into_gap()
        return real_wait(tensor)


def executor_for(side: SideStream | None) -> Executor:
    """The executor of a runtime's device: on the host without a side stream, else on it."""
    return HostExecutor() if side is None else CudaExecutor(side)


__all__ = ["CudaExecutor", "Executor", "HostExecutor", "annotated", "executor_for"]
