"""Tensor-parallel waits: the encoder's pieces inside the waits of the LLM's TP collectives.

torch's tensor parallelism (DTensor, ``parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel``) issues its collectives as functional collectives. Run eagerly, a collective's
result is an ``AsyncCollectiveTensor``: the collective is launched at once and its
``torch.ops._c10d_functional.wait_tensor`` runs where the result is first used (the residual add
after a row-parallel projection, the gradient accumulation after a column-parallel one's input
gradient), always through the module-level ``wait_tensor`` of
``torch.distributed._functional_collectives``. While :func:`fill_tp_waits` is active that function
is replaced by one that hands the wait to the filler:

- CPU (gloo): a waiter thread blocks in the real wait (it releases the GIL); while it has not
  returned, the filler runs the next planned piece that fits in what is left of the TP gap measured
  on this mesh, then looks again. A piece starts only while the collective is pending, so the
  consumer waits at most for the piece running when the collective completes: a delay no longer
  than that piece. A delay longer than the piece's measured duration (the piece ran long) is an
  *overrun*; every one is counted (:class:`TPWaitStats`).
- CUDA (NCCL): the wait is a stream dependency, the CPU does not block: the pieces whose measured
  durations fit in the measured gap are launched on the side stream, ordered after the current
  stream at this point (after the collective's launch), then the real wait orders the current
  stream after the collective.

The hook runs inside the ``__torch_dispatch__`` of a tensor subclass, below autograd; the pieces
run with the dispatch keys of the place where :func:`fill_tp_waits` was entered, so their forwards
record autograd graphs as they would anywhere else. These are private torch names (pinned with
the pipelining adapter's ``SUPPORTED_TORCH``).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed._functional_collectives as funcol
from torch.profiler import record_function

from .filler import BubbleFiller
from .pipelining import check_torch_version

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
    delays: int = 0
    """Waits whose consumer resumed after the collective completed because a piece was running."""
    delay_s: float = 0.0
    """Those delays summed."""
    delay_max_s: float = 0.0
    """The longest of them."""
    overruns: int = 0
    """Delays longer than the measured duration of the piece that caused them."""
    gaps_s: list[float] = field(default_factory=list)
    """Each wait's gap, in order."""
    pieces: list[tuple[float, float, float]] = field(default_factory=list)
    """Each piece run inside a wait: (measured duration, time it took, the gap it went into)."""
    per_op: list[int] = field(default_factory=list)
    """Waits inside each of the rank's pipeline ops (the filler's ``next_ops`` order)."""


_waiters: ThreadPoolExecutor | None = None


def _waiter_pool() -> ThreadPoolExecutor:
    global _waiters
    if _waiters is None:
        _waiters = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pybubble-tp-wait")
    return _waiters


