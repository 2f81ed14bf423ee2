"""The LLM's 3D-parallel step simulated from an action table: ops, bubbles with their kinds, and
the encoder's dependency points (forward_needed F_k, grad_ready B_k). The simulation runs in the
C++ core; this module prepares its arrays and turns timelines into problems."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Union

import numpy as np

from . import _core
from .problem import Problem, task_arrays
from .schedules import KINDS, NAMES, TableLike, build_table, check_table, flatten, load_csv

BUBBLE_KINDS = ("dp_allgather", "pp_warmup", "pp_steady", "pp_cooldown", "tp", "dp_reducescatter")
Costs = Union[float, Sequence[float], Sequence[Sequence[float]], np.ndarray]


class Op(NamedTuple):
    """One LLM action: on pipeline rank ``stage``, model chunk ``chunk``."""
    stage: int
    """Pipeline rank that runs the action."""
    chunk: int
    """Position of the action's stage among the rank's stages (0 .. chunks - 1)."""
    kind: str
    """"F", "B", "I" or "W"."""
    microbatch: int
    """LLM microbatch."""
    start: float
    """Start (us)."""
    end: float
    """End (us)."""
    stage_index: int
    """The table's (global) stage of the action, as in "3F1"."""


class Bubble(NamedTuple):
    """One compute-idle interval of pipeline rank ``stage``."""
    stage: int
    start: float
    end: float
    kind: str


