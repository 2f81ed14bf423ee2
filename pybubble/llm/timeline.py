"""The LLM's 3D-parallel step simulated from an action table: ops, bubbles with their kinds, and
the encoder's dependency points (forward_needed F_k, grad_ready B_k). The simulation runs in the
C++ core; this module prepares its arrays and reads the free windows it leaves (the lanes of a
bubble-filling problem, :mod:`pybubble.problem`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

import numpy as np

from .. import _core
from ..config.checks import finite, integer, shown
from .tables import ACTION_KINDS, NAMES, TableLike, build_table, check_table, flatten, load_csv

BUBBLE_KINDS = ("dp_allgather", "pp_warmup", "pp_steady", "pp_cooldown", "tp", "dp_reducescatter")
"""Kinds of bubbles, in the core's order (see docs/pipeline.md)."""
Costs = Union[float, Sequence[float], Sequence[Sequence[float]], np.ndarray]
"""One action's time: a scalar, or one per (rank, chunk)."""


class Op(NamedTuple):
    """One LLM action as it ran: on pipeline rank ``rank``, model chunk ``chunk``."""

    rank: int
    """Pipeline rank that runs the action."""
    chunk: int
    """Position of the action's stage among the rank's stages (0 .. chunks - 1)."""
    stage: int
    """The table's (global) stage of the action, as in "3F1"."""
    kind: str
    """"F", "B", "I" or "W"."""
    microbatch: int
    """LLM microbatch."""
    start: float
    """Start (us)."""
    end: float
    """End (us)."""


class Bubble(NamedTuple):
    """One compute-idle interval of pipeline rank ``rank``."""

    rank: int
    """Pipeline rank that idles."""
    start: float
    """Start (us)."""
    end: float
    """End (us)."""
    kind: str
    """One of :data:`BUBBLE_KINDS`."""


@dataclass(kw_only=True, slots=True, eq=False)
class Windows:
    """Free windows of one resource on each of several lanes (or ranks), in CSR layout: lane l's
    windows are ``start[offset[l]:offset[l + 1]]`` to ``end[...]``, sorted and disjoint (us). The
    form the core takes them in (a problem's ``compute_free`` and ``link_free``)."""

    offset: np.ndarray
    """int64, one more than the lanes: where each lane's windows begin."""
    start: np.ndarray
    """float64: start of each window."""
    end: np.ndarray
    """float64: end of each window."""

    @property
    def lanes(self) -> int:
        """Number of lanes."""
        return len(self.offset) - 1

    def of(self, lane: int) -> list[tuple[float, float]]:
        """Lane `lane`'s windows as (start, end) pairs."""
        lo, hi = int(self.offset[lane]), int(self.offset[lane + 1])
        return list(zip(self.start[lo:hi].tolist(), self.end[lo:hi].tolist()))

    def free_before(self, times: np.ndarray) -> np.ndarray:
        """Free time of each lane in [0, t] for each t of `times` (us): lanes x len(times)."""
        t = np.asarray(times, dtype=np.float64)
        widths = np.concatenate([[0.0], np.cumsum(self.end - self.start)])
        out = np.zeros((self.lanes, len(t)))
        for lane in range(self.lanes):
            lo, hi = int(self.offset[lane]), int(self.offset[lane + 1])
            # the windows that end by t count whole, the one open at t in part
            done = lo + np.searchsorted(self.end[lo:hi], t, side="right")
            out[lane] = widths[done] - widths[lo]
            open_ = done < hi
            out[lane, open_] += np.clip(t[open_] - self.start[done[open_]], 0.0, None)
        return out

    def free_time(self) -> np.ndarray:
        """Free time per lane (us)."""
        widths = np.concatenate([[0.0], np.cumsum(self.end - self.start)])
        return widths[self.offset[1:]] - widths[self.offset[:-1]]

    def repeated(self, times: int) -> "Windows":
        """Each lane's windows `times` times in a row: the lanes of a rank, which all see the rank's
        windows."""
        times = integer(times, "lanes_per_stage", minimum=1)
        counts = np.repeat(np.diff(self.offset), times)
        index = np.concatenate([np.tile(np.arange(self.offset[r], self.offset[r + 1]), times)
                                for r in range(self.lanes)] or [np.zeros(0, np.int64)])
        return Windows(offset=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                       start=self.start[index], end=self.end[index])

    @classmethod
    def whole(cls, lanes: int, start: float, end: float) -> "Windows":
        """`lanes` lanes free from `start` to `end`."""
        return cls(offset=np.arange(lanes + 1, dtype=np.int64), start=np.full(lanes, float(start)),
                   end=np.full(lanes, float(end)))


