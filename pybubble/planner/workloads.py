"""Multimodal batches whose cost changes every step: images per sample, native resolutions, video
frames and text lengths drawn from heavy-tailed distributions with a fixed seed (no downloads), and
each sample's encoder and LLM cost from the cost model."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..config.checks import finite, integer
from ..config.models import EncoderConfig, LLMConfig
from ..costs.roofline import CostModel


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


def microbatch_loads(cost: np.ndarray, microbatches: int, assignment: np.ndarray | None = None) -> np.ndarray:
    """Per microbatch, the summed `cost` of its samples (one cost per sample). Without `assignment`
    the samples fill the microbatches in order, in equal groups (a data loader's split); with it,
    sample i goes to microbatch ``assignment[i]`` (e.g. from balance_microbatches)."""
    c = np.asarray(cost, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"cost: shape {c.shape} is not one cost per sample")
    integer(microbatches, "microbatches", minimum=1)
    if assignment is None:
        if c.size % microbatches:
            raise ValueError(f"microbatches: {c.size} samples do not split into {microbatches} equal groups")
        return c.reshape(microbatches, -1).sum(axis=1)
    a = np.asarray(assignment)
    if a.shape != c.shape or (a.size and (a.min() < 0 or a.max() >= microbatches)):
        raise ValueError(f"assignment: shape {a.shape} or values outside [0, {microbatches}) for {c.size} samples")
    return np.bincount(a, weights=c, minlength=microbatches)


def light_ends_order(loads: np.ndarray) -> np.ndarray:
    """The order to run microbatches in, given each one's encoder load: ``order[k]`` is the
    microbatch that feeds LLM microbatch k. The lightest runs last, the next lightest first, and so
    on inward, so the heaviest sit in the middle of the step: the encoder's forward of the first
    microbatches must finish before the LLM starts and the backward of the last ones after it ends,
    with the least room around them, while the pipeline's bubbles are in the middle."""
    c = np.asarray(loads, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"loads: shape {c.shape} is not one load per microbatch")
    light = np.argsort(c, kind="stable")
    n = len(c)
    inward = np.empty(n, np.int64)  # the slots from the ends inward: last, first, last but one, second, ...
    inward[0::2] = np.arange(n - 1, n - 1 - len(inward[0::2]), -1)
    inward[1::2] = np.arange(len(inward[1::2]))
    order = np.empty(n, np.int64)
    order[inward] = light
    return order


WORK_ORDERS = ("light_ends", "heavy_ends", "ascending", "descending")
"""The orders of microbatches by encoder work that :func:`work_orders` gives."""


def work_orders(loads: np.ndarray) -> dict[str, np.ndarray]:
    """Orders to run microbatches in, by their encoder `loads` (``order[k]``: the microbatch that feeds
    LLM microbatch k), one per :data:`WORK_ORDERS`: :func:`light_ends_order`, its reverse (the heavy
    ones at the ends), and sorted up and down. Which one gives the shortest step depends on the
    plan: a whole microbatch loads one pipeline's lanes, a spread one all of them, so the heavy ones
    belong where the plan has the most room around them."""
    c = np.asarray(loads, dtype=np.float64)
    return {"light_ends": light_ends_order(c), "heavy_ends": light_ends_order(-c),
            "ascending": np.argsort(c, kind="stable"), "descending": np.argsort(-c, kind="stable")}


def sample_costs(batch: Batch, *, encoder: EncoderConfig, llm: LLMConfig, costs: CostModel,
                 encoder_tp: int = 1, llm_tp: int = 1, frozen: bool = False, recompute: str = "none") -> np.ndarray:
    """N x 2 array: each sample's encoder time (all layers, forward + backward unless frozen, each
    image at its own length) and LLM time (all layers, forward + backward), in microseconds; the
    backwards hold the recomputed forward work of `recompute`."""

    @lru_cache(maxsize=None)
    def enc(tokens: int) -> float:
        t = costs.layer_time(encoder, 1, tokens, tp=encoder_tp, phase="fwd")
        if not frozen:
            t += costs.layer_time(encoder, 1, tokens, tp=encoder_tp, phase="bwd", recompute=recompute)
        return encoder.layers * t

    @lru_cache(maxsize=None)
    def lm(tokens: int) -> float:
        return llm.layers * (costs.layer_time(llm, 1, tokens, tp=llm_tp, phase="fwd")
                             + costs.layer_time(llm, 1, tokens, tp=llm_tp, phase="bwd", recompute=recompute))

    out = np.empty((len(batch.image_tokens), 2))
    for i, tokens in enumerate(batch.image_tokens):
        out[i, 0] = sum(enc(int(t)) for t in tokens)
        out[i, 1] = lm(int(batch.llm_tokens[i]))
    return out
