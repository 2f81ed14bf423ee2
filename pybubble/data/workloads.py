"""Synthetic multimodal batches whose cost changes every step: images per sample, native
resolutions, video frames and text lengths from heavy-tailed distributions (:class:`WorkloadSpec`),
as encoder tokens per image (:func:`batches`). Seeded: no downloads."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..config.checks import finite, integer


@dataclass(kw_only=True, slots=True)
class WorkloadSpec:
    """How samples vary. Defaults resemble an interleaved image-text and video mix."""

    images_mean: float = 2.0
    """Mean images per image sample (geometric, at least one)."""
    tokens_per_image: int = 256
    """Encoder tokens of an image at the base resolution."""
    resolution_sigma: float = 0.5
    """Native resolution: tokens per image scale by a lognormal factor with this sigma (clipped to
    [1/4, 16] of the base), rounded to whole 16-token rows."""
    video_share: float = 0.1
    """Share of samples that are videos."""
    frames_alpha: float = 1.5
    """Video length: frames follow a Pareto law with this shape (heavy tail), from 4 frames."""
    max_frames: int = 64
    """Longest video, in frames."""
    text_tokens_mean: float = 1024.0
    """Mean LLM text tokens per sample (lognormal, sigma 0.5)."""

    def __post_init__(self) -> None:
        for name in ("images_mean", "text_tokens_mean"):
            finite(getattr(self, name), name, minimum=1.0)
        integer(self.tokens_per_image, "tokens_per_image", minimum=16)
        if not 0.0 <= finite(self.video_share, "video_share") <= 1.0:
            raise ValueError(f"video_share: {self.video_share!r} is not in [0, 1]")
        finite(self.resolution_sigma, "resolution_sigma", minimum=0.0)
        if not finite(self.frames_alpha, "frames_alpha") > 0.0:
            raise ValueError(f"frames_alpha: {self.frames_alpha!r} is not positive")
        integer(self.max_frames, "max_frames", minimum=4)


@dataclass(kw_only=True, slots=True)
class Batch:
    """One step's samples: per sample, the images (or frames) and their encoder tokens each, and
    the LLM tokens (text plus the encoder's output tokens)."""

    image_tokens: list[np.ndarray]
    """image_tokens[i]: encoder tokens of each image or frame of sample i."""
    llm_tokens: np.ndarray
    """LLM tokens of each sample."""

    @property
    def encoder_tokens(self) -> np.ndarray:
        """Encoder tokens per sample."""
        return np.array([int(t.sum()) for t in self.image_tokens], np.int64)


def batches(spec: WorkloadSpec, *, samples: int, steps: int, seed: int = 0) -> Iterator[Batch]:
    """`steps` batches of `samples` samples each, reproducible from `seed`."""
    integer(samples, "samples", minimum=1)
    integer(steps, "steps", minimum=0)
    rng = np.random.default_rng(integer(seed, "seed", minimum=0))
    for _ in range(steps):
        images = []
        for _ in range(samples):
            if rng.random() < spec.video_share:
                frames = int(min(spec.max_frames, 4 * (1.0 + rng.pareto(spec.frames_alpha))))
                images.append(np.full(frames, spec.tokens_per_image, np.int64))
            else:
                count = int(rng.geometric(1.0 / spec.images_mean))
                scale = np.clip(rng.lognormal(0.0, spec.resolution_sigma, count), 0.25, 16.0)
                images.append(np.maximum(16, (spec.tokens_per_image * scale / 16).round().astype(np.int64) * 16))
        text = np.maximum(16, rng.lognormal(np.log(spec.text_tokens_mean) - 0.125, 0.5, samples)).astype(np.int64)
        llm = text + np.array([int(t.sum()) for t in images], np.int64)
        yield Batch(image_tokens=images, llm_tokens=llm)
