"""Costs measured in the running steps: what each rank saw in one step, shared, and the robust
running figures the next plan is made from."""

from __future__ import annotations

import statistics
import warnings
from collections import deque
from collections.abc import Sequence

import numpy as np

from .placement import MeasuredCosts

FIELDS = ("lead", "sync", "outside", "plan", "tp_count", "tp_gap", "tp_wait")
"""One rank's figures of one step, seconds (NaN: not seen): the schedule's own time before its
first op, the encoder's gradient sync (the shortest over the ranks is taken: the others include
waiting for the last rank), the trainer's time between two steps (optimizer, data), the runtime's
planning, the TP collectives waited on per LLM op, their median and their mean gap (NaN without
tensor parallelism); then, per pipeline stage (NaN for the stages of other ranks), the median own
time of its forwards, of its full backwards (B, or I + W), of its weight-gradient backwards W;
then each piece's forward and backward duration (mean over the microbatches the rank ran)."""


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


def step_sample(*, stage_fwd: Sequence[float], stage_bwd: Sequence[float], stage_wgrad: Sequence[float],
                lead: float, sync: float, outside: float, plan: float, piece_fwd: Sequence[float],
                piece_bwd: Sequence[float], tp_count: float = float("nan"), tp_gap: float = float("nan"),
                tp_wait: float = float("nan")) -> np.ndarray:
    """One rank's figures of one step as a flat float64 vector (see :data:`FIELDS`)."""
    return np.array([lead, sync, outside, plan, tp_count, tp_gap, tp_wait, *stage_fwd, *stage_bwd, *stage_wgrad,
                     *piece_fwd, *piece_bwd], dtype=np.float64)


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
        self._steps: deque[np.ndarray] = deque(maxlen=keep)

    @property
    def width(self) -> int:
        """Figures per rank in one step's samples (the fields, then each stage's forward, backward
        and weight gradient, then each piece's forward and backward)."""
        return len(FIELDS) + 3 * self.initial.stages + 2 * self.pieces

    def add(self, samples: np.ndarray) -> None:
        """``samples``: one row per rank (:func:`step_sample`)."""
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

        c, n, k, S = self.initial, self.pieces, len(FIELDS), self.initial.stages
        with warnings.catch_warnings():  # all-NaN columns (not measured) give NaN: kept from before
            warnings.simplefilter("ignore", RuntimeWarning)
            stage = np.nanmax(h[:, :, k:k + 3 * S], axis=1)  # steps x stage figures: the rank that ran them
            piece = np.nanmean(h[:, :, k + 3 * S:], axis=1)  # steps x pieces: mean over the ranks that ran them
            other = h[:, :, 0] + np.nan_to_num(h[:, :, 2]) + h[:, :, 3]  # lead + outside + plan, per rank
            worst = np.nanmax(other, axis=1) if np.isfinite(other).any() else np.full(len(h), np.nan)
            # The gradient sum as the last rank to reach it saw it: the others also waited for that
            # rank, which the plan's step already counts.
            sync = np.nanmin(h[:, :, 1], axis=1) if np.isfinite(h[:, :, 1]).any() else np.full(len(h), np.nan)
        bwd = [median(stage[:, S + s], c.stage_bwd_s[s]) for s in range(S)]
        initial_w = c.stage_wgrad_s or [b / 2 for b in c.stage_bwd_s]
        wgrad = [min(median(stage[:, 2 * S + s], initial_w[s]), bwd[s]) for s in range(S)]
        return MeasuredCosts(
            stage_fwd_s=[median(stage[:, s], c.stage_fwd_s[s]) for s in range(S)], stage_bwd_s=bwd,
            stage_wgrad_s=wgrad, p2p_s=c.p2p_s,
            piece_fwd_s=[median(piece[:, i], c.piece_fwd_s[i]) for i in range(n)],
            piece_bwd_s=[median(piece[:, n + i], c.piece_bwd_s[i]) for i in range(n)],
            optimizer_s=median(worst, c.optimizer_s), grad_sync_s=median(sync, c.grad_sync_s),
            tp_count=int(round(median(h[:, :, 4], c.tp_count))), tp_gap_s=median(h[:, :, 5], c.tp_gap_s),
            tp_wait_s=median(h[:, :, 6], c.tp_wait_s))
