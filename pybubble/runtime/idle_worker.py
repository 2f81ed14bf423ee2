"""The CPU's side stream: a worker thread that runs encoder tasks only when a core would idle.

On CUDA the filler launches encoder kernels onto a side stream of the lowest priority, and the GPU
runs them where the LLM's stream leaves it idle. :class:`IdleWorker` is the same thing for the
host: one thread, scheduled with Linux's ``SCHED_IDLE`` policy (the kernel runs it only on a core
that has nothing else to run, and preempts it the moment another thread wants the core), that
runs the tasks launched onto it in launch order. A rank that blocks in a TP collective's wait
frees its core; the worker takes it, and when the collective completes the rank's main thread
takes it back.

Python's GIL is the one thing the two threads share: the worker holds it between two torch ops of
a task (torch releases it inside every op). So that the LLM's own Python does not wait for it,
the worker can be *held* (:meth:`IdleWorker.hold`): it then starts no task until
:meth:`IdleWorker.allow` (a running task goes on); the filler allows it only while the main
thread is blocked. While the worker has work, the interpreter's switch interval is
:attr:`IdleWorker.switch_interval_s` (restored when it drains), which bounds how long a resumed
main thread waits for the GIL.

Where ``SCHED_IDLE`` is not available (not Linux), the worker runs at the lowest nice level, or,
failing that, at normal priority; :attr:`IdleWorker.policy` says which.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable


def _lower_own_priority() -> str:
    """Lowers the calling thread's CPU priority as far as the platform allows; returns how."""
    if hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
            return "SCHED_IDLE"
        except OSError:
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: per thread
        return "nice 19"
    except (OSError, AttributeError):
        return "normal"


class IdleWorker:
    """One thread at idle priority running launched callables in order (see the module's notes).

    ``switch_interval_s``: the interpreter's switch interval while the worker has work (None:
    leave it as it is)."""

    def __init__(self, switch_interval_s: float | None = 2e-4, name: str = "pybubble-idle"):
        self.switch_interval_s = switch_interval_s
        self._queue: queue.SimpleQueue[tuple[Callable[[], None], object | None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._error: BaseException | None = None
        self._saved_interval: float | None = None
        self._ready = threading.Event()
        self._open = threading.Event()
        self._open.set()
        self._now: tuple[object, float] | None = None
        """The task running now: (what, perf_counter at its start); one attribute, read at once."""
        self._last: tuple[object | None, float, float] = (None, 0.0, 0.0)
        """The task finished last: (what, perf_counter at its start, at its end)."""
        self.policy = ""
        """How the worker's priority was lowered: ``SCHED_IDLE``, ``nice 19`` or ``normal``."""
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        self._clock = time.pthread_getcpuclockid(self._thread.ident) if hasattr(time, "pthread_getcpuclockid") else None

    def _loop(self) -> None:
        self.policy = _lower_own_priority()
        self._ready.set()
        while (item := self._queue.get()) is not None:
            fn, what = item
            self._open.wait()
            try:
                if self._error is None:  # after a failure the rest is skipped, not run out of order
                    self._now = (what, time.perf_counter())
                    fn()
            except BaseException as e:  # handed to the thread that drains
                self._error = e
            finally:
                if (now := self._now) is not None:
                    self._last = (*now, time.perf_counter())
                self._now = None
                with self._lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self._restore_interval()
                    self._idle.notify_all()

    def _restore_interval(self) -> None:
        if self._saved_interval is not None:
            sys.setswitchinterval(self._saved_interval)
            self._saved_interval = None

    @property
    def busy(self) -> bool:
        """Whether launched work has not finished."""
        return self._pending > 0

    @property
    def current(self) -> object | None:
        """What the worker is running now (the ``what`` given to :meth:`launch`), None when idle."""
        now = self._now
        return None if now is None else now[0]

    def running_at(self, t: float) -> object | None:
        """What the worker was running at ``time.perf_counter()`` ``t`` (None: nothing), asked
        soon after ``t``: the task running now if it had started by then, else the one finished
        last if it ran over ``t``. A thread that took the GIL back from a task may lose it to the
        worker again before it asks (preempted, or past the switch interval), long enough for the
        task to end: :attr:`current` alone would then say the worker was idle."""
        now, last = self._now, self._last  # this order: a task that ends in between is `last`
        if now is not None and now[1] <= t:
            return now[0]
        what, begun, ended = last
        return what if begun <= t <= ended else None

    def launch(self, fn: Callable[[], None], what: object | None = None) -> None:
        """Queues ``fn`` after everything launched so far (``what``: how :attr:`current` names it
        while it runs); raises, as a RuntimeError, what an earlier task raised (the tasks queued
        after a failed one are skipped until :meth:`drain` reports it)."""
        if self._error is not None:
            raise RuntimeError(f"an encoder task on the idle worker failed: {self._error!r}") from self._error
        with self._lock:
            if self._pending == 0 and self.switch_interval_s is not None:
                self._saved_interval = sys.getswitchinterval()
                sys.setswitchinterval(self.switch_interval_s)
            self._pending += 1
        self._queue.put((fn, what))

    def hold(self) -> None:
        """From now on the worker starts no task (one running goes on) until :meth:`allow`."""
        self._open.clear()

    def allow(self) -> None:
        """Lets the worker start tasks again (the default)."""
        self._open.set()

    def drain(self) -> None:
        """Blocks until everything launched has run (the caller's core is free meanwhile, so the
        worker gets it; a :meth:`hold` is lifted meanwhile); raises, as a RuntimeError, what a task
        raised."""
        self.wait_until(lambda: self._pending == 0)

    def wait_until(self, done: Callable[[], bool]) -> None:
        """Blocks until ``done()`` (checked after each task the worker finishes) or a task failed,
        as :meth:`drain` does; raises, as a RuntimeError, what a task raised."""
        held = not self._open.is_set()
        self._open.set()
        try:
            with self._lock:
                # after a failure: until the tasks queued behind it are skipped, then raise
                while self._pending and (self._error is not None or not done()):
                    self._idle.wait()
        finally:
            if held:
                self._open.clear()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"an encoder task on the idle worker failed: {error!r}") from error

    def cpu_s(self) -> float:
        """The worker thread's CPU time so far (seconds; 0 where the platform cannot say)."""
        return time.clock_gettime(self._clock) if self._clock is not None else 0.0

    def close(self) -> None:
        """Drains and stops the thread."""
        try:
            self.drain()
        finally:
            self._queue.put(None)
            self._thread.join()


_worker: IdleWorker | None = None


def shared_idle_worker() -> IdleWorker:
    """The process's idle worker (started on first use; its thread lives as long as the process)."""
    global _worker
    if _worker is None:
        _worker = IdleWorker()
    return _worker


__all__ = ["IdleWorker", "shared_idle_worker"]
