"""The bubble filler: runs this rank's planned encoder tasks while the training loop waits.

CPU path (gloo): while a point-to-point or collective ``Work`` has not completed, run the next
planned task if it fits in what is left of the predicted idle gap, then look again. A task that
would overrun the gap is deferred to a later gap or to the end of the step; a forward task that a
later pipeline op depends on is forced before the rank blocks, so the step never deadlocks.

gloo's send/recv ``Work.is_completed()`` stays False until ``wait()`` is called, so completion is
observed by a waiter thread (of a shared pool) per work that blocks in ``wait()`` (which releases
the GIL); the main thread polls its future. This works for every backend.

CUDA path (NCCL, a :class:`~pybubble.runtime.cuda.SideStream`): the CPU does not block in
``wait()``, so the filler enqueues instead of running: at a wait, the next planned tasks go onto
the side stream, ordered after the LLM's stream at that point (where its window opens), as long as
their measured durations fit in what is left of the gap's predicted length; then the LLM's stream
waits on the works. The order, the deferral and the forcing are the same code as on the CPU; only
the measure of what is left of a gap differs (the clock on the CPU, the durations already launched
into the gap on CUDA).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.profiler import record_function

from . import torch_seams
from .cuda import SideStream
from .idle_worker import IdleWorker


_WAIT = "pybubble:wait"
"""The profiler annotation of a wait (``pybubble measure`` counts the time in it as idle, less
the tasks run in it)."""


class WorkProbe:
    """Completion of one ``dist.Work`` that can be polled without blocking: a waiter thread of a
    shared pool blocks in its ``wait()`` (which releases the GIL). The pool's threads live on, so
    a probe costs a queue hand-off, not a thread start (which waits for the GIL: up to
    ``sys.getswitchinterval()`` on a busy host)."""

    __slots__ = ("work", "_future", "done_at")
    _pool: ThreadPoolExecutor | None = None

    def __init__(self, work: dist.Work):
        self.work = work
        self.done_at = 0.0
        """``time.perf_counter()`` when the work completed (its waiter returned)."""
        if WorkProbe._pool is None:
            # Enough waiters for every receive a step posts at once (each blocks one until it arrives).
            WorkProbe._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="pybubble-probe")
        self._future = WorkProbe._pool.submit(self._wait)

    def _wait(self) -> None:
        try:
            self.work.wait()
        finally:
            self.done_at = time.perf_counter()

    def done(self) -> bool:
        """Whether the awaited work has completed."""
        return self._future.done()

    @staticmethod
    def wait_all(probes: Sequence["WorkProbe"], until: float) -> None:
        """Blocks until every probe completed or ``time.perf_counter()`` reaches ``until``."""
        futures_wait([p._future for p in probes], timeout=max(0.0, until - time.perf_counter()))

    def result(self, timeout: float | None = None) -> None:
        """Blocks until the work completed; raises what its ``wait()`` raised."""
        try:
            self._future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"work not completed within {timeout} s") from None


@dataclass(slots=True)
class FillTask:
    """One planned encoder task on this rank."""

    name: str
    """A label for traces (the piece and microbatch)."""
    duration_s: float
    """Measured duration, used to decide whether it fits in what is left of a gap."""
    planned_start_s: float
    """Start in the plan, LLM frame (0 = this rank enters the pipeline step)."""
    run: Callable[[], None]
    """Runs the task (launches it, on CUDA)."""
    ready: Callable[[], bool] = lambda: True
    """False while an input from another rank (an output gradient) has not arrived."""
    wait_ready: Callable[[], None] = lambda: None
    """Blocks until ``ready()``."""
    needed_by: int | None = None
    """For forward tasks: the LLM microbatch whose first-stage forward needs this task's result."""
    needed_at_s: float = float("inf")
    """For forward tasks on a rank other than the first stage's: when (seconds after the frame
    origin) the first stage is planned to need this task's microbatch."""
    chain: int = 0
    """Tasks of one chain (one encoder microbatch) run in plan order; another chain's task may run
    while this chain's next one waits for its input or does not fit."""
    host_only: bool = False
    """Runs on the rank's main thread only, never on the idle worker (it talks to another rank)."""
    done: bool = field(default=False)
    """Ran (CPU), or was launched on the side stream (CUDA) or onto the idle worker (CPU)."""
    took_s: float = 0.0
    """CPU: how long its run took (0 until it ran; on the idle worker its thread's CPU time; on
    CUDA the launch is not its duration)."""
    finished: bool = field(default=False)
    """CPU: has run to its end (a task launched onto the idle worker is done before it is
    finished)."""


