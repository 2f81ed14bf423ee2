"""The cost of one native-resolution image in the encoder, per image rather than per tile: its
attention grows with the square of its patches ``p`` (block-diagonal attention, one block per
image), the rest of its layers with ``p``, so ``a*p^2 + b*p + c`` seconds (:class:`ImageCost`),
fitted from measured images (:meth:`ImageCost.fit`, a least-squares fit with coefficients >= 0, as
LoongForge fits its ViT balance from warm-up steps).

Groundwork of native-resolution encoders; torch-free.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageCost:
    """Seconds of one image's encoder work as a function of its patches: ``a*p^2 + b*p + c``."""

    a: float
    """Seconds per patch squared (attention within the image)."""
    b: float
    """Seconds per patch (the projections, MLPs and norms)."""
    c: float
    """Seconds per image (launches, the merger's and the step's per-image work)."""

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ValueError(f"{name}: {v!r} is not a finite number >= 0")

    def __call__(self, patches: float | Sequence[float] | np.ndarray) -> float | np.ndarray:
        """Seconds of images of ``patches`` patches each."""
        p = np.asarray(patches, np.float64)
        out = (self.a * p + self.b) * p + self.c
        return float(out) if out.ndim == 0 else out

    @classmethod
    def fit(cls, patches: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray) -> ImageCost:
        """The coefficients >= 0 that fit ``seconds`` (each image's measured time) best in least
        squares, given each image's ``patches``: the exact non-negative least squares of three
        unknowns (each set of coefficients left free, the others held at 0; the best feasible
        one). ValueError for inputs of other lengths, none, or values not finite and >= 0 (patches
        > 0)."""
        p, t = np.asarray(patches, np.float64), np.asarray(seconds, np.float64)
        if p.ndim != 1 or p.shape != t.shape or p.size == 0:
            raise ValueError(f"patches, seconds: {p.shape} and {t.shape}, not two 1-D arrays of one length >= 1")
        if not (np.isfinite(p).all() and np.isfinite(t).all()) or (p <= 0).any() or (t < 0).any():
            raise ValueError("patches, seconds: every patch count must be a finite number > 0 and every time a "
                             "finite number >= 0")
        scale = float(p.max())
        x = p / scale  # columns of one size: p^2 and p of thousands of patches would swamp the constant
        design = np.stack([x * x, x, np.ones_like(x)], axis=1)
        best, best_residual = np.zeros(3), float(np.sum(t * t))
        for free in itertools.chain.from_iterable(itertools.combinations(range(3), k) for k in (1, 2, 3)):
            cols = list(free)
            coef, *_ = np.linalg.lstsq(design[:, cols], t, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(3)
            full[cols] = coef
            residual = float(np.sum((design @ full - t) ** 2))
            if residual < best_residual:
                best, best_residual = full, residual
        return cls(a=float(best[0] / scale ** 2), b=float(best[1] / scale), c=float(best[2]))


__all__ = ["ImageCost"]
