"""Online rescheduling: the same problem structure every step, new task durations each time, for
one pipeline (:class:`OnlineScheduler`) or for every data-parallel replica of a step in one call
to the core (:class:`ReplicaScheduler`, :class:`ReplicaSchedules`, :func:`data_parallel_step`)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
import threading

import numpy as np

from .. import _core
from ..config.checks import integer, real_array
from ..problem.problem import Problem
from .scheduler import Schedule, check_policy, from_core


class OnlineScheduler:
    """Keeps a problem's structure (lanes, windows, dependencies) and its scheduler's memory, and
    reschedules it with each step's durations.

    ``reschedule`` runs in the calling thread; ``submit`` runs on a background thread with the GIL
    released, so a trainer can overlap it with the current step. Calls are serialised: the
    scheduler's memory is reused by each.
    """

    def __init__(self, problem: Problem, policy: str = "greedy", *, fixed_assignment: bool = False):
        self.problem = problem
        """The problem whose structure is kept."""
        self.policy = check_policy(policy)
        """The scheduling policy."""
        self.fixed_assignment = bool(fixed_assignment)
        """Encoder microbatch j feeds LLM microbatch j (its durations are those of its own data;
        :func:`~pybubble.schedule.scheduler.schedule_problem`); by default the LLM microbatches take
        the encoder's in the order their forwards finish."""
        self._core = _core.Scheduler(problem.core)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        t = problem.arrays().tasks
        self._duration, self._microbatch = t.duration, t.microbatch

    def reschedule(self, durations: np.ndarray) -> Schedule:
        """A schedule for the same problem with `durations` (float64, one per task, finite, >= 0)."""
        d = np.asarray(durations)  # its dtype is checked by the core (no lossy cast here)
        if d.shape != (self.problem.num_tasks,):
            raise ValueError(f"durations: shape {d.shape}, expected ({self.problem.num_tasks},)")
        with self._lock:
            return from_core(self._core.run(self.policy, d, fixed_assignment=self.fixed_assignment))

    def scaled_durations(self, scale: np.ndarray) -> np.ndarray:
        """The problem's task durations with encoder microbatch j's tasks multiplied by ``scale[j]``:
        the tasks of a batch whose microbatch j costs ``scale[j]`` times the one the problem holds."""
        return _scaled_durations(self._duration, self._microbatch, scale, self.problem.num_microbatches)

    def submit(self, durations: np.ndarray) -> Future[Schedule]:
        """Schedules in the background; the Future holds the Schedule (or the ValueError)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pybubble-online")
        d = np.array(durations)  # a private copy: the caller may reuse its buffer
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


@dataclass(frozen=True, slots=True, eq=False)
class ReplicaSchedules:
    """Every replica's schedule of one :meth:`ReplicaScheduler.run`, in compact rows: replica k's
    task t starts at ``start[k, t // copies]``. With ``copies`` > 1 the problem is made of twin
    lanes (the same windows, the same kernels, each after its own lane's: encoder pipelines that
    share every microbatch evenly on the same LLM ranks), which the scheduler places alike; one row
    holds one copy's starts."""

    copies: int
    """Twin copies of the problem: tasks ``copies * g`` to ``copies * g + copies - 1`` share row entry
    g (1: no twins, one entry per task)."""
    start: np.ndarray
    """replicas x (tasks / copies), float64: the starts (us)."""
    assignment: np.ndarray
    """replicas x microbatches, int64: ``assignment[k, j]`` the LLM microbatch replica k's encoder
    microbatch j feeds."""
    step_time: np.ndarray
    """Per replica (us), as :attr:`Schedule.step_time`."""
    shift_front: np.ndarray
    """Per replica (us)."""
    shift_back: np.ndarray
    """Per replica (us)."""
    took: np.ndarray
    """Per replica, the seconds of its reschedule in the core (its durations included)."""

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def schedule(self, replica: int) -> Schedule:
        """Replica `replica`'s :class:`Schedule`, one start per task (the row expanded)."""
        k = integer(replica, "replica", minimum=0, maximum=len(self) - 1)
        return Schedule(step_time=float(self.step_time[k]), shift_front=float(self.shift_front[k]),
                        shift_back=float(self.shift_back[k]), start=np.repeat(self.start[k], self.copies),
                        assignment=self.assignment[k].copy())

    def schedules(self) -> list[Schedule]:
        """Every replica's :class:`Schedule`."""
        return [self.schedule(k) for k in range(len(self))]


class ReplicaScheduler:
    """Reschedules one problem for each data-parallel replica of a step, each with its own encoder
    work: replica k's durations are the problem's with encoder microbatch j's tasks scaled by
    ``scale[k, j]`` (:meth:`OnlineScheduler.scaled_durations`).

    One call to the core schedules every replica: the replicas are split over `threads` threads in
    the core (replica k on thread ``k % threads``, the calling thread being thread 0) with the GIL
    released, and a problem made of twin lanes is scheduled as one copy (:class:`ReplicaSchedules`).
    Each replica's schedule is exactly the one :class:`OnlineScheduler` gives for its durations, on
    any number of threads. Row k's encoder microbatch j carries the data of replica k's LLM
    microbatch j, so it feeds that microbatch (`fixed_assignment`, by default). Calls are
    serialised: the core's memory is reused by each.
    """

    def __init__(self, problem: Problem, threads: int = 1, policy: str = "greedy", *, fixed_assignment: bool = True):
        self.threads = integer(threads, "threads", minimum=1)
        """Threads the replicas are split over."""
        self.policy = check_policy(policy)
        """The scheduling policy."""
        self.fixed_assignment = bool(fixed_assignment)
        """Encoder microbatch j feeds LLM microbatch j."""
        self._problem = problem
        self._core = _core.ReplicaScheduler(problem.core, self.threads, self.policy,
                                            fixed_assignment=self.fixed_assignment)
        self._lock = threading.Lock()
        t = problem.arrays().tasks
        self._duration, self._microbatch = t.duration, t.microbatch
        self.took = np.zeros(0)
        """Seconds of each replica's reschedule (its durations included) in the last call."""

    @property
    def problem(self) -> Problem:
        """The problem whose structure every replica shares."""
        return self._problem

    @property
    def copies(self) -> int:
        """Twin copies the problem is scheduled as one of (1: none; :class:`ReplicaSchedules`)."""
        return int(self._core.copies)

    def durations(self, scale: np.ndarray) -> np.ndarray:
        """One replica's task durations: :meth:`OnlineScheduler.scaled_durations` of one row of
        `scale`."""
        return _scaled_durations(self._duration, self._microbatch, scale, self._problem.num_microbatches)

    def run(self, scale: np.ndarray) -> ReplicaSchedules:
        """Every replica's schedule: `scale` is replicas x encoder microbatches (finite, >= 0)."""
        s = real_array(scale, "scale", minimum=0.0, ndim=2)
        if s.shape[1] != self._problem.num_microbatches:
            raise ValueError(f"scale: shape {s.shape}, expected (replicas, {self._problem.num_microbatches})")
        with self._lock:
            start, assignment, step_time, shift_front, shift_back, took = self._core.run(s)
        self.took = took
        return ReplicaSchedules(copies=self.copies, start=start, assignment=assignment, step_time=step_time,
                                shift_front=shift_front, shift_back=shift_back, took=took)

    def reschedule(self, scale: np.ndarray) -> list[Schedule]:
        """One :class:`Schedule` per replica (:meth:`run`, every row expanded)."""
        return self.run(scale).schedules()

    def close(self) -> None:
        """Nothing to stop: the core's threads end with each call (kept for ``with`` blocks)."""

    def __enter__(self) -> "ReplicaScheduler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _scaled_durations(duration: np.ndarray, microbatch: np.ndarray, scale: np.ndarray, microbatches: int) -> np.ndarray:
    """`duration` with each task's scaled by its microbatch's entry of `scale` (finite, >= 0)."""
    s = real_array(scale, "scale", minimum=0.0)
    if s.shape != (microbatches,):
        raise ValueError(f"scale: shape {s.shape}, expected ({microbatches},)")
    return duration * s[microbatch]


def data_parallel_step(step_times: Sequence[float] | np.ndarray) -> float:
    """The step of data-parallel replicas with these step times (each its encoder and LLM work):
    they meet at the gradient collective, where every replica waits for the slowest, so the step
    is the largest."""
    t = real_array(step_times, "step_times", minimum=0.0)
    if t.size == 0:
        raise ValueError("step_times: no replicas")
    return float(t.max())


def replay(problem: Problem, planned: Schedule) -> float:
    """The step time when a schedule planned for other durations is followed on `problem`.

    Replaying keeps what a static plan fixes: each task's region (before the step, inside it, after
    it), its order on its lane and resource, and the assignment. With the new durations, tasks
    before the step are packed as late as possible before 0 and tasks after it as early as
    possible from the horizon; a task inside the step starts at its planned time or when its
    predecessors and the lane let it. Whatever then runs outside the lane's free windows takes the
    LLM's own time on that lane, and a forward that ends after its LLM microbatch needs it holds
    that microbatch up: the LLM step grows by the larger of the two (the worst lane's overrun, the
    worst lateness). A stall model, not a simulation of the LLM's reaction.
    """
    a = problem.arrays()
    tasks = a.tasks
    n, horizon = problem.num_tasks, problem.horizon
    if planned.start.shape != (n,):
        raise ValueError(f"start: {planned.start.shape[0]} entries, the problem has {n} tasks")
    dur = tasks.duration
    key = 2 * tasks.lane + tasks.resource
    preds = tasks.predecessors()
    region = np.where(planned.start < 0.0, 0, np.where(planned.start >= horizon, 2, 1))
    order = np.lexsort((np.arange(n), planned.start))
    start = np.zeros(n)
    end = np.zeros(n)
    # Before the step: latest first, as late as possible below the lane and the successors.
    succ_start: dict[int, float] = {}
    lane_front: dict[int, float] = {}
    for t in order[::-1]:
        if region[t] != 0:
            continue
        latest = min(lane_front.get(key[t], 0.0), succ_start.get(t, 0.0))
        start[t] = latest - dur[t]
        end[t] = latest
        lane_front[key[t]] = start[t]
        for p in preds[t]:
            succ_start[p] = min(succ_start.get(p, 0.0), start[t])
    # Inside and after the step, in planned order.
    lane_end: dict[int, float] = {}
    for t in order:
        if region[t] == 0:
            continue
        ready = max([planned.start[t] if region[t] == 1 else horizon, lane_end.get(key[t], -np.inf)]
                    + [end[p] for p in preds[t]])
        start[t], end[t] = ready, ready + dur[t]
        lane_end[key[t]] = end[t]
    # Compute that runs outside the lane's compute windows displaces the LLM's own compute.
    compute = [np.array(a.compute_free.of(lane), np.float64).reshape(-1, 2) for lane in range(problem.num_lanes)]
    overrun: dict[int, float] = {}
    for t in np.nonzero((region == 1) & (tasks.resource == 0))[0]:
        ws, we = compute[int(tasks.lane[t])].T
        inside = np.clip(np.minimum(we, end[t]) - np.maximum(ws, start[t]), 0.0, None).sum()
        overrun[key[t]] = overrun.get(key[t], 0.0) + (dur[t] - inside)
    fwd = tasks.phase == 0
    need = a.forward_needed[planned.assignment[tasks.microbatch]]
    late = np.maximum(0.0, end - need)[fwd & (region == 1)]
    delay = max([0.0, *overrun.values(), float(late.max(initial=0.0))])
    front = -min(0.0, float(start.min(initial=0.0)))
    back = max(0.0, float(end.max(initial=horizon)) - horizon)
    return horizon + delay + front + back