class TensorParallelWaits:
    """Runs ``filler``'s pieces inside the waits of TP collectives (see the module's notes).

    ``gap_s``: a TP collective's gap as measured on this mesh (the filler's room at each wait;
    0: nothing is run, the waits are only measured). ``stats`` holds what this step saw."""

    def __init__(self, filler: BubbleFiller, gap_s: float = 0.0):
        self.filler = filler
        self.gap_s = float(gap_s)
        self.stats = TPWaitStats(per_op=[0] * len(filler.next_ops))

    def wait(self, tensor: torch.Tensor, real_wait: Callable[[torch.Tensor], torch.Tensor],
             keys: tuple[object, object] | None = None) -> torch.Tensor:
        """Waits for the collective whose result is ``tensor`` (``real_wait(tensor)``), running
        pieces while it is pending; ``keys``: the dispatch keys (included, excluded) the pieces
        run with."""
        f, s = self.filler, self.stats
        s.waits += 1
        if f._in_op and f._op < len(s.per_op):
            s.per_op[f._op] += 1
        entered = time.perf_counter()
        outer = f._in_wait  # inside another accounted wait: that one excludes this time
        f._in_wait = True
        try:
            with record_function(_TP_WAIT):
                guard = torch._C._ForceDispatchKeyGuard(*keys) if keys is not None else contextlib.nullcontext()
                if f.side is not None:
                    out = self._launch_then_wait(tensor, real_wait, guard)
                elif f.fill and self.gap_s > 0.0 and (first := f._pick(self.gap_s)[0]) is not None:
                    out = self._fill_while_pending(tensor, real_wait, entered, guard, first)
                else:  # nothing fits: the plain wait (no hand-off to a waiter thread)
                    out = real_wait(tensor)
                    gap = time.perf_counter() - entered
                    s.gaps_s.append(gap)
                    s.gap_s += gap
                    s.waited_s += gap
        finally:
            f._in_wait = outer
            end = time.perf_counter()
            if not outer:
                f._excluded += end - entered
            if f.trace is not None:
                f.trace.append(("tp_wait", entered, end))
        return out

    def _fill_while_pending(self, tensor, real_wait, entered: float, guard, first) -> torch.Tensor:
        """CPU: ``first`` (a task that fits the gap) and then the next that fit run while a waiter
        thread waits for the collective."""
        f, s = self.filler, self.stats
        done_at = [0.0]

        def waiter() -> torch.Tensor:
            try:
                return real_wait(tensor)
            finally:
                done_at[0] = time.perf_counter()

        pending = _waiter_pool().submit(waiter)
        deadline = entered + self.gap_s
        ran: list[tuple[float, float, float]] = []  # (measured, start, end) of the pieces run
        with guard:
            task = first
            while not pending.done():
                if task is None:
                    task, _too_long = f._pick(f._room(deadline, time.perf_counter()))
                    if task is None:
                        break  # nothing fits or nothing is ready: wait
                t = time.perf_counter()
                f._run(task)
                ran.append((task.duration_s, t, time.perf_counter()))
                task = None
        out = pending.result()
        resumed = time.perf_counter()
        gap = done_at[0] - entered
        filled = min(gap, sum(e - b for _, b, e in ran))
        s.gaps_s.append(gap)
        s.gap_s += gap
        s.waited_s += gap - filled
        s.filled += len(ran)
        s.filled_s += filled
        s.pieces.extend((d, e - b, gap) for d, b, e in ran)
        if ran and ran[-1][2] > done_at[0]:  # the collective completed while the last piece ran
            delay = resumed - done_at[0]
            s.delays += 1
            s.delay_s += delay
            s.delay_max_s = max(s.delay_max_s, delay)
            s.overruns += delay > ran[-1][0]
        return out

    def _launch_then_wait(self, tensor, real_wait, guard) -> torch.Tensor:
        """CUDA: the pieces that fit in the measured gap go onto the side stream, ordered after
        the current stream (the collective is already enqueued there), then the real wait."""
        f, s = self.filler, self.stats
        if f.fill and self.gap_s > 0.0:
            launched = 0.0
            with guard:
                while True:
                    task, _too_long = f._pick(self.gap_s - launched)
                    if task is None:
                        break
                    launched += f._run(task)
                    s.filled += 1
                    s.pieces.append((task.duration_s, task.duration_s, self.gap_s))
            s.filled_s += min(launched, self.gap_s)
        return real_wait(tensor)


@contextlib.contextmanager
def fill_tp_waits(waits: TensorParallelWaits) -> Iterator[TensorParallelWaits]:
    """While active, every eager wait of a functional collective (DTensor's TP collectives) goes
    through ``waits``."""
    check_torch_version()
    real = funcol.wait_tensor
    keys = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())

    def wait_tensor(tensor: torch.Tensor) -> torch.Tensor:
        return waits.wait(tensor, real, keys)

    funcol.wait_tensor = wait_tensor
    try:
        yield waits
    finally:
        funcol.wait_tensor = real


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


__all__ = ["TPWaitStats", "TensorParallelWaits", "fill_tp_waits", "tp_op_figures"]