@dataclass(slots=True)
class FillerStats:
    """What one rank's filler did in a step."""

    filled: int = 0
    """Tasks run (launched, on CUDA) inside waits."""
    filled_s: float = 0.0
    """Their time: measured on the CPU; on CUDA their measured durations (the launch is not timed)."""
    deferred: int = 0
    """Tasks that did not fit a gap and waited for a later one."""
    forced: int = 0
    """Tasks run outside any gap because the LLM needed their result."""
    waits: int = 0
    """Waits of the pipeline the filler saw."""
    waited_s: float = 0.0
    """CPU: time spent blocked with no task running (in waits, and for inputs from other ranks in
    the front and the drain): the rank's idle time outside collectives."""
    held_s: float = 0.0
    """CPU: how long the LLM's ops were held up by tasks: from the arrival of what a wait waited
    for (pipeline and data-parallel waits) to the end of the task then running, summed."""
    held_max_s: float = 0.0
    """CPU: the longest such hold-up (at most one piece: no task starts once the input is there)."""
    overruns: int = 0
    """CPU: hold-ups longer than the estimate of the task that caused them (the piece ran longer
    than the filler expected when it started it)."""
    dp_waits: int = 0
    """Waits on data-parallel collectives (the LLM's gradient reduce-scatter or all-reduce, its
    parameters' all-gather) the filler saw (:meth:`BubbleFiller.wait_collective`)."""
    dp_waited_s: float = 0.0
    """Time blocked in them with no task running."""
    dp_filled: int = 0
    """Tasks run inside them."""
    dp_filled_s: float = 0.0
    """Their time (the tasks' measured time)."""
    settled: int = 0
    """CPU: times the main thread waited for the idle worker's queue (:meth:`BubbleFiller.settle`)."""
    settled_s: float = 0.0
    """CPU: the time it waited (the worker ran the rest of its queue meanwhile)."""


def _annotated(task: FillTask):
    """A torch.profiler annotation of ``task`` while the profiler records (``pybubble measure``
    counts the time in it busy), else nothing."""
    return record_function(f"pybubble:task:{task.name}") if torch_seams.profiler_enabled() else nullcontext()


