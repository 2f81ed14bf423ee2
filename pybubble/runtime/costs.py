"""Costs measured in the running steps: what each rank saw in one step, shared, and the robust
running figures the next plan is made from."""

from __future__ import annotations

import statistics
import warnings
from collections import deque
from collections.abc import Sequence

import numpy as np

from .placement import MeasuredCosts

FIELDS = ("fwd", "bwd", "lead", "sync", "outside", "plan", "tp_count", "tp_gap", "tp_wait")
"""One rank's figures of one step, seconds (NaN: not seen): the median of its LLM forward and
backward ops' own time, the schedule's own time before its first op, the encoder's gradient sync
(the shortest over the ranks is taken: the others include waiting for the last rank),
the trainer's time between two steps (optimizer, data), the runtime's planning, the TP
collectives waited on per LLM op, their median and their mean gap (NaN without tensor
parallelism); then each
piece's forward and backward duration (mean over the microbatches the rank ran)."""


def step_sample(*, fwd: Sequence[float], bwd: Sequence[float], lead: float, sync: float, outside: float,
                plan: float, piece_fwd: Sequence[float], piece_bwd: Sequence[float], tp_count: float = float("nan"),
                tp_gap: float = float("nan"), tp_wait: float = float("nan")) -> np.ndarray:
    """One rank's figures of one step as a flat float64 vector (see :data:`FIELDS`)."""
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    return np.array([med(fwd), med(bwd), lead, sync, outside, plan, tp_count, tp_gap, tp_wait, *piece_fwd, *piece_bwd],
                    dtype=np.float64)


class CostHistory:
    """The last ``keep`` steps' figures of every rank; :meth:`costs` gives their medians as
    :class:`MeasuredCosts` (p2p latency measured once, it does not change with the load)."""

    def __init__(self, initial: MeasuredCosts, keep: int = 5):
        if keep < 1:
            raise ValueError(f"keep: {keep} is not >= 1")
        self.initial = initial
        self.pieces = len(initial.piece_fwd_s)
        self._steps: deque[np.ndarray] = deque(maxlen=keep)

    @property
    def width(self) -> int:
        """Figures per rank in one step's samples (the fields, then each piece's forward and backward)."""
        return len(FIELDS) + 2 * self.pieces

    def add(self, samples: np.ndarray) -> None:
        """``samples``: one row per rank (:func:`step_sample`)."""
        samples = np.asarray(samples, dtype=np.float64)
        if samples.shape != (self.initial.stages, self.width):
            raise ValueError(f"samples: shape {samples.shape}, expected ({self.initial.stages}, {self.width})")
        self._steps.append(samples)

    def costs(self) -> MeasuredCosts:
        """The costs to plan the next step with: medians of the steps kept (the initial profile before any)."""
        if not self._steps:
            return self.initial
        h = np.stack(self._steps)  # steps x ranks x fields

        def median(values: np.ndarray, fallback: float) -> float:
            values = values[np.isfinite(values)]
            return float(np.median(values)) if values.size else fallback

        c, n, k = self.initial, self.pieces, len(FIELDS)
        with warnings.catch_warnings():  # all-NaN columns (not measured) give NaN: kept from before
            warnings.simplefilter("ignore", RuntimeWarning)
            piece = np.nanmean(h[:, :, k:], axis=1)  # steps x pieces: mean over the ranks that ran them
            other = h[:, :, 2] + np.nan_to_num(h[:, :, 4]) + h[:, :, 5]  # lead + outside + plan, per rank
            worst = np.nanmax(other, axis=1) if np.isfinite(other).any() else np.full(len(h), np.nan)
            # The gradient sum as the last rank to reach it saw it: the others also waited for that
            # rank, which the plan's step already counts.
            sync = np.nanmin(h[:, :, 3], axis=1) if np.isfinite(h[:, :, 3]).any() else np.full(len(h), np.nan)
        return MeasuredCosts(
            stage_fwd_s=[median(h[:, r, 0], c.stage_fwd_s[r]) for r in range(c.stages)],
            stage_bwd_s=[median(h[:, r, 1], c.stage_bwd_s[r]) for r in range(c.stages)],
            p2p_s=c.p2p_s,
            piece_fwd_s=[median(piece[:, i], c.piece_fwd_s[i]) for i in range(n)],
            piece_bwd_s=[median(piece[:, n + i], c.piece_bwd_s[i]) for i in range(n)],
            optimizer_s=median(worst, c.optimizer_s), grad_sync_s=median(sync, c.grad_sync_s),
            tp_count=int(round(median(h[:, :, 6], c.tp_count))), tp_gap_s=median(h[:, :, 7], c.tp_gap_s),
            tp_wait_s=median(h[:, :, 8], c.tp_wait_s))
