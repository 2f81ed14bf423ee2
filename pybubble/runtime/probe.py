"""Completion of a ``dist.Work`` that can be polled without blocking.

gloo's send/recv ``Work.is_completed()`` stays False until ``wait()`` is called, so completion is
observed by a waiter thread (of a shared pool) that blocks in ``wait()`` (which releases the GIL);
the rank's main thread polls its future. This works for every backend.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait

import torch.distributed as dist


class WorkProbe:
    """Completion of one ``dist.Work``: a waiter thread of a shared pool blocks in its ``wait()``.
    The pool's threads live on, so a probe costs a queue hand-off, not a thread start (which waits
    for the GIL: up to ``sys.getswitchinterval()`` on a busy host)."""

    __slots__ = ("work", "future", "done_at")
    _pool: ThreadPoolExecutor | None = None

    def __init__(self, work: dist.Work):
        self.work = work
        self.done_at = 0.0
        """``time.perf_counter()`` when the work completed (its waiter returned)."""
        self.future = self._waiters().submit(self._wait)
        """The waiter's future: done when the work completed."""

    @classmethod
    def _waiters(cls) -> ThreadPoolExecutor:
        if cls._pool is None:
            # Enough waiters for every receive a step posts at once (each blocks one until it arrives).
            cls._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="pybubble-probe")
        return cls._pool

    def _wait(self) -> None:
        try:
            self.work.wait()
        finally:
            self.done_at = time.perf_counter()

    def done(self) -> bool:
        """Whether the awaited work has completed."""
        return self.future.done()

    @staticmethod
    def wait_all(probes: Sequence[WorkProbe], until: float) -> None:
        """Blocks until every probe completed or ``time.perf_counter()`` reaches ``until``."""
        futures_wait([p.future for p in probes], timeout=max(0.0, until - time.perf_counter()))

    def result(self, timeout: float | None = None) -> None:
        """Blocks until the work completed; raises what its ``wait()`` raised."""
        try:
            self.future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"work not completed within {timeout} s") from None


def all_done(probes: Sequence[WorkProbe]) -> bool:
    """Whether every probe's work has completed."""
    return all(p.done() for p in probes)


__all__ = ["WorkProbe", "all_done"]
