"""Costs measured in the running steps, as the plan takes them: :class:`MeasuredCosts` (seconds, one
microbatch each), what each rank saw in one step (:class:`StepSample`, shared between the ranks by
the runtime), and the robust running figures the next plan is made from (:class:`CostHistory`,
:class:`CollectiveHistory`). No torch: the runtime gathers the samples."""

from __future__ import annotations

import statistics
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config.checks import finite, integer


@dataclass(kw_only=True, slots=True)
class MeasuredCosts:
    """Seconds, one microbatch each."""

    stage_fwd_s: list[float]
    """Forward of each LLM pipeline stage (global stage index, as in the schedule's table)."""
    stage_bwd_s: list[float]
    """Full backward of each LLM pipeline stage (B, or I + W in a zero-bubble schedule)."""
    p2p_s: float
    """Latency of one pipeline send/receive (activation or gradient)."""
    piece_fwd_s: list[float]
    """Forward of each encoder piece (kernel-level task)."""
    piece_bwd_s: list[float]
    """Backward of each encoder piece."""
    optimizer_s: float = 0.0
    """What each step does outside the pipeline and the encoder: per rank (the largest) the
    optimizer step, the trainer's own work between steps and the runtime's own work before the
    step (its planning, the step's set-up); and the runtime's collectives before the step (the
    data's agreement, the moves between replicas, the costs' sharing, the barrier) as the last
    rank to reach them saw them."""
    grad_sync_s: float = 0.0
    """All-reduce of the encoder's gradients (modes that spread the encoder over ranks; with
    data-parallel replicas every mode, over them: :func:`lockstep_s`'s prediction adds it)."""
    stage_wgrad_s: list[float] | None = None
    """The weight-gradient part W of each stage's backward (zero-bubble schedules; I takes the
    rest); None: half of it."""
    tp_count: int = 0
    """Tensor-parallel collectives waited on inside each LLM forward and backward op (measured on
    the mesh: layers x collectives per layer)."""
    tp_gap_s: float = 0.0
    """A TP collective's typical gap, how long its consumer waits for it (measured, the median):
    the gaps the plan offers the pieces and the filler's room at a TP wait."""
    tp_wait_s: float = 0.0
    """The mean of those waits (the gaps are heavy-tailed on a loaded machine): count x mean is the
    ops' time in TP waits; 0: the typical gap."""

    @property
    def tp_op_wait_s(self) -> float:
        """The time each LLM forward and backward op waits on TP collectives: count x mean (the
        typical gap where no mean was measured)."""
        return self.tp_count * max(self.tp_gap_s, self.tp_wait_s)

    def __post_init__(self) -> None:
        if len(self.stage_fwd_s) != len(self.stage_bwd_s) or not self.stage_fwd_s:
            raise ValueError(f"stage_bwd_s: {len(self.stage_bwd_s)} stages, stage_fwd_s has {len(self.stage_fwd_s)}")
        if len(self.piece_fwd_s) != len(self.piece_bwd_s) or not self.piece_fwd_s:
            raise ValueError(f"piece_bwd_s: {len(self.piece_bwd_s)} pieces, piece_fwd_s has {len(self.piece_fwd_s)}")
        if self.stage_wgrad_s is not None and len(self.stage_wgrad_s) != len(self.stage_fwd_s):
            raise ValueError(f"stage_wgrad_s: {len(self.stage_wgrad_s)} stages, stage_fwd_s has {len(self.stage_fwd_s)}")
        for name in ("stage_fwd_s", "stage_bwd_s", "stage_wgrad_s", "piece_fwd_s", "piece_bwd_s"):
            for i, v in enumerate(getattr(self, name) or ()):
                finite(v, f"{name}[{i}]", minimum=0.0)
        for name in ("p2p_s", "optimizer_s", "grad_sync_s", "tp_gap_s", "tp_wait_s"):
            finite(getattr(self, name), name, minimum=0.0)
        integer(self.tp_count, "tp_count", minimum=0)

    @property
    def stages(self) -> int:
        """Pipeline stages (of every rank)."""
        return len(self.stage_fwd_s)


