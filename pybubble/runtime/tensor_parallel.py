"""Tensor-parallel waits: the encoder's pieces inside the waits of the LLM's TP collectives.

torch's tensor parallelism (DTensor, ``parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel``) issues its collectives as functional collectives. Run eagerly, a collective's
result is an ``AsyncCollectiveTensor``: the collective is launched at once and its
``torch.ops._c10d_functional.wait_tensor`` runs where the result is first used (the residual add
after a row-parallel projection, the gradient accumulation after a column-parallel one's input
gradient), always through the module-level ``wait_tensor`` of
``torch.distributed._functional_collectives``. While :func:`fill_tp_waits` is active that function
is replaced by one that hands the wait to the filler (and the module's wrapping of a launched
collective's result notes when it was launched):

- CPU (gloo): the planned pieces go onto the :class:`~pybubble.runtime.idle_worker.IdleWorker`,
  the CPU's side stream, a thread the kernel runs only on a core that would idle; the rank's main
  thread then allows the worker and blocks in the real wait, which frees its core for the worker,
  takes the core back the moment the collective completes, and holds the worker again (a piece
  then running goes on, at idle priority; no other starts until the next wait). The worker's queue
  is kept at the TP waits the plan predicts for the rest of the step (count x mean wait per op), in
  plan order; before the main thread runs an encoder task itself it waits for the queue, and for
  an encoder output the LLM needs it waits for that output's tasks only (they go onto the worker
  if they are not there yet). What the consumer can still wait for is the GIL, which the worker
  holds between two torch ops of a piece; each wait records when its collective was launched,
  when its consumer resumed and the measured duration of the piece then running, so that the
  delays can be measured against the TP group's last launch (:func:`consumer_delays`).
- CUDA (NCCL): the wait is a stream dependency, the CPU does not block: the pieces whose measured
  durations fit in the measured gap are launched on the side stream, ordered after the current
  stream at this point (after the collective's launch), then the real wait orders the current
  stream after the collective.

The hook runs inside the ``__torch_dispatch__`` of a tensor subclass, below autograd; the pieces
on CUDA run with the dispatch keys of the place where :func:`fill_tp_waits` was entered (on the
CPU the worker thread has its own, the defaults), so their forwards record autograd graphs as they
would anywhere else. These are private torch names, reached through
:mod:`pybubble.runtime.torch_seams`, which checks them.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from . import torch_seams
from .filler import BubbleFiller, FillTask
from .idle_worker import shared_idle_worker

_TP_WAIT = "pybubble:tp_wait"
"""The profiler annotation of a TP collective's wait."""


