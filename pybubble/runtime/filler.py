"""The bubble filler: the policy that decides which of this rank's planned encoder tasks runs in
which wait of the step.

At a wait (a pipeline p2p wait, a data-parallel collective's, a TP collective's) the filler runs
the next planned tasks that fit in what is left of the predicted gap, through one loop
(:meth:`BubbleFiller.fill_gap`, called by each kind of wait in :mod:`pybubble.runtime.waits`); a task that would overrun the gap is deferred to a later gap or
to the end of the step; a forward task that a later pipeline op depends on is forced before the
rank blocks, so the step never deadlocks. What "runs" means is the executor's
(:mod:`pybubble.runtime.executors`: the host's thread or idle worker, or a CUDA side stream), and
so is the measure of what is left of a gap (the clock on the host, the durations already launched
into the gap on CUDA). Where the rank is in its step is :class:`~pybubble.runtime.progress.StepProgress`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from torch.profiler import record_function

from ..measure import names
from ..llm.tables import Action
from .cuda import SideStream
from .executors import Executor, HostExecutor, executor_for
from ..placement.plan import PlannedOp, RankPlan
from .progress import StepProgress
from ..placement.records import FillerStats
from .task import FillTask


class Filled(NamedTuple):
    """What one :meth:`BubbleFiller.fill_gap` ran."""

    seconds: float
    """The tasks' time (see :meth:`BubbleFiller.run_now`)."""
    count: int
    """How many."""
    last: FillTask | None
    """The last one (None: none ran)."""
    last_end: float
    """When it ended (``time.perf_counter()``)."""