class Timeline:
    """A simulated LLM step (see :func:`simulate_pipeline`). Times are microseconds."""

    __slots__ = ("_arrays", "stages", "chunks", "microbatches")

    def __init__(self, arrays: dict[str, Any], stages: int, chunks: int, microbatches: int):
        self._arrays = arrays
        self.stages = stages
        self.chunks = chunks
        self.microbatches = microbatches

    @property
    def step_time(self) -> float:
        """From 0 to the end of the DP reduce-scatter."""
        return float(self._arrays["step_time"])

    @property
    def ops(self) -> list[Op]:
        a = self._arrays
        """Every action in each rank's table order."""
        return [Op(r, c, KINDS[k], mb, s, e, g) for r, c, k, mb, s, e, g in zip(
            a["op_rank"].tolist(), a["op_chunk"].tolist(), a["op_kind"].tolist(), a["op_microbatch"].tolist(),
            a["op_start"].tolist(), a["op_end"].tolist(), a["op_stage"].tolist())]

    @property
    def bubbles(self) -> list[Bubble]:
        a = self._arrays
        """Every compute-idle interval, sorted by start within each stage."""
        return [Bubble(r, s, e, BUBBLE_KINDS[k]) for r, s, e, k in zip(
            a["bubble_rank"].tolist(), a["bubble_start"].tolist(), a["bubble_end"].tolist(),
            a["bubble_kind"].tolist())]

    @property
    def forward_needed(self) -> np.ndarray:
        """F_k: when stage 0 starts the forward of its first chunk for microbatch k."""
        return self._arrays["forward_needed"].copy()

    @property
    def grad_ready(self) -> np.ndarray:
        """B_k: when stage 0 ends the backward (B or I) of its first chunk for microbatch k."""
        return self._arrays["grad_ready"].copy()

    def bubble_time(self) -> dict[int, dict[str, float]]:
        """Bubble time per stage (rank) and kind."""
        a = self._arrays
        out = {r: dict.fromkeys(BUBBLE_KINDS, 0.0) for r in range(self.stages)}
        for r, s, e, k in zip(a["bubble_rank"], a["bubble_start"], a["bubble_end"], a["bubble_kind"]):
            out[int(r)][BUBBLE_KINDS[k]] += float(e - s)
        return out

    def bubble_fraction(self) -> dict[int, dict[str, float]]:
        """Bubble time per stage and kind as a fraction of the step time."""
        return {r: {k: t / self.step_time for k, t in kinds.items()} for r, kinds in self.bubble_time().items()}

    def save_trace(self, path: str | os.PathLike[str], problem: Problem | None = None,
                   schedule: Any = None) -> None:
        """Writes a Chrome trace (JSON) that opens in the Perfetto UI; with an encoder problem on
        this step and its schedule, their kernels too (see pybubble.trace)."""
        from .trace import write_trace
        write_trace(self, path, problem, schedule)

    def _free(self, key: str, stage: int) -> list[tuple[float, float]]:
        a = self._arrays
        lo, hi = a[f"{key}_offset"][stage], a[f"{key}_offset"][stage + 1]
        return list(zip(a[f"{key}_start"][lo:hi].tolist(), a[f"{key}_end"][lo:hi].tolist()))

    def compute_free(self, stage: int) -> list[tuple[float, float]]:
        """Windows where stage ``stage`` leaves compute idle: its bubbles, merged, zero-length ones
        dropped (computed by the core, as for its generated problems)."""
        return self._free("compute_free", stage)

    def link_free(self, stage: int) -> list[tuple[float, float]]:
        """Windows where stage ``stage`` leaves the network idle: all but TP and DP collectives."""
        return self._free("link_free", stage)

    def lane_windows(self, lanes_per_stage: int = 1) -> dict[str, np.ndarray]:
        """The free-window arrays of a problem on this step (compute_offset/start/end and
        link_offset/start/end): every lane of a stage sees the stage's compute_free and link_free."""
        if isinstance(lanes_per_stage, bool) or not isinstance(lanes_per_stage, int) or lanes_per_stage < 1:
            raise ValueError(f"lanes_per_stage: {lanes_per_stage!r} is not an integer >= 1")
        out = {}
        a = self._arrays
        for key in ("compute", "link"):
            offset = a[f"{key}_free_offset"]
            counts = np.repeat(np.diff(offset), lanes_per_stage)
            out[f"{key}_offset"] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            # every stage's windows, once per lane of the stage
            index = np.concatenate([np.tile(np.arange(offset[s], offset[s + 1]), lanes_per_stage)
                                    for s in range(self.stages)] or [np.zeros(0, np.int64)])
            out[f"{key}_start"] = a[f"{key}_free_start"][index]
            out[f"{key}_end"] = a[f"{key}_free_end"][index]
        return out

    def to_problem(self, tasks: Sequence[Mapping[str, Any]] | Mapping[str, np.ndarray],
                   lanes_per_stage: int = 1, windows: Mapping[str, np.ndarray] | None = None,
                   lane_names: Sequence[str] | None = None) -> Problem:
        """A pybubble.problem/1 with this step as the LLM frame and ``tasks`` as the encoder work.

        ``tasks`` is a list of dicts in problem/1 task form without "id" (its index is its id; an
        "id", if given, must equal it): "lane" (stage * lanes_per_stage + k), "duration", "resource"
        ("compute" or "comm"), "phase" ("fwd" or "bwd"), "microbatch" and "after"; or the same as
        arrays (the keys of :func:`pybubble.problem.task_arrays`, as ``EncoderWork.arrays`` gives).
        Every lane of a stage sees the stage's compute_free and link_free windows (``windows``:
        :meth:`lane_windows` computed once, for many problems); microbatch k carries (F_k, B_k).
        With ``lane_names``, ``windows`` holds one row per named lane, which need not be this
        step's stages (e.g. an encoder on GPUs of its own, free the whole step).
        Checked field by field here and by the core; ValueError naming the field and value.
        """
        if windows is None:
            windows = self.lane_windows(lanes_per_stage)
        if isinstance(tasks, Mapping):
            keys = ("lane", "microbatch", "duration", "resource", "phase", "after_offset", "after")
            missing = [k for k in keys if k not in tasks]
            if missing:
                raise ValueError(f"tasks: task arrays lack {', '.join(missing)}")
            arrays = {k: np.ascontiguousarray(tasks[k], np.float64 if k == "duration" else np.int64) for k in keys}
        elif isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
            raise ValueError(f"tasks: expected a list of task dicts, got {type(tasks).__name__}")
        else:
            arrays = task_arrays(tasks, id_required=False)
        num_lanes = len(windows["compute_offset"]) - 1
        names = (list(lane_names) if lane_names is not None else
                 [f"pp{s}.lane{k}" for s in range(self.stages) for k in range(lanes_per_stage)])
        if num_lanes != len(names):
            raise ValueError(f"windows: {num_lanes} lanes, expected {len(names)}")
        return Problem.from_arrays(
            lane_names=names, horizon=self.step_time, num_lanes=num_lanes, **windows,
            forward_needed=self.forward_needed, grad_ready=self.grad_ready, **arrays)

    def __repr__(self) -> str:
        return (f"Timeline(step_time={self.step_time}, stages={self.stages}, chunks={self.chunks}, "
                f"microbatches={self.microbatches})")