@dataclass(slots=True)
class TPWaitStats:
    """What one rank saw of its TP collectives' waits in a step (CPU figures; on CUDA the gaps are
    not observed and only ``waits``, ``filled`` and ``filled_s`` count)."""

    waits: int = 0
    """TP collectives waited on."""
    gap_s: float = 0.0
    """Their gaps summed: from the consumer's arrival to the collective's completion."""
    waited_s: float = 0.0
    """The part of the gaps with no piece running (the LLM's time blocked in TP waits)."""
    filled: int = 0
    """Pieces run inside those waits."""
    filled_s: float = 0.0
    """The part of the gaps the pieces filled (per wait: the pieces' time, at most the gap)."""
    launched_s: list[float] = field(default_factory=list)
    """CPU, per wait: when its collective was launched on this rank (``time.perf_counter()``; NaN:
    launched before :func:`fill_tp_waits` was entered)."""
    resumed_s: list[float] = field(default_factory=list)
    """CPU, per wait: when the consumer resumed (``time.perf_counter()``)."""
    in_flight_s: list[float] = field(default_factory=list)
    """CPU, per wait: the measured duration of the piece the idle worker was running when the
    consumer resumed (0: none), the most the consumer may be delayed by."""
    gaps_s: list[float] = field(default_factory=list)
    """Each wait's gap, in order."""
    pieces: list[tuple[float, float, float]] = field(default_factory=list)
    """Each piece launched at a wait: (measured duration, time it took, the gap of that wait);
    on the CPU the time is the worker thread's CPU time in it, filled in by
    :meth:`TensorParallelWaits.finish`."""
    per_op: list[int] = field(default_factory=list)
    """Waits inside each of the rank's pipeline ops (the filler's ``next_ops`` order)."""


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class TensorParallelWaits:
    """Runs ``filler``'s pieces inside the waits of TP collectives (see the module's notes).

    ``gap_s``: a TP collective's gap as measured on this mesh (on CUDA the room at each wait;
    0: nothing is run, the waits are only measured); ``op_idle_s`` (CPU): the TP waits' time in
    one LLM op, count x mean wait as measured (default ``gap_s``). ``stats`` holds what this step
    saw; call :meth:`finish` once the filler has drained."""

    def __init__(self, filler: BubbleFiller, gap_s: float = 0.0, op_idle_s: float | None = None):
        self.filler = filler
        self.gap_s = float(gap_s)
        self.op_idle_s = self.gap_s if op_idle_s is None else float(op_idle_s)
        self.stats = TPWaitStats(per_op=[0] * len(filler.next_ops))
        self._launched: list[tuple[FillTask, int]] = []
        self._launches: dict[int, float] = {}
        """perf_counter at the launch of each collective not waited for yet, by the address of its
        result's storage (a view of the result, waited for instead of it, shares it)."""

    def launched(self, result: torch.Tensor) -> None:
        """Notes the launch of the collective whose result is ``result`` (now)."""
        self._launches[_storage(result)] = time.perf_counter()

    def finish(self) -> TPWaitStats:
        """Completes ``stats`` once the filler has drained (the CPU pieces' times); returns it."""
        gaps = self.stats.gaps_s
        self.stats.pieces.extend((t.duration_s, t.took_s, gaps[i] if i < len(gaps) else float("nan"))
                                 for t, i in self._launched)
        self._launched.clear()
        return self.stats

    def wait(self, tensor: torch.Tensor, real_wait: Callable[[torch.Tensor], torch.Tensor],
             keys: tuple[object, object] | None = None) -> torch.Tensor:
        """Waits for the collective whose result is ``tensor`` (``real_wait(tensor)``), running
        pieces while it is pending; ``keys``: the dispatch keys (included, excluded) the pieces
        run with."""
        f, s = self.filler, self.stats
        s.waits += 1
        if f.in_op and f.op_index < len(s.per_op):
            s.per_op[f.op_index] += 1
        launched = self._launches.pop(_storage(tensor), float("nan"))
        with f.waiting("tp_wait", _TP_WAIT) as entered:
            if f.side is not None:
                guard = torch_seams.dispatch_key_guard(keys) if keys is not None else contextlib.nullcontext()
                return self._launch_then_wait(tensor, real_wait, guard)
            return self._launch_idle_then_wait(tensor, real_wait, entered, launched)

    def _launch_idle_then_wait(self, tensor, real_wait, entered: float, launched: float) -> torch.Tensor:
        """CPU: the next planned pieces go onto the idle worker, up to the TP waits predicted for
        the rest of the step less what it holds; then the main thread blocks in the real wait (its
        core goes to the worker)."""
        f, s = self.filler, self.stats
        if not (f.fill and self.op_idle_s > 0.0):  # only measured
            out = real_wait(tensor)
            resumed, running, ran = time.perf_counter(), None, 0.0
        else:
            worker = shared_idle_worker()
            room = (len(f.next_ops) - f.op_index) * self.op_idle_s - f.idle_queued_s()
            while room > 0.0:
                task = f.pick(room, worker=True)
                if task is None:
                    break
                f.launch_idle(task, worker)
                self._launched.append((task, len(s.gaps_s)))
                room -= task.duration_s
                s.filled += 1
            cpu = worker.cpu_s()
            worker.allow()
            try:
                out = real_wait(tensor)
                resumed = time.perf_counter()
            finally:
                worker.hold()  # no piece starts while the main thread runs the LLM (they would share the GIL)
            running, ran = worker.current, worker.cpu_s() - cpu
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

    def _launch_then_wait(self, tensor, real_wait, guard) -> torch.Tensor:
        """CUDA: the pieces that fit in the measured gap go onto the side stream, ordered after
        the current stream (the collective is already enqueued there), then the real wait."""
        f, s = self.filler, self.stats
        if f.fill and self.gap_s > 0.0:
            launched = 0.0
            with guard:
                while True:
                    task = f.pick(self.gap_s - launched)
                    if task is None:
                        break
                    launched += f.run_now(task)
                    s.filled += 1
                    s.pieces.append((task.duration_s, task.duration_s, self.gap_s))
            s.filled_s += min(launched, self.gap_s)
        return real_wait(tensor)