class BubbleFiller:
    """Holds this rank's tasks in plan order and runs them inside the waits of the step.

    ``ops``: the rank's LLM ops in the order they run, each with its predicted gap before it and
    its predicted start; ``tail_gap_s``: the gap after the last. Tasks planned before 0 run in
    :meth:`run_front`; the others inside waits where they fit (on CUDA only those planned inside
    the step, before ``horizon_s``), and what is left in :meth:`drain`. ``fill``: False runs no
    task in a wait (megatron and coarse modes)."""

    def __init__(self, tasks: Sequence[FillTask], ops: Sequence[PlannedOp], *, horizon_s: float,
                 tail_gap_s: float = 0.0, fill: bool = True, executor: Executor | None = None):
        self.tasks = sorted(tasks, key=lambda t: t.planned_start_s)
        self.executor = HostExecutor() if executor is None else executor
        self.progress = StepProgress(ops, on_gap=self.executor.open_gap)
        self.gaps_s = [op.gap_s for op in ops] + [tail_gap_s]
        self.horizon_s = horizon_s
        self.fill = fill
        self.stats = FillerStats()
        self.trace: list[tuple[str, float, float]] | None = None
        self._cursor = 0
        self._ran_estimated_s = 0.0
        self._ran_took_s = 0.0

    @classmethod
    def of_plan(cls, plan: RankPlan, tasks: Sequence[FillTask],
                executor: Executor | None = None) -> BubbleFiller:
        """The filler of a rank's plan, running ``tasks`` (bound to the plan's tasks)."""
        return cls(tasks, plan.ops, horizon_s=plan.horizon_s, tail_gap_s=plan.tail_gap_s, fill=plan.fill,
                   executor=executor)

    @classmethod
    def with_gaps(cls, tasks: Sequence[FillTask], gaps_s: Sequence[float], next_ops: Sequence[tuple[str, int]],
                  horizon_s: float, *, fill: bool = True, side: SideStream | None = None,
                  op_starts_s: Sequence[float] | None = None, force_until_s: Sequence[float] | None = None,
                  op_stages: Sequence[int] | None = None) -> BubbleFiller:
        """A filler for a hand-made step (a loop of one's own, a test): ``gaps_s[n]`` the idle time
        predicted before op n (the last entry: after the last op), ``next_ops[n]`` op n as (kind,
        microbatch), optionally its predicted start, its ``force_until_s`` and its stage; on the
        host, or on ``side`` (a CUDA side stream)."""
        n = len(next_ops)
        for name, given, want in (("gaps_s", gaps_s, n + 1), ("op_starts_s", op_starts_s, n),
                                  ("force_until_s", force_until_s, n), ("op_stages", op_stages, n)):
            if given is not None and len(given) != want:
                raise ValueError(f"{name}: {len(given)} entries for {n} ops (need {want})")
        ops = [PlannedOp(action=Action(0 if op_stages is None else op_stages[i], kind, mb), gap_s=gaps_s[i],
                         start_s=None if op_starts_s is None else op_starts_s[i],
                         force_until_s=float("-inf") if force_until_s is None else force_until_s[i])
               for i, (kind, mb) in enumerate(next_ops)]
        return cls(tasks, ops, horizon_s=horizon_s, tail_gap_s=gaps_s[-1], fill=fill, executor=executor_for(side))

    def record_trace(self) -> list[tuple[str, float, float]]:
        """From now on (what, start, end) of every task, op and wait go to the returned list."""
        self.trace = self.progress.trace = []
        self.executor.record_trace(self.trace)
        return self.trace

    # -- running -------------------------------------------------------------------------------
    def _settled(self, seconds: float | None) -> None:
        if seconds is not None:
            self.stats.settled += 1
            self.stats.settled_s += seconds
            self.progress.exclude(seconds)

    def settle(self) -> None:
        """Blocks until the tasks queued onto the idle worker have run (host; raises what one of
        them raised); the time is the encoder's, not the LLM op's own."""
        self._settled(self.executor.settle())

    def run_now(self, task: FillTask) -> float:
        """Runs ``task`` at once (launches it, on CUDA), wherever the step is, after what the idle
        worker holds; its time is not the LLM op's own. Returns the time it takes from its window:
        measured on the host, its measured duration on CUDA."""
        self.settle()  # the idle worker's tasks come first: plan order, one thread at a time
        t = time.perf_counter()
        took = self.executor.run(task)
        end = time.perf_counter()
        self._ran_estimated_s += task.duration_s  # a device's launch takes its estimate: the pace stays 1
        self._ran_took_s += took
        self.progress.exclude(end - t)
        if self.trace is not None:
            self.trace.append((task.name, t, end))  # on CUDA: the launch, not the kernels
        return took

    @property
    def pace(self) -> float:
        """Host: how long this step's tasks took against their estimates so far (their sums'
        ratio, 1 before any ran, kept within [0.5, 3]): a task fits a gap when its estimate times
        the pace does, so the estimates follow the machine's load as the step runs."""
        if self._ran_estimated_s <= 0.0:
            return 1.0
        return min(3.0, max(0.5, self._ran_took_s / self._ran_estimated_s))

    def next_task(self) -> FillTask | None:
        """The first task in plan order not done yet (None: all are)."""
        while self._cursor < len(self.tasks) and self.tasks[self._cursor].done:
            self._cursor += 1
        return self.tasks[self._cursor] if self._cursor < len(self.tasks) else None

    def pick(self, room_s: float, look: int = 16, worker: bool = False) -> tuple[FillTask | None, float | None]:
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
            if task.planned_start_s < 0.0 or not self.executor.may_fill(task, self.horizon_s):
                continue
            if (worker and task.host_only) or not task.ready():
                continue
            need = task.duration_s * pace
            if need > room_s:
                too_long = need if too_long is None else min(too_long, need)
                continue
            return task, too_long
        return None, too_long

    def fill_gap(self, room: Callable[[], float], pending: Callable[[], bool] = lambda: True, *,
                 until_fits: Callable[[float], bool] | None = None, run: Callable[[FillTask], float] | None = None,
                 worker: bool = False) -> Filled:
        """The fill loop of every wait: while ``pending()``, runs (``run``, default :meth:`run_now`)
        the next task that fits in ``room()``; when none fits, ``until_fits(shortest)`` may block
        until one would and say whether to look again (default: stop)."""
        run = self.run_now if run is None else run
        seconds, count, last, last_end = 0.0, 0, None, 0.0
        while pending():
            task, too_long = self.pick(room(), worker=worker)
            if task is None:
                if too_long is None or until_fits is None or not until_fits(too_long):
                    break
                continue
            seconds += run(task)
            count, last, last_end = count + 1, task, time.perf_counter()
        return Filled(seconds, count, last, last_end)

    # -- what the LLM needs --------------------------------------------------------------------
    def run_needed(self, needed_by: int, before_s: float = float("-inf")) -> None:
        """Runs every forward task that LLM microbatches <= ``needed_by`` depend on, or that the
        first stage is planned to need by ``before_s`` (frame seconds), and that has not run."""
        for task in self.tasks:
            if not task.done and task.needed_by is not None and (task.needed_by <= needed_by
                                                                 or task.needed_at_s <= before_s):
                self.stats.forced += 1
                self.run_now(task)

    def force(self, needed_by: int) -> None:
        """Runs every forward task that LLM microbatches <= ``needed_by`` depend on, in plan order,
        and makes their results visible here: on CUDA the current stream waits for them; on the
        host, once this step queued tasks onto the idle worker, they go onto it too and this thread
        waits for them only (the worker's later tasks go on in the idle time to come)."""
        needed = [t for t in self.tasks if t.needed_by is not None and t.needed_by <= needed_by]
        offloaded = self.executor.offload(needed)
        if offloaded is not None:
            self.stats.forced += offloaded[0]
            self._settled(offloaded[1])
            return
        self.run_needed(needed_by)
        self.settle()
        self.executor.join(needed_by)

    def _wait_ready(self, task: FillTask) -> None:
        """Blocks until ``task``'s input is there (host: the time counts as waited)."""
        if task.ready():
            return
        t = time.perf_counter()
        with record_function(names.WAIT):
            task.wait_ready()
        self.stats.waited_s += self.executor.blocked_s(time.perf_counter() - t)

    def run_front(self) -> None:
        """Runs the tasks planned before the step (the step grows by shift_front), the ones the
        first stage needs soonest first: when they take longer than planned, the encoder output
        needed next is late the least (a chain's tasks keep their order)."""
        front = [t for t in self.tasks if not t.done and t.planned_start_s < 0.0]
        for task in sorted(front, key=lambda t: (t.needed_at_s, t.planned_start_s)):
            self._wait_ready(task)
            self.run_now(task)

    def drain(self) -> None:
        """Runs every task left, in plan order, waiting for inputs from other ranks; then waits for
        what the executor still runs (on CUDA: the current stream waits for the side stream)."""
        while (task := self.next_task()) is not None:
            self._wait_ready(task)
            self.run_now(task)
        self.settle()
        self.executor.drain()

    @property
    def remaining(self) -> int:
        """Tasks not yet run."""
        return sum(not t.done for t in self.tasks)

__all__ = ["BubbleFiller", "Filled", "FillTask"]
