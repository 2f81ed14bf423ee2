"""Type stubs for pybubble's C++ extension."""

import numpy as np
import numpy.typing as npt

TIME_TOLERANCE: float

class Problem:
    def __init__(
        self,
        horizon: float,
        num_lanes: int,
        compute_offset: npt.ArrayLike,
        compute_start: npt.ArrayLike,
        compute_end: npt.ArrayLike,
        link_offset: npt.ArrayLike,
        link_start: npt.ArrayLike,
        link_end: npt.ArrayLike,
        forward_needed: npt.ArrayLike,
        grad_ready: npt.ArrayLike,
        lane: npt.ArrayLike,
        microbatch: npt.ArrayLike,
        duration: npt.ArrayLike,
        resource: npt.ArrayLike,
        phase: npt.ArrayLike,
        after_offset: npt.ArrayLike,
        after: npt.ArrayLike,
    ) -> None: ...
    @property
    def horizon(self) -> float: ...
    @property
    def num_lanes(self) -> int: ...
    @property
    def num_tasks(self) -> int: ...
    @property
    def num_microbatches(self) -> int: ...
    def fields(self) -> dict[str, object]: ...

class Scheduler:
    def __init__(self, problem: Problem) -> None: ...
    def run(
        self, policy: str = "greedy", durations: npt.ArrayLike | None = None
    ) -> tuple[np.ndarray, np.ndarray, float, float, float]: ...

def validate(
    problem: Problem,
    start: npt.ArrayLike,
    assignment: npt.ArrayLike,
    step_time: float,
    shift_front: float,
    shift_back: float,
) -> list[str]: ...
def synthetic_problem(
    stages: int,
    lanes_per_stage: int,
    microbatches: int,
    encoder_layers: int,
    kernels_per_layer: int,
    llm_fwd: float,
    llm_bwd: float,
    tp_gaps_per_op: int,
    tp_gap: float,
    encoder_scale: float,
    jitter: float,
    seed: int,
) -> Problem: ...
def balance_microbatches(costs: npt.ArrayLike, num_microbatches: int) -> np.ndarray: ...
def balance_lower_bound(costs: npt.ArrayLike, num_microbatches: int) -> float: ...
def max_microbatch_cost(costs: npt.ArrayLike, assignment: npt.ArrayLike, num_microbatches: int) -> float: ...

def simulate_pipeline(
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
) -> dict[str, object]: ...