class Timeline:
    """A simulated LLM step (see :func:`simulate_pipeline`). Times are microseconds."""

    __slots__ = ("_arrays", "ranks", "chunks", "microbatches")

    def __init__(self, arrays: dict[str, Any], ranks: int, chunks: int, microbatches: int):
        self._arrays = arrays
        self.ranks = ranks
        """Pipeline ranks."""
        self.chunks = chunks
        """Model chunks per rank."""
        self.microbatches = microbatches
        """LLM microbatches."""

    @property
    def step_time(self) -> float:
        """From 0 to the end of the DP reduce-scatter."""
        return float(self._arrays["step_time"])

    @property
    def ops(self) -> list[Op]:
        """Every action in each rank's table order."""
        a = self._arrays
        return [Op(r, c, g, ACTION_KINDS[k], mb, s, e) for r, c, g, k, mb, s, e in zip(
            a["op_rank"].tolist(), a["op_chunk"].tolist(), a["op_stage"].tolist(), a["op_kind"].tolist(),
            a["op_microbatch"].tolist(), a["op_start"].tolist(), a["op_end"].tolist())]

    @property
    def op_columns(self) -> dict[str, np.ndarray]:
        """Every action as :attr:`ops` gives them, by column (copies): ``rank``, ``chunk``,
        ``stage``, ``kind`` (the index of its letter in ``ACTION_KINDS``), ``microbatch``, ``start``
        and ``end``: for work over all of them at once."""
        a = self._arrays
        names = ("rank", "chunk", "stage", "kind", "microbatch", "start", "end")
        return {name: a[f"op_{name}"].copy() for name in names}

    @property
    def bubbles(self) -> list[Bubble]:
        """Every compute-idle interval, sorted by start within each rank."""
        a = self._arrays
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
        """Bubble time per rank and kind."""
        a = self._arrays
        out = {r: dict.fromkeys(BUBBLE_KINDS, 0.0) for r in range(self.ranks)}
        for r, s, e, k in zip(a["bubble_rank"], a["bubble_start"], a["bubble_end"], a["bubble_kind"]):
            out[int(r)][BUBBLE_KINDS[k]] += float(e - s)
        return out

    def bubble_fraction(self) -> dict[int, dict[str, float]]:
        """Bubble time per rank and kind as a fraction of the step time."""
        return {r: {k: t / self.step_time for k, t in kinds.items()} for r, kinds in self.bubble_time().items()}

    def _windows(self, key: str) -> Windows:
        a = self._arrays
        return Windows(offset=a[f"{key}_offset"], start=a[f"{key}_start"], end=a[f"{key}_end"])

    @property
    def compute_free(self) -> Windows:
        """Per rank, the windows where it leaves compute idle: its bubbles, merged, zero-length ones
        dropped (computed by the core, as for its generated problems)."""
        return self._windows("compute_free")

    @property
    def link_free(self) -> Windows:
        """Per rank, the windows where it leaves the network idle: all but TP and DP collectives."""
        return self._windows("link_free")

    @property
    def nvlink_free(self) -> Windows:
        """Per rank, the windows where it leaves the links inside its node idle: [0, step_time] less
        its TP collectives (the DP collectives and pipeline sends cross nodes, on the network)."""
        a = self._arrays
        tp = a["bubble_kind"] == BUBBLE_KINDS.index("tp")
        rank, start, end = a["bubble_rank"][tp], a["bubble_start"][tp], a["bubble_end"][tp]
        order = np.lexsort((start, rank))  # TP gaps sit inside ops: disjoint within a rank
        rank, start, end = rank[order], start[order], end[order]
        first = np.searchsorted(rank, np.arange(self.ranks))  # each rank's first gap
        last = np.searchsorted(rank, np.arange(self.ranks), side="right")
        # the free windows of rank r: [0, s0), [e0, s1), ..., [e_last, step_time)
        lo = np.insert(end, first, 0.0)
        hi = np.insert(start, last, self.step_time)
        owner = np.insert(rank, first, np.arange(self.ranks))
        keep = hi > lo
        counts = np.bincount(owner[keep], minlength=self.ranks)
        return Windows(offset=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                       start=lo[keep].astype(np.float64), end=hi[keep].astype(np.float64))

    def __repr__(self) -> str:
        return (f"Timeline(step_time={self.step_time}, ranks={self.ranks}, chunks={self.chunks}, "
                f"microbatches={self.microbatches})")