@contextlib.contextmanager
def fill_tp_waits(waits: TensorParallelWaits) -> Iterator[TensorParallelWaits]:
    """While active, every eager wait of a functional collective (DTensor's TP collectives) goes
    through ``waits``."""
    keys = torch_seams.dispatch_keys()

    def wait_tensor(tensor: torch.Tensor, real: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return waits.wait(tensor, real, keys)

    # launched: the AsyncCollectiveTensor keeps the wrapped tensor (or a view): its wait gets it
    with torch_seams.functional_collective_hooks(wait_tensor, waits.launched):
        yield waits


def _lag_figures(lags: list[float]) -> list[float]:
    """[50th percentile, 90th percentile, max] of ``lags`` ([] when there are none)."""
    if not lags:
        return []
    q = statistics.quantiles(lags, n=10, method="inclusive") if len(lags) > 1 else [lags[0]] * 9
    return [float(statistics.median(lags)), float(q[8]), float(max(lags))]


def consumer_delays(launched: Sequence[Sequence[float]], resumed: Sequence[Sequence[float]],
                    in_flight: Sequence[Sequence[float]]) -> list[dict[str, float]]:
    """The delays of the TP collectives' consumers on each rank of one TP group (CPU, one host: the
    ranks' ``time.perf_counter()`` is the same monotonic clock), from :class:`TPWaitStats`'
    ``launched_s``, ``resumed_s`` and ``in_flight_s`` of each rank (the i-th wait of every rank is
    the same collective).

    A collective completes no earlier than its last launch in the group; a wait's *lag* is from
    then to its consumer's resumption: the collective's own time, plus any delay. A rank's own time
    is the median lag of its waits with no piece in flight on its idle worker; a wait with a piece
    in flight is *delayed* by what its lag exceeds that, and an *overrun* when that is more than
    the piece's measured duration. The lags themselves are noisy on a shared host (the scheduler,
    gloo's threads): compare ``lag_s`` and ``lag_free_s``, the 50th and 90th percentiles and the
    largest lag of the waits with a piece in flight and of those without. Per rank: ``delays``,
    ``delay_s`` (their sum), ``delay_max_s``, ``overruns``, ``lag_s``, ``lag_free_s`` (empty: no
    such wait) and ``waits`` (the waits measured: launched while the hooks were active). Raises
    ``ValueError`` when the ranks' waits differ in number."""
    counts = {len(x) for x in (*launched, *resumed, *in_flight)}
    if len(counts) > 1 or not (len(launched) == len(resumed) == len(in_flight)):
        raise ValueError(f"consumer_delays: the ranks' waits differ in number ({sorted(counts)})")
    n = counts.pop() if counts else 0
    last = [max(r[i] for r in launched) for i in range(n)]  # NaN when any rank's launch is unknown
    out = []
    for res, flight in zip(resumed, in_flight):
        measured = [i for i in range(n) if not math.isnan(last[i])]
        lag = {i: res[i] - last[i] for i in measured}
        free = [lag[i] for i in measured if flight[i] <= 0.0]
        busy = [lag[i] for i in measured if flight[i] > 0.0]
        own = statistics.median(free or busy) if measured else 0.0
        excess = [(lag[i] - own, flight[i]) for i in measured if flight[i] > 0.0 and lag[i] > own]
        out.append({"waits": len(measured), "delays": len(excess), "delay_s": sum(e for e, _ in excess),
                    "delay_max_s": max((e for e, _ in excess), default=0.0),
                    "overruns": sum(e > d for e, d in excess), "lag_s": _lag_figures(busy),
                    "lag_free_s": _lag_figures(free)})
    return out


def tp_op_figures(stats: TPWaitStats) -> tuple[float, float, float]:
    """(collectives per pipeline op, median gap, mean gap; seconds) of one step: the median of the
    ops' counts; the median gap is the typical one (what a piece must fit), the mean makes count x
    mean the time the ops waited on TP collectives (the gaps are heavy-tailed on a loaded machine:
    the median leaves most of that time out). NaNs when no TP collective was waited on."""
    counts = [c for c in stats.per_op if c > 0]
    if not counts or not stats.gaps_s:
        return float("nan"), float("nan"), float("nan")
    return (float(statistics.median(counts)), float(statistics.median(stats.gaps_s)),
            float(statistics.fmean(stats.gaps_s)))


__all__ = ["TPWaitStats", "TensorParallelWaits", "consumer_delays", "fill_tp_waits", "tp_op_figures"]
