"""Type stubs for pybubble's C++ extension."""

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

TIME_TOLERANCE: float
LIMITS: dict[str, int | float]
"""The largest input the core accepts (csrc/pybubble/limits.h): counts, and "time" in us."""

class WindowArrays(Protocol):
    """One resource's free windows in CSR form: lane l's windows are [offset[l], offset[l + 1])."""

    offset: npt.ArrayLike  # int64, num_lanes + 1 entries
    start: npt.ArrayLike  # float64
    end: npt.ArrayLike  # float64

class TaskArrays(Protocol):
    """The tasks' arrays: predecessors of task t are after[after_offset[t]:after_offset[t + 1]]."""

    lane: npt.ArrayLike  # integers
    microbatch: npt.ArrayLike  # integers
    resource: npt.ArrayLike  # integers: 0 compute, 1 comm
    phase: npt.ArrayLike  # integers: 0 fwd, 1 bwd
    after_offset: npt.ArrayLike  # integers, num_tasks + 1 entries
    after: npt.ArrayLike  # integers
    duration: npt.ArrayLike  # float64

class ProblemArrays(Protocol):
    """What _core.Problem reads, by attribute."""

    horizon: float
    compute_free: WindowArrays
    link_free: WindowArrays
    forward_needed: npt.ArrayLike  # float64, one per LLM microbatch
    grad_ready: npt.ArrayLike  # float64, one per LLM microbatch
    tasks: TaskArrays

class Problem:
    def __init__(self, arrays: ProblemArrays) -> None: ...
    @property
    def horizon(self) -> float: ...
    @property
    def num_lanes(self) -> int: ...
    @property
    def num_tasks(self) -> int: ...
    @property
    def num_microbatches(self) -> int: ...
    def with_tasks(self, tasks: TaskArrays) -> Problem:
        """This problem's bubbles (windows shared, not copied) with other tasks, checked."""
    def joined(self, blocks: Sequence[Problem], counts: npt.ArrayLike) -> Problem:
        """This problem's bubbles with the tasks of `blocks` (with_tasks of these bubbles, every task
        of microbatch 0), block b repeated counts[b] times, each copy a microbatch of its own."""
    def longest_paths(self) -> tuple[float, float, float, float]:
        """The longest forward and backward paths by duration, then by compute tasks only."""
    def arrays(self) -> dict[str, Any]:
        """{"horizon": float, "compute_free": {"offset", "start", "end"}, "link_free": {...},
        "forward_needed": array, "grad_ready": array, "tasks": {"lane", ..., "after"}}"""

HOLES_ORDERS: int
"""How many orders the holes filler tries (Scheduler.kHolesOrders)."""

class Scheduler:
    def __init__(self, problem: Problem) -> None: ...
    def run(
        self, policy: str = "greedy", durations: npt.ArrayLike | None = None, *, fixed_assignment: bool = False,
        orders: int = 31,
    ) -> tuple[np.ndarray, np.ndarray, float, float, float]: ...
    @property
    def holes_order(self) -> int:
        """The holes order that gave the last run's schedule; -1 after another policy."""

class ReplicaScheduler:
    def __init__(
        self, problem: Problem, threads: int = 1, policy: str = "greedy", *, fixed_assignment: bool = True
    ) -> None: ...
    @property
    def copies(self) -> int: ...
    @property
    def threads(self) -> int: ...
    def run(
        self, scale: npt.ArrayLike
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(start: replicas x tasks / copies, assignment: replicas x microbatches, step_time,
        shift_front, shift_back, seconds)"""

def twin_copies(problem: Problem) -> int: ...
def first_fit_floor(problem: Problem) -> np.ndarray: ...
def validate(
    problem: Problem,
    start: npt.ArrayLike,
    assignment: npt.ArrayLike,
    step_time: float,
    shift_front: float,
    shift_back: float,
) -> list[str]: ...
def synthetic_problem(
    *,
    stages: int = 4,
    lanes_per_stage: int = 2,
    twin_lanes: int = 1,
    microbatches: int = 8,
    encoder_layers: int = 8,
    kernels_per_layer: int = 16,
    llm_fwd: float = 4000.0,
    llm_bwd: float = 8000.0,
    tp_gaps_per_op: int = 4,
    tp_gap: float = 150.0,
    encoder_scale: float = 1.0,
    jitter: float = 0.2,
    seed: int = 0,
) -> Problem: ...
def balance_microbatches(costs: npt.ArrayLike, num_microbatches: int) -> np.ndarray: ...
def balance_lower_bound(costs: npt.ArrayLike, num_microbatches: int) -> float: ...
def max_microbatch_cost(costs: npt.ArrayLike, assignment: npt.ArrayLike, num_microbatches: int) -> float: ...
def balance_replicas(
    image_cost: npt.ArrayLike, image_owner: npt.ArrayLike, replicas: int, image_slot: npt.ArrayLike | None = None
) -> np.ndarray:
    """Moves of encoder work between replicas: one (image, from, to) row each, int64."""

def simulate_pipeline(
    *,
    ranks: int,
    chunks: int,
    microbatches: int,
    row_offset: npt.ArrayLike,
    stage: npt.ArrayLike,
    kind: npt.ArrayLike,
    microbatch: npt.ArrayLike,
    fwd: npt.ArrayLike,
    bwd: npt.ArrayLike,
    wgrad: npt.ArrayLike,
    p2p: float,
    tp_count: int,
    tp_duration: float,
    dp_allgather: float,
    dp_reducescatter: float,
) -> dict[str, Any]: ...
def one_f_one_b(ranks: int, microbatches: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32],
                                                       npt.NDArray[np.uint8], npt.NDArray[np.int32]]:
    """The 1F1B table as (row_offset, stage, kind, microbatch) arrays."""
def simulate_pipeline_seconds(repeat: int, **spec: Any) -> float:
    """The median seconds of `repeat` runs of simulate_pipeline(**spec) in C++."""
