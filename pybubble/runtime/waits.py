"""The three kinds of wait of a step, and what the filler does in each.

Each torch adapter hands its wait here and nothing else: the pipelining adapter its p2p waits
(:class:`PipelineWaits`), the data-parallel adapter FSDP2's and DDP's collectives
(:class:`DataParallelWaits`), the TP adapter the functional collectives' waits
(:class:`TensorParallelWaits`). All three fill through :meth:`BubbleFiller.fill_gap`; they differ
in the room they give it and in where the tasks go.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..measure import names
from .executors import HostExecutor
from .filler import BubbleFiller, Filled
from .idle_worker import shared_idle_worker
from .probe import WorkProbe, all_done
from ..placement.records import FillerStats, TPWaitStats
from .task import FillTask

NOTHING = Filled(0.0, 0, None, 0.0)


def note_hold(stats: FillerStats, filled: Filled, arrived: float) -> None:
    """Counts the hold-up of a wait whose works completed (``arrived``) while its last task ran:
    the op waited for the task's end."""
    if filled.last is None or filled.last_end <= arrived:
        return
    held = filled.last_end - arrived
    stats.held_s += held
    stats.held_max_s = max(stats.held_max_s, held)
    stats.overruns += held > filled.last.duration_s


def room_left(deadline: float, now: float) -> float:
    """Seconds of a gap a task may take: what is left to the deadline; past it, while the works
    are still pending, as long again as the gap has overrun its prediction (a gap that runs long
    is used, at the risk of a delay no longer than the overrun itself)."""
    return deadline - now if now < deadline else now - deadline


class PipelineWaits:
    """The pipeline's point-to-point waits, and the first stage's waits for an encoder output
    from another rank."""

    def __init__(self, filler: BubbleFiller):
        self.filler = filler

    def wait(self, works: Sequence[dist.Work]) -> None:
        """Waits for ``works``, running planned tasks while they are not complete (on CUDA:
        launches the tasks that fit in the gap, then the current stream waits on the works)."""
        works = [w for w in works if w is not None]
        if not works:
            return
        f, p = self.filler, self.filler.progress
        f.stats.waits += 1
        with p.waiting("wait"):
            op = p.next_op
            if not p.in_op and op is not None:
                # The op after this wait may depend (through other ranks) on stage 0's forward of
                # its microbatch: produce what it needs before blocking; and what the first stage is
                # planned to need before this rank's next chance (it would wait for it meanwhile).
                f.run_needed(op.action.microbatch, op.force_until_s)
            gap_s = f.gaps_s[min(p.op_index, len(f.gaps_s) - 1)]
            f.executor.pipeline_wait(self, works, gap_s, f.fill and not p.in_op)

    def block(self, works: Sequence[dist.Work]) -> None:
        """Host: blocks in ``works`` with nothing to run (the time counts as waited)."""
        t = time.perf_counter()
        for w in works:
            w.wait()
        self.filler.stats.waited_s += time.perf_counter() - t

    def fill_until_done(self, works: Sequence[dist.Work], gap_s: float) -> None:
        """Host: runs planned tasks while ``works`` are pending (the op after the wait is predicted
        to start after a gap of ``gap_s``)."""
        op = self.filler.progress.next_op
        self._wait_probes([WorkProbe(w) for w in works], None if op is None else op.start_s, gap_s)

    def launch_into_gap(self, room: Callable[[], float]) -> None:
        """CUDA: the works are stream dependencies and the window opens here on the LLM's stream:
        launches what fits in ``room()``, what the gap's earlier launches left of it."""
        f = self.filler
        if f.next_task() is None:
            return

        def deferred(_shortest: float) -> bool:
            f.stats.deferred += 1
            return False

        filled = f.fill_gap(room, until_fits=deferred)
        f.stats.filled += filled.count
        f.stats.filled_s += filled.seconds

    def wait_for(self, probes: Sequence[WorkProbe], arrival_s: float | None) -> None:
        """Host: waits for ``probes`` inside an op (the first stage waiting for an encoder output
        from another rank), running tasks that fit until they complete; ``arrival_s``: their
        predicted completion after the frame origin."""
        self.filler.stats.waits += 1
        with self.filler.progress.waiting("wait"):
            self._wait_probes(probes, arrival_s)

    def wait_for_output(self, probe: WorkProbe, arrival_s: float | None) -> None:
        """Inside the first stage's op: the wait for an encoder output from another rank, as the
        executor fills it (the host runs tasks while it comes, see :meth:`wait_for`)."""
        self.filler.executor.output_wait(self, probe, arrival_s)

    def _wait_probes(self, probes: Sequence[WorkProbe], arrival_s: float | None, gap_s: float = 0.0) -> None:
        """Host: blocks until ``probes`` completed, running tasks that fit while they are pending
        (the rank would idle there); the drift is updated from what is seen."""
        f = self.filler
        entered = time.perf_counter()
        filled = NOTHING
        if f.fill:
            deadline = f.progress.deadline(arrival_s, gap_s)

            def until_fits(shortest: float) -> bool:
                # Nothing fits now; past the deadline the room grows with the overrun: look again
                # when the shortest candidate would fit, unless the works complete first.
                WorkProbe.wait_all(probes, until=max(deadline, time.perf_counter()) + shortest)
                if all_done(probes):
                    f.stats.deferred += 1
                return True

            filled = f.fill_gap(lambda: room_left(deadline, time.perf_counter()), lambda: not all_done(probes),
                                until_fits=until_fits)
            f.stats.filled += filled.count
            f.stats.filled_s += filled.seconds
        for p in probes:
            p.result()
        arrived = max(p.done_at for p in probes)
        note_hold(f.stats, filled, arrived)
        f.stats.waited_s += max(0.0, time.perf_counter() - entered - filled.seconds)
        if arrival_s is not None and arrived > entered:
            f.progress.arrived(arrival_s, arrived)