class BubbleFiller:
    """Holds this rank's planned task order and runs tasks inside the waits of the step.

    ``gaps_s[n]``: predicted idle time before this rank's n-th pipeline op (the last entry: after
    its last op, up to the end of the step); ``next_ops[n]``: that op as (kind, microbatch).
    ``op_starts_s[n]`` (CPU): when op n's input is predicted to arrive, seconds after the step's
    frame origin (:meth:`begin_step`); without it a gap is predicted to end ``gaps_s[n]`` after it
    opens. Tasks planned before 0 run in :meth:`run_front`; the others inside waits where they fit
    (on CUDA only those planned inside the step), and what is left in :meth:`drain`.

    ``side``: None runs the tasks on the host (CPU path); a :class:`~pybubble.runtime.cuda.SideStream`
    (or any object with its ``launch``/``mark``/``join``/``drain``) launches them on it (CUDA
    path): a task is then "done" once launched, :meth:`force` makes the current stream wait for
    the forward tasks it needs and :meth:`drain` for everything.
    """

    def __init__(self, tasks: Sequence[FillTask], gaps_s: Sequence[float],
                 next_ops: Sequence[tuple[str, int]], horizon_s: float, fill: bool = True,
                 side: SideStream | None = None, op_starts_s: Sequence[float] | None = None,
                 force_until_s: Sequence[float] | None = None, op_stages: Sequence[int] | None = None):
        if len(gaps_s) != len(next_ops) + 1:
            raise ValueError(f"gaps_s: {len(gaps_s)} gaps for {len(next_ops)} ops (need ops + 1)")
        if op_starts_s is not None and len(op_starts_s) != len(next_ops):
            raise ValueError(f"op_starts_s: {len(op_starts_s)} starts for {len(next_ops)} ops")
        if force_until_s is not None and len(force_until_s) != len(next_ops):
            raise ValueError(f"force_until_s: {len(force_until_s)} times for {len(next_ops)} ops")
        if op_stages is not None and len(op_stages) != len(next_ops):
            raise ValueError(f"op_stages: {len(op_stages)} stages for {len(next_ops)} ops")
        self.op_stages = [0] * len(next_ops) if op_stages is None else list(op_stages)
        """The pipeline stage of each op (this rank's stages of a multi-stage schedule)."""
        self.force_until_s = None if force_until_s is None else list(force_until_s)
        """Per op: forward tasks the first stage is planned to need before this time (seconds after
        the frame origin) run before the wait ahead of the op: the filler gets no control again
        before then (the ops up to the next one that waits for a receive run back to back)."""
        self.tasks = sorted(tasks, key=lambda t: t.planned_start_s)
        self.gaps_s = list(gaps_s)
        self.next_ops = list(next_ops)
        self.op_starts_s = None if op_starts_s is None else list(op_starts_s)
        self.horizon_s = horizon_s
        self.fill = fill
        self.side = side
        self.stats = FillerStats()
        self._op = 0
        self._in_op = False
        self._frame0 = time.perf_counter()
        self._gap_start = self._frame0
        self._drift = 0.0
        """Seconds the last observed arrival came after its prediction (CPU)."""
        self._gap_launched_s = 0.0
        """CUDA: measured seconds of the tasks launched into the current gap."""
        self._forward_marks: list[tuple[int, object]] = []
        """CUDA: (needed_by, side-stream event after that forward task) not joined yet."""
        self._cursor = 0
        self.trace: list[tuple[str, float, float]] | None = None
        """When a list: (what, start, end) of every task, op and wait, perf_counter seconds."""
        self._op_start = 0.0
        self._in_wait = False
        self._excluded = 0.0
        """Seconds of waits and tasks since the last op began (not the LLM's own work)."""
        self._mark = self._frame0
        self.op_busy_s: list[float] = [0.0] * len(self.next_ops)
        """The LLM's own time of each op: from its start to the next op's start, less the waits
        and encoder tasks in between (the schedule's bookkeeping after an op counts as its own)."""
        self.lead_busy_s = 0.0
        """The LLM's own time before the first op (the schedule's set-up)."""
        self.op_clock: Callable[[], float] = time.perf_counter
        """The clock of the ops' own time (on CUDA, for a profiling step: one that synchronizes
        the device first)."""
        self._ran_estimated_s = 0.0
        self._ran_took_s = 0.0
        self.idle: IdleWorker | None = None
        """CPU: the idle worker tasks were launched onto (by the TP waits), None before any."""
        self._on_idle: list[FillTask] = []
        """CPU: tasks launched onto the idle worker and not known to be finished."""

    # -- step structure -------------------------------------------------------------------------
    @property
    def next_op(self) -> tuple[str, int] | None:
        """The op this rank runs next (or is running), as (kind, microbatch); None after its last."""
        return self.next_ops[self._op] if self._op < len(self.next_ops) else None

    def begin_step(self, frame0: float | None = None) -> None:
        """Marks the frame origin (default: now): the time ``op_starts_s`` count from."""
        now = time.perf_counter()
        self._frame0 = now if frame0 is None else frame0
        self._op, self._in_op, self._gap_start = 0, False, now
        self._gap_launched_s = 0.0
        self._drift = 0.0
        self._mark, self._excluded = now, 0.0

    def _close_busy(self, now: float) -> None:
        busy = max(0.0, now - self._mark - self._excluded)
        if self._op == 0:
            self.lead_busy_s = busy
        elif self._op - 1 < len(self.op_busy_s):
            self.op_busy_s[self._op - 1] = busy
        self._mark, self._excluded = now, 0.0

    def op_begin(self) -> None:
        """Marks the start of one of the LLM's ops (no task runs inside it)."""
        self._in_op = True
        self._op_start = self.op_clock()
        self._close_busy(self._op_start)

    def op_end(self) -> None:
        """Marks the end of one of the LLM's ops (the next gap begins)."""
        self._in_op = False
        if self.trace is not None and self._op < len(self.next_ops):
            kind, mb = self.next_ops[self._op]
            self.trace.append((f"{kind}{mb}", self._op_start, time.perf_counter()))
        self._op += 1
        self._gap_start = time.perf_counter()
        self._gap_launched_s = 0.0

    def end_pipeline(self) -> None:
        """Marks the end of the pipeline's part of the step (closes the last op's own time)."""
        self._close_busy(self.op_clock())

    # -- running tasks --------------------------------------------------------------------------
    def _run(self, task: FillTask) -> float:
        """Runs ``task`` (CPU) or launches it on the side stream (CUDA); returns the time it takes
        from its window: measured on the CPU, its measured duration on CUDA."""
        if self.side is None:
            self.settle()  # the idle worker's tasks come first: plan order, one thread at a time
        t = time.perf_counter()
        if self.side is None:
            with _annotated(task):
                task.run()
        else:
            self.side.launch(task.run)
            if task.needed_by is not None:
                self._forward_marks.append((task.needed_by, self.side.mark()))
            self._gap_launched_s += task.duration_s
        task.done = True
        end = time.perf_counter()
        if self.side is None:
            task.took_s = end - t
            task.finished = True
            self._ran_estimated_s += task.duration_s
            self._ran_took_s += task.took_s
        if not self._in_wait:
            self._excluded += end - t
        if self.trace is not None:
            self.trace.append((task.name, t, end))  # on CUDA: the launch, not the kernels
        return end - t if self.side is None else task.duration_s

    def launch_idle(self, task: FillTask, worker: IdleWorker) -> None:
        """CPU: hands ``task`` to ``worker`` (it runs after the tasks launched before it, when a
        core would idle); its ``took_s`` is the worker thread's CPU time in it."""
        if self.idle is not None and worker is not self.idle:
            self.settle()
        self.idle = worker
        task.done = True
        self._on_idle.append(task)
        trace = self.trace

        def run() -> None:
            c, t = time.thread_time(), time.perf_counter()
            with _annotated(task):
                task.run()
            task.took_s = time.thread_time() - c
            task.finished = True
            if trace is not None:
                trace.append((task.name, t, time.perf_counter()))

        worker.launch(run, task)

    def idle_queued_s(self) -> float:
        """CPU: the measured durations of the tasks on the idle worker not finished yet."""
        self._on_idle = [t for t in self._on_idle if not t.finished]
        return sum(t.duration_s for t in self._on_idle)

    def settle(self) -> None:
        """CPU: blocks until the tasks launched onto the idle worker have run (it gets this
        thread's core meanwhile); raises what one of them raised."""
        if self.idle is not None and self._on_idle:
            try:
                self._wait_idle(None)
            finally:
                self._on_idle.clear()

    def _wait_idle(self, done: Callable[[], bool] | None) -> None:
        """CPU: blocks until ``done()`` (None: until the idle worker has run everything launched);
        the time is encoder time, not the LLM op's own."""
        t = time.perf_counter()
        try:
            if done is None:
                self.idle.drain()
            else:
                self.idle.wait_until(done)
        finally:
            took = time.perf_counter() - t
            self.stats.settled += 1
            self.stats.settled_s += took
            if not self._in_wait:
                self._excluded += took

    @property
    def pace(self) -> float:
        """CPU: how long this step's tasks took against their estimates so far (their sums'
        ratio, 1 before any ran, kept within [0.5, 3]): a task fits a gap when its estimate times
        the pace does, so the estimates follow the machine's load as the step runs."""
        if self.side is not None or self._ran_estimated_s <= 0.0:
            return 1.0
        return min(3.0, max(0.5, self._ran_took_s / self._ran_estimated_s))

    def _next(self) -> FillTask | None:
        while self._cursor < len(self.tasks) and self.tasks[self._cursor].done:
            self._cursor += 1
        return self.tasks[self._cursor] if self._cursor < len(self.tasks) else None

    def _pick(self, room_s: float, look: int = 16, worker: bool = False) -> tuple[FillTask | None, float | None]:
        """The first task, in plan order among the next ``look`` not done, whose chain has no
        earlier task left, whose input has arrived and that fits in ``room_s``; and the shortest
        duration among those passed over for not fitting (None: none was). On CUDA only tasks
        planned inside the step qualify; for the idle worker (``worker``) only those that may run
        off the main thread, at their measured durations (the pace is the main thread's)."""
        blocked: set[int] = set()
        too_long: float | None = None
        seen = 0
        pace = 1.0 if worker else self.pace
        for i in range(self._cursor, len(self.tasks)):
            task = self.tasks[i]
            if task.done:
                continue
            seen += 1
            if seen > look:
                break
            if task.chain in blocked:
                continue
            blocked.add(task.chain)
            if task.planned_start_s < 0.0 or (self.side is not None and task.planned_start_s >= self.horizon_s):
                continue
            if worker and task.host_only:
                continue
            if not task.ready():
                continue
            need = task.duration_s * pace
            if need > room_s:
                too_long = need if too_long is None else min(too_long, need)
                continue
            return task, too_long
        return None, too_long

    def _run_needed(self, needed_by: int, before_s: float = float("-inf")) -> None:
        """Runs (launches, on CUDA) every forward task that LLM microbatches <= ``needed_by``
        depend on, or that the first stage is planned to need by ``before_s`` (frame seconds),
        and that has not run, in plan order."""
        for task in self.tasks:
            if not task.done and task.needed_by is not None and (task.needed_by <= needed_by
                                                                 or task.needed_at_s <= before_s):
                self.stats.forced += 1
                self._run(task)

    def force(self, needed_by: int) -> None:
        """Runs every forward task that LLM microbatches <= ``needed_by`` depend on, in plan order.
        On CUDA the current stream then waits for them (an event after each), so the op that
        consumes their output next on that stream sees it. CPU, once this step launched tasks onto
        the idle worker: the ones not launched yet go onto it too and this thread waits until they
        are finished (the worker's later tasks go on running in the idle time to come)."""
        if self.side is None and self.idle is not None:
            needed = [t for t in self.tasks if t.needed_by is not None and t.needed_by <= needed_by]
            if not any(t.host_only and not t.done for t in needed):
                for t in needed:
                    if not t.done:
                        self.stats.forced += 1
                        self.launch_idle(t, self.idle)
                if not all(t.finished for t in needed):
                    self._wait_idle(lambda: all(t.finished for t in needed))
                return
        self._run_needed(needed_by)
        if self.side is None:
            self.settle()
        else:
            rest = []
            for mb, mark in self._forward_marks:
                if mb <= needed_by:
                    self.side.join(mark)
                else:
                    rest.append((mb, mark))
            self._forward_marks = rest

    def _wait_ready(self, task: FillTask) -> None:
        """Blocks until ``task``'s input is there (CPU: the time counts as waited)."""
        if task.ready():
            return
        t = time.perf_counter()
        with record_function(_WAIT):
            task.wait_ready()
        if self.side is None:
            self.stats.waited_s += time.perf_counter() - t

    def run_front(self) -> None:
        """Runs the tasks planned before the step (the step grows by shift_front), the ones the
        first stage needs soonest first: when they take longer than planned, the encoder output
        needed next is late the least (a chain's tasks keep their order)."""
        front = [t for t in self.tasks if not t.done and t.planned_start_s < 0.0]
        for task in sorted(front, key=lambda t: (t.needed_at_s, t.planned_start_s)):
            self._wait_ready(task)
            self._run(task)

    def drain(self) -> None:
        """Runs every task left, in plan order, waiting for inputs from other ranks. On CUDA the
        current stream then waits for everything launched on the side stream."""
        while (task := self._next()) is not None:
            self._wait_ready(task)
            self._run(task)
        if self.side is None:
            self.settle()
        else:
            self.side.drain()
            self._forward_marks.clear()

    def wait(self, works: Sequence[dist.Work]) -> None:
        """Waits for ``works``, running planned tasks while they are not complete (on CUDA: launches
        the tasks that fit in the gap, then the current stream waits on the works)."""
        works = [w for w in works if w is not None]
        if works:
            self._accounted(lambda: self._wait(works))

    def wait_for(self, probes: Sequence[WorkProbe], arrival_s: float | None) -> None:
        """CPU: waits for ``probes`` inside an op (the first stage waiting for an encoder output
        from another rank), running tasks that fit until they complete; ``arrival_s``: their
        predicted completion after the frame origin."""
        self._accounted(lambda: self._wait_probes(probes, arrival_s))

    def _accounted(self, wait: Callable[[], None]) -> None:
        self.stats.waits += 1
        with self.waiting("wait"):
            wait()

    @contextmanager
    def waiting(self, label: str, annotation: str = _WAIT) -> Iterator[float]:
        """The block is a wait of the LLM (yields ``time.perf_counter()`` at its start): annotated
        for torch.profiler with ``annotation``, traced as ``label``, and left out of the op's own
        time; a wait inside another (a TP wait inside a pipeline wait, a data-parallel one inside an
        op's TP wait) leaves that to the enclosing one. Tasks run inside it count as filling."""
        t = time.perf_counter()
        outer = self._in_wait
        self._in_wait = True
        try:
            with record_function(annotation):
                yield t
        finally:
            self._in_wait = outer
            end = time.perf_counter()
            if not outer:
                self._excluded += end - t
            if self.trace is not None:
                self.trace.append((label, t, end))

    @property
    def in_op(self) -> bool:
        """Whether one of the LLM's ops is running (between :meth:`op_begin` and :meth:`op_end`)."""
        return self._in_op

    @property
    def op_index(self) -> int:
        """The index of the op running or next (``len(next_ops)`` after the last)."""
        return self._op

    def pick(self, room_s: float, worker: bool = False) -> FillTask | None:
        """The next task that may run now in ``room_s`` seconds (see :meth:`_pick`), or None."""
        return self._pick(room_s, worker=worker)[0]

    def wait_collective(self, works: Sequence[dist.Work], room_s: float) -> float:
        """Waits for the works of a data-parallel collective (issued by FSDP2 or DDP through
        :mod:`pybubble.runtime.data_parallel`), wherever the step is (inside an op too: FSDP2's
        all-gather before a forward, DDP's all-reduce inside the last backward). CPU, when filling:
        while they are pending, runs planned tasks that fit in what is left of ``room_s`` (what
        this collective's wait took the last time it was seen), under grad mode (autograd runs
        backward hooks without it); past ``room_s`` it stops rather than delay the LLM. CUDA: the
        works become the current stream's dependencies (no task is launched here). Returns the
        seconds from the call to the works' completion (CPU; 0 on CUDA)."""
        works = [w for w in works if w is not None]
        completed = None
        self.stats.dp_waits += 1
        ran, count = 0.0, 0
        last: FillTask | None = None
        last_end = 0.0
        t = time.perf_counter()
        try:
            with self.waiting("dp wait") as t:
                if self.side is not None:
                    for w in works:
                        w.wait()
                    return 0.0  # CUDA: the stream waits; the CPU measured nothing
                probes = [WorkProbe(w) for w in works]
                if self.fill and room_s > 0.0:
                    deadline = t + room_s
                    with torch.enable_grad():
                        while not all(p.done() for p in probes):
                            now = time.perf_counter()
                            task, _ = self._pick(deadline - now) if now < deadline else (None, None)
                            if task is None:
                                break
                            ran += self._run(task)
                            last, last_end = task, time.perf_counter()
                            count += 1
                for p in probes:
                    p.result()
                completed = max((p.done_at for p in probes), default=t)
                self._note_hold(last, last_end, completed)
        finally:
            end = time.perf_counter()
            self.stats.dp_waited_s += max(0.0, end - t - ran)
            self.stats.dp_filled_s += ran
            self.stats.dp_filled += count
        return 0.0 if completed is None else max(0.0, completed - t)

    def _note_hold(self, last: FillTask | None, last_end: float, arrived: float) -> None:
        """Counts the hold-up of a wait whose works completed (``arrived``) while its last task
        (``last``, ended at ``last_end``) ran: the op waited for the task's end."""
        if last is None or last_end <= arrived:
            return
        held = last_end - arrived
        self.stats.held_s += held
        self.stats.held_max_s = max(self.stats.held_max_s, held)
        self.stats.overruns += held > last.duration_s

    def _deadline(self, arrival_s: float | None, gap_s: float) -> float:
        """The predicted end of the current gap (CPU, perf_counter seconds): the predicted arrival
        (``arrival_s`` after the frame origin, moved by the drift seen at this step's last
        arrival), or ``gap_s`` after the gap opened."""
        return self._gap_start + gap_s if arrival_s is None else self._frame0 + arrival_s + self._drift

    @staticmethod
    def _room(deadline: float, now: float) -> float:
        """Seconds of the gap a task may take: what is left to the deadline; past it, while the
        works are still pending, as long again as the gap has overrun its prediction (a gap that
        runs long is used, at the risk of a delay no longer than the overrun itself)."""
        return deadline - now if now < deadline else now - deadline

    def _wait_probes(self, probes: Sequence[WorkProbe], arrival_s: float | None, gap_s: float = 0.0) -> None:
        """CPU: blocks until ``probes`` completed, running tasks that fit while they are pending
        (the rank would idle there). ``arrival_s``: their predicted completion after the frame
        origin; the drift is updated from what is seen."""
        entered = time.perf_counter()
        ran = 0.0
        last: FillTask | None = None
        last_end = 0.0
        if self.fill and self.side is None:
            deadline = self._deadline(arrival_s, gap_s)
            pending = lambda: not all(p.done() for p in probes)  # noqa: E731
            while pending():
                now = time.perf_counter()
                task, too_long = self._pick(self._room(deadline, now))
                if task is None:
                    if too_long is None:
                        break  # nothing ready: wait
                    # Nothing fits now; past the deadline the room grows with the overrun: look
                    # again when the shortest candidate would fit, unless the works complete first.
                    WorkProbe.wait_all(probes, until=max(deadline, now) + too_long)
                    if not pending():
                        self.stats.deferred += 1
                    continue
                took = self._run(task)
                last, last_end = task, time.perf_counter()
                ran += took
                self.stats.filled_s += took
                self.stats.filled += 1
        for p in probes:
            p.result()
        arrived = max(p.done_at for p in probes)
        self._note_hold(last, last_end, arrived)
        self.stats.waited_s += max(0.0, time.perf_counter() - entered - ran)
        if arrival_s is not None and arrived > entered:
            self._drift = arrived - (self._frame0 + arrival_s)

    def _wait(self, works: list[dist.Work]) -> None:
        if not self._in_op and self._op < len(self.next_ops):
            kind, mb = self.next_ops[self._op]
            # The op after this wait may depend (through other ranks) on stage 0's forward of
            # microbatch mb: produce what it needs before blocking; and what the first stage is
            # planned to need before this rank's next chance (it would wait for it meanwhile).
            before = float("-inf") if self.force_until_s is None else self.force_until_s[self._op]
            self._run_needed(mb, before)
        gap_s = self.gaps_s[min(self._op, len(self.gaps_s) - 1)]
        if self.side is None:
            arrival = None
            if self.op_starts_s is not None and not self._in_op and self._op < len(self.op_starts_s):
                arrival = self.op_starts_s[self._op]
            fill = self.fill and not self._in_op
            if fill:
                self._wait_probes([WorkProbe(w) for w in works], arrival, gap_s)
            else:
                t = time.perf_counter()
                for w in works:
                    w.wait()
                self.stats.waited_s += time.perf_counter() - t
            return
        if self.fill and not self._in_op and self._next() is not None:
            # CUDA: the works are stream dependencies and the window opens here on the LLM's
            # stream: launch what fits in what the gap's earlier launches left of it.
            while True:
                task, too_long = self._pick(gap_s - self._gap_launched_s)
                if task is None:
                    if too_long is not None:
                        self.stats.deferred += 1
                    break
                self.stats.filled_s += self._run(task)
                self.stats.filled += 1
        for w in works:
            w.wait()

    def run_now(self, task: FillTask) -> float:
        """Runs ``task`` at once (launches it, on CUDA), wherever the step is (megatron: the
        encoder's backward inside the first stage's backward; a TP wait on CUDA); its time is not
        the LLM op's own. Returns that time (see :meth:`_run`)."""
        return self._run(task)

    @property
    def remaining(self) -> int:
        """Tasks not yet run."""
        return sum(not t.done for t in self.tasks)
