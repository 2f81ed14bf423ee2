"""The relaxed 1F1B schedule of one pipeline stage (rules 1-4 of :mod:`pybubble.planner.modality`),
vectorised over many pipelines: the stage runs its own 1F1B action sequence against the rest of the
pipeline reduced to the dependencies it certainly imposes, each other stage an :class:`OtherStage`.
Its makespan is a lower bound of the real step; the modality model predicts the largest over the
stages (:func:`relaxed_schedules`), and its layer-split search bounds partial splits with a weaker
relaxation of the same (:func:`relaxed_stage` with the later stages as one block). Times are
microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class OtherStage:
    """Another stage as stage i's relaxed schedule sees it (arrays run over pipelines)."""

    between: np.ndarray
    """fwd + bwd of the stages strictly between the two, plus 2 latencies per hop."""
    fwd: np.ndarray
    """Its forward of one microbatch."""
    bwd: np.ndarray
    """Its backward of one microbatch."""
    warm: int
    """Its warm-up forwards: min(S - j - 1, M)."""


def relaxed_stage(fwd: np.ndarray, bwd: np.ndarray, fill: np.ndarray, drain: np.ndarray, warm: int,
                  microbatches: int, down: list[OtherStage], up: list[OtherStage]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One stage's 1F1B sequence against the relaxed rest of the pipeline (rules 1-4 of
    :mod:`pybubble.planner.modality`; `down` are the later stages, `up` the earlier ones). Each rule is a chain of actions that
    the real schedule runs in order, through one other stage j:

    - backward k waits for forward k0 <= x = min(k + w_j, M - 1) of this stage, then the stages
      between, then stage j's actions from its forward k0 through its backward k
      ((x - k0 + 1) forwards and k - max(0, k0 - w_j) + 1 backwards), then the stages between;
    - forward k waits for the fill plus stage j's k forwards and max(0, k - w_j) backwards before
      it, and for backward y <= k - w_j - 1 of this stage, then stage j's actions from its backward
      y through its forward k ((k - w_j - y) of each kind).

    Running maxima over k0 and y keep it linear in M. Returns the makespan (drain included), the
    fill-and-drain idle P and the steady-phase idle, each over pipelines."""
    stage = _RelaxedStage(fwd, bwd, fill, microbatches, down, up)
    for k in range(warm):
        stage.forward(k, False)
    for k in range(microbatches - warm):
        stage.forward(warm + k, warm + k > 0)
        stage.backward(k, k > 0)
    for k in range(microbatches - warm, microbatches):
        stage.backward(k, False)
    return stage.t + drain, stage.pipe + drain, stage.steady


class _RelaxedStage:
    """:func:`relaxed_stage`'s stage as its actions run: the time it has reached, its fill-and-drain
    and steady idle so far, the ends of its forwards and backwards, and per other stage the running
    maxima of the chains through it (arrays over pipelines)."""

    def __init__(self, fwd: np.ndarray, bwd: np.ndarray, fill: np.ndarray, microbatches: int,
                 down: list[OtherStage], up: list[OtherStage]):
        self.fwd, self.bwd, self.fill, self.m, self.down, self.up = fwd, bwd, fill, microbatches, down, up
        self.t = np.zeros_like(fwd)
        self.pipe = np.zeros_like(fwd)
        self.steady = np.zeros_like(fwd)
        self.fend: list[np.ndarray] = []
        self.bend: list[np.ndarray] = []
        self.neg = np.full_like(fwd, -np.inf)
        self.lo, self.hi, self.seen = [self.neg] * len(down), [self.neg] * len(down), [0] * len(down)
        self.back, self.seen_up = [self.neg] * len(up), [0] * len(up)

    def wait(self, ready: np.ndarray, in_steady: bool, duration: np.ndarray) -> np.ndarray:
        """Runs an action of `duration` once `ready`, the wait counted as steady or fill-and-drain idle."""
        start = np.maximum(self.t, ready)
        if in_steady:
            self.steady = self.steady + (start - self.t)
        else:
            self.pipe = self.pipe + (start - self.t)
        self.t = start + duration
        return self.t

    def forward(self, k: int, in_steady: bool) -> None:
        """Forward k, after the fill and the chains through each earlier stage (rule 3)."""
        ready = self.fill
        for n, o in enumerate(self.up):
            ready = np.maximum(ready, self.fill + k * o.fwd + max(0, k - o.warm) * o.bwd)
            while self.seen_up[n] <= k - o.warm - 1:
                y = self.seen_up[n]
                self.back[n] = np.maximum(self.back[n], self.bend[y] - y * (o.fwd + o.bwd))
                self.seen_up[n] += 1
            if self.seen_up[n]:
                ready = np.maximum(ready, self.back[n] + o.between + (k - o.warm) * (o.fwd + o.bwd))
        self.fend.append(self.wait(ready, in_steady, self.fwd))

    def backward(self, k: int, in_steady: bool) -> None:
        """Backward k, after the chains through each later stage (rule 2)."""
        ready = self.neg
        for n, o in enumerate(self.down):
            x = min(k + o.warm, self.m - 1)
            while self.seen[n] <= x:
                k0 = self.seen[n]
                if k0 < o.warm:
                    self.lo[n] = np.maximum(self.lo[n], self.fend[k0] - k0 * o.fwd)
                else:
                    self.hi[n] = np.maximum(self.hi[n], self.fend[k0] - k0 * (o.fwd + o.bwd))
                self.seen[n] += 1
            base = o.between + (x + 1) * o.fwd + (k + 1) * o.bwd
            ready = np.maximum(ready, np.maximum(self.lo[n] + base, self.hi[n] + base + o.warm * o.bwd))
        self.bend.append(self.wait(ready, in_steady, self.bwd))


def relaxed_schedules(fwd: np.ndarray, bwd: np.ndarray, microbatches: int, p2p: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fwd, bwd: (pipelines, stages). Per pipeline and stage: relaxed makespan, fill-and-drain idle
    and steady idle, each (pipelines, stages)."""
    n, s = fwd.shape
    zero = np.zeros((n, 1))
    cf = np.concatenate([zero, np.cumsum(fwd, axis=1)], axis=1)
    cb = np.concatenate([zero, np.cumsum(bwd, axis=1)], axis=1)
    ct = cf + cb
    m = microbatches
    out = np.empty((3, n, s))
    for i in range(s):
        down = [OtherStage(between=ct[:, j] - ct[:, i + 1] + 2 * (j - i) * p2p, fwd=fwd[:, j], bwd=bwd[:, j],
                       warm=min(s - j - 1, m)) for j in range(i + 1, s)]
        up = [OtherStage(between=ct[:, i] - ct[:, j + 1] + 2 * (i - j) * p2p, fwd=fwd[:, j], bwd=bwd[:, j],
                     warm=min(s - j - 1, m)) for j in range(i)]
        res = relaxed_stage(fwd[:, i], bwd[:, i], cf[:, i] + i * p2p, cb[:, i] + i * p2p, min(s - i - 1, m), m,
                       down, up)
        for r in range(3):
            out[r, :, i] = res[r]
    return out[0], out[1], out[2]


__all__ = ["OtherStage", "relaxed_schedules", "relaxed_stage"]