class DataParallelWaits:
    """The waits of the stages' data-parallel collectives (FSDP2's all-gathers and reduce-scatters,
    DDP's all-reduces), for the runtime's whole life: :meth:`__call__` is the wait the hooks of
    :func:`~pybubble.runtime.data_parallel.observe_data_parallel` call. Inside a step (between
    :meth:`begin_step` and :meth:`end_step`) the filler runs tasks in each, with the room the same
    collective took to complete in the last step; outside one it only waits."""

    def __init__(self) -> None:
        self.filler: BubbleFiller | None = None
        self._seen: list[float] = []
        self._last: list[float] = []
        self._at: list[int] = []
        self._last_at: list[int] = []
        self._filled = NOTHING
        """What the running wait filled (its stats count it even when the wait raises)."""

    def begin_step(self, filler: BubbleFiller) -> None:
        """The step of ``filler`` begins."""
        self.filler, self._seen, self._at = filler, [], []

    def end_step(self, completed: bool) -> None:
        """The step ended; its collectives' times are the next step's rooms when it ``completed``."""
        if completed:
            self._last, self._last_at = self._seen, self._at
        self.filler = None

    def collectives_s(self, ops: int) -> list[float]:
        """Per op of the rank (``ops`` of them), then after its last: the seconds the last completed
        step waited on data-parallel collectives there (inside the op or before it; from each
        wait's call to its works' completion, 0 on CUDA), where the replicas meet; NaN where it
        waited on none (everywhere before a step completed)."""
        out = [math.nan] * (ops + 1)
        for k, seconds in zip(self._last_at, self._last):
            k = min(k, ops)
            out[k] = seconds if math.isnan(out[k]) else out[k] + seconds
        return out

    def __call__(self, works: Sequence[dist.Work]) -> None:
        if self.filler is None:
            for w in works:
                w.wait()
            return
        i = len(self._seen)
        self._at.append(self.filler.progress.op_index)
        self._seen.append(self.wait(works, self._last[i] if i < len(self._last) else 0.0))

    def wait(self, works: Sequence[dist.Work], room_s: float) -> float:
        """Waits for ``works`` wherever the step is (inside an op too). Host, when filling: while
        they are pending, runs planned tasks that fit in what is left of ``room_s``, under grad mode
        (autograd runs backward hooks without it); past ``room_s`` it stops rather than delay the
        LLM. CUDA: the works become the current stream's dependencies. Returns the seconds from the
        call to the works' completion (host; 0 on CUDA)."""
        f = self.filler
        works = [w for w in works if w is not None]
        f.stats.dp_waits += 1
        self._filled, completed = NOTHING, None
        t = time.perf_counter()
        try:
            with f.progress.waiting("dp wait", names.DP_WAIT) as t:
                completed = f.executor.data_parallel_wait(self, works, room_s, t)
        finally:
            filled = self._filled
            f.stats.dp_waited_s += max(0.0, time.perf_counter() - t - filled.seconds)
            f.stats.dp_filled_s += filled.seconds
            f.stats.dp_filled += filled.count
        return 0.0 if completed is None else max(0.0, completed - t)

    def fill_until_done(self, works: Sequence[dist.Work], room_s: float, entered: float) -> float:
        """Host: while ``works`` are pending, runs planned tasks that fit in what is left of
        ``room_s`` after ``entered``; returns when they completed (``time.perf_counter()``)."""
        f = self.filler
        probes = [WorkProbe(w) for w in works]
        if f.fill and room_s > 0.0:
            deadline = entered + room_s
            with torch.enable_grad():
                self._filled = f.fill_gap(lambda: deadline - time.perf_counter(), lambda: not all_done(probes))
        for p in probes:
            p.result()
        completed = max((p.done_at for p in probes), default=entered)
        note_hold(f.stats, self._filled, completed)
        return completed


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class TensorParallelWaits:
    """Runs ``filler``'s pieces inside the waits of TP collectives (see
    :mod:`pybubble.runtime.tensor_parallel` for how they are reached).

    - Host: the next planned pieces go onto the idle worker, up to the TP waits the plan predicts
      for the rest of the step (count x mean wait per op) less what it holds; the main thread then
      allows the worker and blocks in the real wait (its core goes to the worker), and holds the
      worker again when the collective completes.
    - CUDA: the pieces whose measured durations fit in the measured gap are launched on the side
      stream, ordered after the current stream (the collective is already enqueued there), then the
      real wait orders the current stream after the collective.

    ``gap_s``: a TP collective's gap as measured on this mesh (on CUDA the room at each wait; 0:
    nothing is run, the waits are only measured); ``op_idle_s`` (host): the TP waits' time in one
    LLM op (default ``gap_s``). ``stats`` holds what this step saw; call :meth:`finish` once the
    filler has drained."""

    def __init__(self, filler: BubbleFiller, gap_s: float = 0.0, op_idle_s: float | None = None):
        self.filler = filler
        self.gap_s = float(gap_s)
        self.op_idle_s = self.gap_s if op_idle_s is None else float(op_idle_s)
        self.stats = TPWaitStats(per_op=[0] * len(filler.progress.ops))
        self._queued: list[tuple[FillTask, int]] = []
        self._launches: dict[int, float] = {}
        """perf_counter at the launch of each collective not waited for yet, by the address of its
        result's storage (a view of the result, waited for instead of it, shares it)."""

    def launched(self, result: torch.Tensor) -> None:
        """Notes the launch of the collective whose result is ``result`` (now)."""
        self._launches[_storage(result)] = time.perf_counter()

    def finish(self) -> TPWaitStats:
        """Completes ``stats`` once the filler has drained (the host pieces' times); returns it."""
        gaps = self.stats.gaps_s
        self.stats.pieces.extend((t.duration_s, t.took_s, gaps[i] if i < len(gaps) else float("nan"))
                                 for t, i in self._queued)
        self._queued.clear()
        return self.stats

    def wait(self, tensor: torch.Tensor, real_wait: Callable[[torch.Tensor], torch.Tensor],
             guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> torch.Tensor:
        """Waits for the collective whose result is ``tensor`` (``real_wait(tensor)``), running
        pieces while it is pending; ``guard()``: the context the pieces launch in (CUDA)."""
        p, s = self.filler.progress, self.stats
        s.waits += 1
        if p.in_op and p.op_index < len(s.per_op):
            s.per_op[p.op_index] += 1
        launched = self._launches.pop(_storage(tensor), float("nan"))
        with p.waiting("tp_wait", names.TP_WAIT) as entered:
            return self.filler.executor.tp_wait(self, tensor, real_wait, guard, entered, launched)

    def queue_then_wait(self, ex: HostExecutor, tensor: torch.Tensor, real_wait: Callable[[torch.Tensor], torch.Tensor],
                        entered: float, launched: float) -> torch.Tensor:
        """Host: queues pieces onto the idle worker (``ex``'s), then blocks in the real wait."""
        f, s = self.filler, self.stats
        if not (f.fill and self.op_idle_s > 0.0):  # only measured
            out = real_wait(tensor)
            resumed, running, ran = time.perf_counter(), None, 0.0
        else:
            worker = shared_idle_worker()
            room = [(len(f.progress.ops) - f.progress.op_index) * self.op_idle_s - ex.queued_s()]

            def queue(task: FillTask) -> float:
                self._queued.append((task, len(s.gaps_s)))
                s.filled += 1
                room[0] -= ex.queue(task, worker)
                return task.duration_s

            f.fill_gap(lambda: room[0], lambda: room[0] > 0.0, run=queue, worker=True)
            cpu = worker.cpu_s()
            worker.allow()
            try:
                out = real_wait(tensor)
                resumed = time.perf_counter()
            finally:
                worker.hold()  # no piece starts while the main thread runs the LLM (they would share the GIL)
            running, ran = worker.running_at(resumed), worker.cpu_s() - cpu
        gap = resumed - entered
        filled = min(gap, ran)
        s.gaps_s.append(gap)
        s.gap_s += gap
        s.filled_s += filled
        s.waited_s += gap - filled
        s.launched_s.append(launched)
        s.resumed_s.append(resumed)
        s.in_flight_s.append(running.duration_s if isinstance(running, FillTask) else 0.0)
        return out

    def launch_into_gap(self) -> None:
        """CUDA: launches the pieces that fit in the measured gap."""
        f, s = self.filler, self.stats
        if not (f.fill and self.gap_s > 0.0):
            return
        launched = [0.0]

        def launch(task: FillTask) -> float:
            took = f.run_now(task)
            launched[0] += took
            s.filled += 1
            s.pieces.append((task.duration_s, task.duration_s, self.gap_s))
            return took

        f.fill_gap(lambda: self.gap_s - launched[0], run=launch)
        s.filled_s += min(launched[0], self.gap_s)


__all__ = ["DataParallelWaits", "PipelineWaits", "TensorParallelWaits", "note_hold", "room_left"]