FIELDS = ("lead", "sync", "outside", "plan", "tp_count", "tp_gap", "tp_wait", "agree")
"""One rank's figures of one step, seconds (NaN: not seen): the schedule's own time before its
first op, the encoder's gradient sync (the shortest over the ranks is taken: the others include
waiting for the last rank; NaN where the rank has none), the trainer's time between two steps
(optimizer, data), the runtime's own work before the step's (its planning, the step's set-up), the
TP collectives waited on per LLM op, their median and their mean gap (NaN without tensor
parallelism), the runtime's collectives before the step's work (agreeing on the data, moving work
between replicas, sharing these figures, the start's barrier; the shortest over the ranks is
taken, as for the gradient sync; this and the own work before the step are NaN in the profiling
step, whose first collectives wait for every process to start); then, per pipeline stage (NaN
for the stages of other ranks), the median own time of its forwards, of its full backwards (B, or
I + W), of its weight-gradient backwards W; then each piece's forward and backward duration (mean
over the microbatches the rank ran)."""

def stage_figures(ops: Sequence[tuple[str, int]], stages: Sequence[int], busy: Sequence[float],
                  count: int) -> tuple[list[float], list[float], list[float]]:
    """Per stage (of ``count``): the median own time of the forwards, of the full backwards (B,
    or the medians of I and W summed) and of the weight-gradient backwards W of one rank's ops
    (``ops``: (kind, microbatch), ``stages``: each op's stage, ``busy``: each op's own time); NaN
    where the rank ran none."""
    nan = float("nan")
    fwd, bwd, wgrad = [nan] * count, [nan] * count, [nan] * count
    by: dict[tuple[int, str], list[float]] = {}
    for (kind, _), stage, b in zip(ops, stages, busy):
        by.setdefault((stage, kind), []).append(b)
    med = statistics.median
    for stage in set(stages):
        if (stage, "F") in by:
            fwd[stage] = med(by[stage, "F"])
        if (stage, "W") in by:
            wgrad[stage] = med(by[stage, "W"])
        if (stage, "B") in by:
            bwd[stage] = med(by[stage, "B"])
        elif (stage, "I") in by and (stage, "W") in by:
            bwd[stage] = med(by[stage, "I"]) + wgrad[stage]
    return fwd, bwd, wgrad

@dataclass(kw_only=True, slots=True)
class StepSample:
    """One rank's figures of one step, seconds (NaN: not seen; see :data:`FIELDS`)."""

    lead: float
    """The schedule's own time before its first op."""
    sync: float
    """The encoder's gradient sum."""
    outside: float
    """The trainer's time between the last step and this one (optimizer, data)."""
    plan: float
    """The runtime's own work before the step's (its planning, the step's set-up)."""
    stage_fwd: Sequence[float]
    """Per pipeline stage: the median own time of its forwards (NaN: another rank's stage)."""
    stage_bwd: Sequence[float]
    """Per stage: of its full backwards (B, or I + W)."""
    stage_wgrad: Sequence[float]
    """Per stage: of its weight-gradient backwards W."""
    piece_fwd: Sequence[float]
    """Per piece: its forward's duration (the mean over the microbatches the rank ran)."""
    piece_bwd: Sequence[float]
    """Per piece: its backward's."""
    tp_count: float = float("nan")
    """TP collectives waited on per LLM op (NaN without tensor parallelism)."""
    tp_gap: float = float("nan")
    """Their median gap."""
    tp_wait: float = float("nan")
    """Their mean gap."""
    agree: float = float("nan")
    """The runtime's collectives before the step's work (agreeing on the data, the moves between
    replicas, sharing these figures, the start's barrier)."""

    def vector(self) -> np.ndarray:
        """The figures as one flat float64 vector, laid out as :class:`SampleLayout` says (what the
        ranks all-gather)."""
        return np.array([*(getattr(self, f) for f in FIELDS), *self.stage_fwd, *self.stage_bwd, *self.stage_wgrad,
                         *self.piece_fwd, *self.piece_bwd], dtype=np.float64)

