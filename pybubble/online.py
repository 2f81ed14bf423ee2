"""Online rescheduling: the same problem structure every step, new task durations each time."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
import threading

import numpy as np

from . import _core
from .problem import Problem
from .scheduler import Schedule, _check_policy, _from_core


class OnlineScheduler:
    """Keeps a problem's structure (lanes, windows, dependencies) and its scheduler's memory, and
    reschedules it with each step's durations.

    ``reschedule`` runs in the calling thread; ``submit`` runs on a background thread with the GIL
    released, so a trainer can overlap it with the current step. Calls are serialised: the
    scheduler's memory is reused by each.
    """

    def __init__(self, problem: Problem, policy: str = "greedy"):
        self.problem = problem
        self.policy = _check_policy(policy)
        self._core = _core.Scheduler(problem.core)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def reschedule(self, durations: np.ndarray) -> Schedule:
        """A schedule for the same problem with `durations` (float64, one per task, finite, >= 0)."""
        d = np.ascontiguousarray(durations, dtype=np.float64)
        if d.shape != (self.problem.num_tasks,):
            raise ValueError(f"durations: shape {d.shape}, expected ({self.problem.num_tasks},)")
        with self._lock:
            return _from_core(self._core.run(self.policy, d))

    def submit(self, durations: np.ndarray) -> Future[Schedule]:
        """Schedules in the background; the Future holds the Schedule (or the ValueError)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pybubble-online")
        d = np.array(durations, dtype=np.float64)  # a private copy: the caller may reuse its buffer
        return self._pool.submit(self.reschedule, d)

    def close(self) -> None:
        """Stops the background thread (after the work already submitted)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> "OnlineScheduler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