def _costs(value: Costs, field: str, ranks: int, chunks: int) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{field}: {shown(value)} is not a number or an array of numbers") from None
    if arr.ndim == 0:
        arr = np.full((ranks, chunks), float(arr))
    elif arr.ndim == 1 and chunks == 1 and arr.shape[0] == ranks:
        arr = arr.reshape(ranks, 1)
    if arr.shape != (ranks, chunks):
        raise ValueError(f"{field}: shape {arr.shape} is not a scalar or (ranks, chunks) = ({ranks}, {chunks})")
    return arr.reshape(-1)


def simulate_pipeline(schedule: str | TableLike | os.PathLike[str] = "1f1b", ranks: int = 4,
                      microbatches: int = 8, chunks: int = 1, fwd: Costs = 1.0, bwd: Costs = 2.0,
                      wgrad: Costs | None = None, p2p: float = 0.0,
                      tp_comm: tuple[int, float] | None = None, dp_allgather: float = 0.0,
                      dp_reducescatter: float = 0.0,
                      warmup: int | Sequence[int] | None = None) -> Timeline:
    """Simulates one LLM step under pipeline, tensor and data parallelism.

    ``schedule``: a name (gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv), a table ``{rank: [action or
    None]}`` or the path of a CSV table; ``ranks``: pipeline ranks (the PP degree; a named schedule's
    table is built for it, a given table has its own). ``fwd``, ``bwd``: one action's time (one
    microbatch through one chunk of one rank), a scalar or per (rank, chunk); ``bwd`` is a full
    backward B. ``wgrad``: the weight-gradient part W of ``bwd`` (I takes ``bwd - wgrad``); default
    ``bwd / 2``. ``p2p``: latency of each cross-rank dependency. ``tp_comm``: ``(count, duration)``
    of the TP collectives inside each F, B and I (compute idle, link busy). ``dp_allgather``,
    ``dp_reducescatter``: exposed DP collectives at the step's start and end. ``warmup``: warm-up
    forwards of interleaved_1f1b, one count or one per rank.
    """
    named = isinstance(schedule, str) and schedule in NAMES
    if named:
        table = build_table(schedule, ranks, microbatches, chunks, warmup)
        if schedule == "zbv":
            chunks = 2
    else:
        if warmup is not None:
            raise ValueError(f"warmup: {shown(warmup)} applies only to a named interleaved_1f1b schedule")
        if isinstance(schedule, (str, os.PathLike)):
            if not os.path.isfile(schedule):
                raise ValueError(f"schedule: {shown(str(schedule))} is neither one of {', '.join(NAMES)} "
                                 "nor a CSV file")
            schedule = load_csv(schedule)
        table = check_table(schedule)
    offset, stage, kind, mb = flatten(table)
    if not named:
        ranks = len(table)
        if len(stage) == 0:
            raise ValueError("schedule: the table has no actions")
        top = int(stage.max()) + 1
        if top % ranks:
            raise ValueError(f"schedule: {top} stages do not split evenly over {ranks} ranks")
        chunks = top // ranks
        microbatches = int(mb.max()) + 1
    f = _costs(fwd, "fwd", ranks, chunks)
    b = _costs(bwd, "bwd", ranks, chunks)
    w = b / 2 if wgrad is None else _costs(wgrad, "wgrad", ranks, chunks)
    count, duration = 0, 0.0
    if tp_comm is not None:
        if isinstance(tp_comm, (str, bytes)) or not isinstance(tp_comm, Sequence) or len(tp_comm) != 2:
            raise ValueError(f"tp_comm: {shown(tp_comm)} is not a (count, duration) pair")
        count = integer(tp_comm[0], "tp_comm.count", minimum=0)
        duration = finite(tp_comm[1], "tp_comm.duration")
    latencies = {name: finite(value, name) for name, value in
                 (("p2p", p2p), ("dp_allgather", dp_allgather), ("dp_reducescatter", dp_reducescatter))}
    arrays = _core.simulate_pipeline(
        ranks=ranks, chunks=chunks, microbatches=microbatches,
        row_offset=offset, stage=stage, kind=kind, microbatch=mb, fwd=f, bwd=b, wgrad=w,
        p2p=latencies["p2p"], tp_count=count, tp_duration=duration, dp_allgather=latencies["dp_allgather"],
        dp_reducescatter=latencies["dp_reducescatter"])
    return Timeline(arrays, ranks, chunks, microbatches)


__all__ = ["BUBBLE_KINDS", "Bubble", "Costs", "Op", "Timeline", "Windows", "simulate_pipeline"]
