"""A planned encoder task bound to what runs it: the filler's unit of work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..placement.plan import PlannedTask


@dataclass(slots=True)
class FillTask:
    """One planned encoder task on this rank, ready to run."""

    name: str
    """A label for traces (the piece and microbatch)."""
    duration_s: float
    """Measured duration, used to decide whether it fits in what is left of a gap."""
    planned_start_s: float
    """Start in the plan, LLM frame (0 = this rank enters the pipeline step)."""
    run: Callable[[], None]
    """Runs the task (launches it, on CUDA)."""
    ready: Callable[[], bool] = lambda: True
    """False while an input from another rank (an output gradient) has not arrived."""
    wait_ready: Callable[[], None] = lambda: None
    """Blocks until ``ready()``."""
    needed_by: int | None = None
    """For forward tasks: the LLM microbatch whose first-stage forward needs this task's result."""
    needed_at_s: float = float("inf")
    """For forward tasks on a rank other than the first stage's: when (seconds after the frame
    origin) the first stage is planned to need this task's microbatch."""
    chain: int = 0
    """Tasks of one chain (one encoder microbatch) run in plan order; another chain's task may run
    while this chain's next one waits for its input or does not fit."""
    host_only: bool = False
    """Runs on the rank's main thread only, never on the idle worker (it talks to another rank)."""
    done: bool = field(default=False)
    """Ran (CPU), or was launched on the side stream (CUDA) or onto the idle worker (CPU)."""
    took_s: float = 0.0
    """CPU: how long its run took (0 until it ran; on the idle worker its thread's CPU time; on
    CUDA the launch is not its duration)."""
    finished: bool = field(default=False)
    """CPU: has run to its end (a task queued onto the idle worker is done before it is
    finished)."""

    @classmethod
    def of(cls, planned: PlannedTask, run: Callable[[], None], ready: Callable[[], bool] | None = None,
           wait_ready: Callable[[], None] | None = None) -> FillTask:
        """The task ``planned`` describes, run by ``run`` (with ``ready``/``wait_ready`` when its
        input comes from another rank)."""
        extra = {} if ready is None else {"ready": ready, "wait_ready": wait_ready}
        return cls(name=planned.label, duration_s=planned.duration_s, planned_start_s=planned.planned_start_s,
                   run=run, needed_by=planned.needed_by, chain=planned.chain, host_only=planned.host_only,
                   needed_at_s=float("inf") if planned.needed_at_s is None else planned.needed_at_s, **extra)


__all__ = ["FillTask"]