class SampleLayout:
    """Where each figure lies in a :meth:`StepSample.vector` of ``stages`` stages and ``pieces``
    pieces: :data:`FIELDS`, then per stage the forwards, the backwards, the weight gradients, then
    per piece the forwards and the backwards."""

    def __init__(self, stages: int, pieces: int):
        self.stages, self.pieces = stages, pieces
        k, s = len(FIELDS), stages
        self._slices = {"stage_fwd": slice(k, k + s), "stage_bwd": slice(k + s, k + 2 * s),
                        "stage_wgrad": slice(k + 2 * s, k + 3 * s), "stages": slice(k, k + 3 * s),
                        "piece_fwd": slice(k + 3 * s, k + 3 * s + pieces),
                        "piece_bwd": slice(k + 3 * s + pieces, k + 3 * s + 2 * pieces),
                        "pieces": slice(k + 3 * s, k + 3 * s + 2 * pieces)}
        self.width = k + 3 * s + 2 * pieces
        """Figures per sample."""

    def __getitem__(self, name: str) -> int | slice:
        """The index of a field of :data:`FIELDS`, or the slice of ``stage_fwd``, ``stage_bwd``,
        ``stage_wgrad``, ``stages`` (all three), ``piece_fwd``, ``piece_bwd`` or ``pieces`` (both)."""
        return FIELDS.index(name) if name in FIELDS else self._slices[name]

class CostHistory:
    """The last ``keep`` steps' figures of every rank; :meth:`costs` gives their medians as
    :class:`MeasuredCosts` (p2p latency measured once, it does not change with the load).
    ``ranks``: the ranks whose samples come in (default: one per stage)."""

    def __init__(self, initial: MeasuredCosts, keep: int = 5, ranks: int | None = None):
        if keep < 1:
            raise ValueError(f"keep: {keep} is not >= 1")
        self.initial = initial
        self.ranks = initial.stages if ranks is None else ranks
        self.pieces = len(initial.piece_fwd_s)
        self.layout = SampleLayout(initial.stages, self.pieces)
        """Where each figure lies in a rank's sample."""
        self._steps: deque[np.ndarray] = deque(maxlen=keep)

    @property
    def width(self) -> int:
        """Figures per rank in one step's samples."""
        return self.layout.width

    def add(self, samples: np.ndarray) -> None:
        """``samples``: one row per rank (:meth:`StepSample.vector`)."""
        samples = np.asarray(samples, dtype=np.float64)
        if samples.shape != (self.ranks, self.width):
            raise ValueError(f"samples: shape {samples.shape}, expected ({self.ranks}, {self.width})")
        self._steps.append(samples)

    def costs(self) -> MeasuredCosts:
        """The costs to plan the next step with: medians of the steps kept (the initial profile before any)."""
        if not self._steps:
            return self.initial
        h = np.stack(self._steps)  # steps x ranks x fields

        def median(values: np.ndarray, fallback: float) -> float:
            values = values[np.isfinite(values)]
            return float(np.median(values)) if values.size else fallback

        c, n, S, at = self.initial, self.pieces, self.initial.stages, self.layout
        with warnings.catch_warnings():  # all-NaN columns (not measured) give NaN: kept from before
            warnings.simplefilter("ignore", RuntimeWarning)
            stage = np.nanmax(h[:, :, at["stages"]], axis=1)  # steps x stage figures: the rank that ran them
            piece = np.nanmean(h[:, :, at["pieces"]], axis=1)  # steps x pieces: mean over the ranks that ran them
            other = h[:, :, at["lead"]] + np.nan_to_num(h[:, :, at["outside"]]) + h[:, :, at["plan"]]  # per rank
            worst = np.nanmax(other, axis=1) if np.isfinite(other).any() else np.full(len(h), np.nan)
            # The gradient sum as the last rank to reach it saw it: the others also waited for that
            # rank, which the plan's step already counts.
            sync_col = h[:, :, at["sync"]]
            sync = np.nanmin(sync_col, axis=1) if np.isfinite(sync_col).any() else np.full(len(h), np.nan)
            agree = np.nanmin(h[:, :, at["agree"]], axis=1)  # likewise the collectives before the step's work
        bwd = [median(stage[:, S + s], c.stage_bwd_s[s]) for s in range(S)]
        initial_w = c.stage_wgrad_s or [b / 2 for b in c.stage_bwd_s]
        wgrad = [min(median(stage[:, 2 * S + s], initial_w[s]), bwd[s]) for s in range(S)]
        return MeasuredCosts(
            stage_fwd_s=[median(stage[:, s], c.stage_fwd_s[s]) for s in range(S)], stage_bwd_s=bwd,
            stage_wgrad_s=wgrad, p2p_s=c.p2p_s,
            piece_fwd_s=[median(piece[:, i], c.piece_fwd_s[i]) for i in range(n)],
            piece_bwd_s=[median(piece[:, n + i], c.piece_bwd_s[i]) for i in range(n)],
            optimizer_s=median(worst + np.nan_to_num(agree), c.optimizer_s), grad_sync_s=median(sync, c.grad_sync_s),
            tp_count=int(round(median(h[:, :, at["tp_count"]], c.tp_count))),
            tp_gap_s=median(h[:, :, at["tp_gap"]], c.tp_gap_s), tp_wait_s=median(h[:, :, at["tp_wait"]], c.tp_wait_s))