def _costs(value: Costs, field: str, stages: int, chunks: int) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: {value!r} is not a number or an array of numbers") from None
    if arr.ndim == 0:
        arr = np.full((stages, chunks), float(arr))
    elif arr.ndim == 1 and chunks == 1 and arr.shape[0] == stages:
        arr = arr.reshape(stages, 1)
    if arr.shape != (stages, chunks):
        raise ValueError(f"{field}: shape {arr.shape} is not a scalar or (stages, chunks) = ({stages}, {chunks})")
    return arr.reshape(-1)


def simulate_pipeline(schedule: str | TableLike | os.PathLike[str] = "1f1b", stages: int = 4,
                      microbatches: int = 8, chunks: int = 1, fwd: Costs = 1.0, bwd: Costs = 2.0,
                      wgrad: Costs | None = None, p2p: float = 0.0,
                      tp_comm: tuple[int, float] | None = None, dp_allgather: float = 0.0,
                      dp_reducescatter: float = 0.0,
                      warmup: int | Sequence[int] | None = None) -> Timeline:
    """Simulates one LLM step under pipeline, tensor and data parallelism.

    ``schedule``: a name (gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv), a table ``{rank: [action or
    None]}`` or the path of a CSV table. ``fwd``, ``bwd``: one action's time (one microbatch through
    one chunk of one stage), a scalar or per (stage, chunk); ``bwd`` is a full backward B.
    ``wgrad``: the weight-gradient part W of ``bwd`` (I takes ``bwd - wgrad``); default ``bwd / 2``.
    ``p2p``: latency of each cross-stage dependency. ``tp_comm``: ``(count, duration)`` of the TP
    collectives inside each F, B and I (compute idle, link busy). ``dp_allgather``,
    ``dp_reducescatter``: exposed DP collectives at the step's start and end. ``warmup``: warm-up
    forwards of interleaved_1f1b, one count or one per stage.
    """
    named = isinstance(schedule, str) and schedule in NAMES
    if named:
        table = build_table(schedule, stages, microbatches, chunks, warmup)
        if schedule == "zbv":
            chunks = 2
    else:
        if warmup is not None:
            raise ValueError(f"warmup: {warmup!r} applies only to a named interleaved_1f1b schedule")
        if isinstance(schedule, (str, os.PathLike)):
            if not os.path.isfile(schedule):
                raise ValueError(f"schedule: {str(schedule)!r} is neither one of {', '.join(NAMES)} nor a CSV file")
            schedule = load_csv(schedule)
        table = check_table(schedule)
    offset, stage, kind, mb = flatten(table)
    if not named:
        stages = len(table)
        if len(stage) == 0:
            raise ValueError("schedule: the table has no actions")
        top = int(stage.max()) + 1
        if top % stages:
            raise ValueError(f"schedule: {top} stages do not split evenly over {stages} ranks")
        chunks = top // stages
        microbatches = int(mb.max()) + 1
    f = _costs(fwd, "fwd", stages, chunks)
    b = _costs(bwd, "bwd", stages, chunks)
    w = b / 2 if wgrad is None else _costs(wgrad, "wgrad", stages, chunks)
    count, duration = 0, 0.0
    if tp_comm is not None:
        if not isinstance(tp_comm, Sequence) or len(tp_comm) != 2:
            raise ValueError(f"tp_comm: {tp_comm!r} is not a (count, duration) pair")
        count, duration = tp_comm
        if isinstance(count, bool) or not isinstance(count, int):
            raise ValueError(f"tp_comm.count: {count!r} is not an integer")
    for name, value in (("p2p", p2p), ("dp_allgather", dp_allgather), ("dp_reducescatter", dp_reducescatter),
                        ("tp_comm.duration", duration)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{name}: {value!r} is not a finite number")
    arrays = _core.simulate_pipeline(
        ranks=stages, chunks=chunks, microbatches=microbatches,
        row_offset=offset, stage=stage, kind=kind, microbatch=mb, fwd=f, bwd=b, wgrad=w,
        p2p=float(p2p), tp_count=count, tp_duration=float(duration), dp_allgather=float(dp_allgather),
        dp_reducescatter=float(dp_reducescatter))
    return Timeline(arrays, stages, chunks, microbatches)