class CollectiveHistory:
    """The data-parallel collectives' time where the replicas of each pipeline rank meet (per op of
    the rank, then after its last op: what
    :meth:`~pybubble.runtime.waits.DataParallelWaits.collectives_s` gives), over the last ``keep``
    steps, beyond the waits for each other that the plan predicted
    (:func:`~pybubble.placement.marks.lockstep_waits_s`, told by :meth:`expect` before the step):
    a collective completes on every replica at once, so what a replica waited beyond its predicted
    wait is the collective's own time and the other replicas' lateness the plan did not foresee
    (their ops and tasks run longer or shorter than their medians). Per step the mean over the
    replicas is taken (the replicas' expected wait for the last of them), then the lower median
    over the steps kept (of two steps the smaller: one disturbed step, a replica much later than
    its plan, does not move it)."""

    def __init__(self, keep: int = 5):
        if keep < 1:
            raise ValueError(f"keep: {keep} is not >= 1")
        self.keep = keep
        self._steps: dict[int, deque[np.ndarray]] = {}
        self._places: dict[int, np.ndarray] = {}
        self._expected: dict[int, np.ndarray] = {}

    def expect(self, position: int, waits: np.ndarray) -> None:
        """The waits the plan of the step about to run predicts for the replicas of pipeline rank
        ``position`` (one row per replica, one column per place; NaN where they do not meet)."""
        self._expected[position] = np.asarray(waits, dtype=np.float64)

    def add(self, position: int, waits: np.ndarray) -> None:
        """The last step's waits of the replicas of pipeline rank ``position``: one row per
        replica, one column per op and one after the last (NaN: no collective there). Where the
        step's plan predicted no wait there (:meth:`expect` not told, or no meeting planned), the
        places count and the time does not."""
        waits = np.asarray(waits, dtype=np.float64)
        if waits.ndim != 2 or waits.shape[0] < 1:
            raise ValueError(f"waits: shape {waits.shape} is not one row per replica")
        places = self._places.get(position)
        if places is not None and len(places) != waits.shape[1]:
            raise ValueError(f"waits: {waits.shape[1]} columns for pipeline rank {position}, the last step had "
                             f"{len(places)}")
        self._places[position] = np.isfinite(waits).any(axis=0)
        expected = self._expected.pop(position, None)
        if expected is None or expected.shape != waits.shape or not np.isfinite(waits - expected).any():
            return
        with warnings.catch_warnings():  # all-NaN columns: nothing to take there
            warnings.simplefilter("ignore", RuntimeWarning)
            beyond = np.maximum(np.nanmean(waits - expected, axis=0), 0.0)
        self._steps.setdefault(position, deque(maxlen=self.keep)).append(beyond)

    def meets_s(self, position: int, ops: int) -> list[float]:
        """Where the replicas of pipeline rank ``position`` (``ops`` ops) meet, as the last step
        saw: per op, then after the last, the collectives' time there beyond the predicted waits
        (the lower median over the steps kept; 0 where none was measured yet), NaN where the last
        step had no collective (everywhere before a step was added)."""
        places = self._places.get(position)
        if places is None:
            return [float("nan")] * (ops + 1)
        if len(places) != ops + 1:
            raise ValueError(f"ops: {ops} for pipeline rank {position}, its collectives were seen at {len(places)} "
                             "places")
        kept = self._steps.get(position)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            median = np.nanpercentile(np.stack(kept), 50, axis=0, method="lower") if kept else np.zeros(len(places))
        return [(float(m) if np.isfinite(m) else 0.0) if seen else float("nan") for seen, m in zip(places, median)]
