"""Multimodal batches whose cost changes every step, and each sample's encoder and LLM cost from the
cost model. Two kinds of data, both seeded (no downloads):

- :func:`batches`: images per sample, native resolutions, video frames and text lengths from
  heavy-tailed distributions (:class:`WorkloadSpec`), as encoder tokens per image;
- :class:`Samples`: MLLM data as tiles (dynamic resolution, InternVL-style): each sample is text
  plus 0..N images of 1..T tiles, drawn from an open VLM's mix (:func:`mix`, :class:`MixSpec`) or
  read from a user's JSON lines file (:func:`read_samples`). docs/dynamic.md gives the mix's
  numbers and where they come from."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..config.checks import array, finite, integer, positive_int
from ..config.documents import read_text
from ..config.models import EncoderConfig, LLMConfig
from ..costs.roofline import CostModel
from ..schedule.balance import middle_room, order_by_bubbles, pack_microbatches


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


WORK_ORDERS = ("light_ends", "heavy_ends", "ascending", "descending")
"""The orders of microbatches by encoder work that :func:`work_orders` gives."""


def work_orders(loads: np.ndarray) -> dict[str, np.ndarray]:
    """Orders to run microbatches in, by their encoder `loads` (``order[k]``: the microbatch that feeds
    LLM microbatch k), one per :data:`WORK_ORDERS`: the light ones first and last and the heavy ones
    in the middle (:func:`~pybubble.schedule.balance.order_by_bubbles` against
    :func:`~pybubble.schedule.balance.middle_room`), its reverse (the heavy ones at the ends), and
    sorted up and down. Which one gives the shortest step depends on the plan: a whole microbatch
    loads one pipeline's lanes, a spread one all of them, so the heavy ones belong where the plan has
    the most room around them."""
    c = np.asarray(loads, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"loads: shape {c.shape} is not one load per microbatch")
    room = middle_room(len(c)) if len(c) else np.zeros(0)
    return {"light_ends": order_by_bubbles(c, room), "heavy_ends": order_by_bubbles(-c, room),
            "ascending": np.argsort(c, kind="stable"), "descending": np.argsort(-c, kind="stable")}


def encoder_time(encoder: EncoderConfig, tokens: int, costs: CostModel, *, tp: int = 1, frozen: bool = False,
                 recompute: str = "none") -> float:
    """The encoder's time on one image of `tokens` tokens (us): all layers, forward plus backward
    unless frozen; the backward holds the recomputed forward work of `recompute`."""
    t = costs.layer_time(encoder, 1, tokens, tp=tp, phase="fwd")
    if not frozen:
        t += costs.layer_time(encoder, 1, tokens, tp=tp, phase="bwd", recompute=recompute)
    return encoder.layers * t


def llm_time(llm: LLMConfig, tokens: int, costs: CostModel, *, tp: int = 1, recompute: str = "none") -> float:
    """The LLM's time on one sequence of `tokens` tokens (us): all layers, forward plus backward."""
    return llm.layers * (costs.layer_time(llm, 1, tokens, tp=tp, phase="fwd")
                         + costs.layer_time(llm, 1, tokens, tp=tp, phase="bwd", recompute=recompute))


def sample_costs(batch: Batch, *, encoder: EncoderConfig, llm: LLMConfig, costs: CostModel,
                 encoder_tp: int = 1, llm_tp: int = 1, frozen: bool = False, recompute: str = "none") -> np.ndarray:
    """N x 2 array: each sample's encoder time (all layers, forward + backward unless frozen, each
    image at its own length) and LLM time (all layers, forward + backward), in microseconds; the
    backwards hold the recomputed forward work of `recompute`."""

    @lru_cache(maxsize=None)
    def enc(tokens: int) -> float:
        return encoder_time(encoder, tokens, costs, tp=encoder_tp, frozen=frozen, recompute=recompute)

    @lru_cache(maxsize=None)
    def lm(tokens: int) -> float:
        return llm_time(llm, tokens, costs, tp=llm_tp, recompute=recompute)

    out = np.empty((len(batch.image_tokens), 2))
    for i, tokens in enumerate(batch.image_tokens):
        out[i, 0] = sum(enc(int(t)) for t in tokens)
        out[i, 1] = lm(int(batch.llm_tokens[i]))
    return out


TOKENS_PER_TILE = 256
"""LLM tokens of one tile by default: InternVL's 448-pixel tile, 14-pixel patches (32 x 32) and a
pixel shuffle of 0.5 (1024 / 4)."""


@dataclass(kw_only=True, slots=True)
class Samples:
    """Samples as MLLM data: each is text plus 0..N images of 1..T tiles (a video's frames are its
    images, one tile each). Flat arrays: the images of all samples in sample order."""

    tiles: np.ndarray
    """Tiles of each image (int64, >= 1), sample 0's images first."""
    images: np.ndarray
    """Images of each sample (int64, >= 0; 0 for a text-only sample)."""
    text: np.ndarray
    """Text tokens of each sample (int64, >= 0)."""

    def __post_init__(self) -> None:
        self.tiles = _counts(self.tiles, "tiles", 1)
        self.images = _counts(self.images, "images", 0)
        self.text = _counts(self.text, "text", 0)
        if self.text.shape != self.images.shape:
            raise ValueError(f"text: {self.text.size} entries for {self.images.size} samples")
        if int(self.images.sum()) != self.tiles.size:
            raise ValueError(f"images: {int(self.images.sum())} in all, but {self.tiles.size} tile counts")

    @classmethod
    def of(cls, tiles: Sequence[Sequence[int]], text: Sequence[int] | None = None) -> "Samples":
        """From one list of tile counts per sample (``[]`` for text only) and, optionally, the text
        tokens of each sample (0 when left out)."""
        images = [len(t) for t in tiles]
        flat = [t for sample in tiles for t in sample]
        return cls(tiles=np.array(flat, np.int64), images=np.array(images, np.int64),
                   text=np.zeros(len(images), np.int64) if text is None else np.asarray(text))

    def __len__(self) -> int:
        return int(self.images.size)

    @property
    def image_sample(self) -> np.ndarray:
        """The sample of each image (int64, non-decreasing)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.images)

    @property
    def sample_tiles(self) -> np.ndarray:
        """Tiles of each sample, all its images together (int64)."""
        return np.bincount(self.image_sample, weights=self.tiles, minlength=len(self)).astype(np.int64)

    def tokens(self, tokens_per_tile: int = TOKENS_PER_TILE) -> np.ndarray:
        """LLM tokens of each sample: its text plus `tokens_per_tile` per tile (int64)."""
        return self.text + self.sample_tiles * integer(tokens_per_tile, "tokens_per_tile", minimum=1)

    def take(self, index: np.ndarray) -> "Samples":
        """The samples at `index` (in that order, repeats allowed)."""
        idx = np.asarray(index, np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(self))):
            raise ValueError(f"index: shape {idx.shape} or values outside [0, {len(self)})")
        start = np.concatenate(([0], np.cumsum(self.images)))[idx]
        count = self.images[idx]
        first = np.concatenate(([0], np.cumsum(count)))[:-1]
        flat = np.repeat(start - first, count) + np.arange(int(count.sum()), dtype=np.int64)
        return Samples(tiles=self.tiles[flat], images=count, text=self.text[idx])

    def draw(self, count: int, rng: np.random.Generator) -> "Samples":
        """`count` samples drawn with replacement: a user's data file replayed as a distribution."""
        if not len(self):
            raise ValueError("samples: none to draw from")
        return self.take(rng.integers(0, len(self), integer(count, "count", minimum=0)))

    def to_batch(self, tokens_per_tile: int = TOKENS_PER_TILE) -> Batch:
        """The samples as a :class:`Batch`: each image's encoder tokens (its tiles times
        `tokens_per_tile`) and each sample's LLM tokens."""
        per_image = self.tiles * integer(tokens_per_tile, "tokens_per_tile", minimum=1)
        return Batch(image_tokens=np.split(per_image, np.cumsum(self.images)[:-1]), llm_tokens=self.tokens(tokens_per_tile))

    def pack(self, microbatches: int, sequence_length: int | None,
             tokens_per_tile: int = TOKENS_PER_TILE) -> np.ndarray:
        """The LLM microbatch of each sample, each microbatch's tokens within `sequence_length`
        (:func:`pybubble.schedule.balance.pack_microbatches`, encoder work as tiles)."""
        return pack_microbatches(self.tokens(tokens_per_tile), microbatches, sequence_length,
                                 encoder=self.sample_tiles)


def _counts(values: object, where: str, minimum: int) -> np.ndarray:
    """`values` as a 1-D int64 array of integers >= `minimum`; a ValueError naming the first bad one."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        if arr.size == 0 and arr.ndim == 1:
            return arr.astype(np.int64)
        raise ValueError(f"{where}: expected a 1-D array of integers, got {arr.dtype} of shape {arr.shape}")
    bad = np.flatnonzero(arr < minimum)
    if bad.size:
        integer(int(arr[bad[0]]), f"{where}[{int(bad[0])}]", minimum=minimum)
    return arr.astype(np.int64)


@dataclass(kw_only=True, slots=True, frozen=True)
class MixSpec:
    """A training mix shaped like an open VLM's instruction data: shares of text-only, single-image,
    multi-image and video samples, tiles per image under InternVL-style dynamic resolution (a grid
    of up to 12 tiles plus a thumbnail: 1 or 3..13 tiles), frames as one tile each. The defaults and
    where they come from: docs/dynamic.md (illustrative, shaped after LLaVA-OneVision's data and
    InternVL's tiling)."""

    text_only: float = 0.10
    """Share of samples without an image."""
    single_image: float = 0.68
    """Share of samples with one image."""
    multi_image: float = 0.14
    """Share of samples with several images."""
    video: float = 0.08
    """Share of samples that are short videos."""
    single_tiles: tuple[tuple[int, float], ...] = ((1, 0.10), (3, 0.05), (5, 0.10), (7, 0.15), (9, 0.15),
                                                   (10, 0.10), (13, 0.35))
    """Tiles of a single image: (tiles, probability) pairs, probabilities summing to 1."""
    multi_images: tuple[int, int] = (2, 6)
    """Images of a multi-image sample: uniform in this closed range."""
    multi_tile_budget: int = 24
    """Tiles a multi-image sample's images share: each image is drawn like a single image, then cut
    to ``max(1, budget // images)`` tiles."""
    video_frames: tuple[int, int] = (8, 32)
    """Frames of a video: uniform in this closed range, one tile each."""
    text_median: float = 256.0
    """Median text tokens of a sample (lognormal)."""
    text_sigma: float = 0.8
    """Sigma of the text tokens' lognormal."""
    text_max: int = 2048
    """Most text tokens of a sample (the lognormal's tail cut here)."""

    def __post_init__(self) -> None:
        shares = [finite(getattr(self, k), k, minimum=0.0) for k in ("text_only", "single_image", "multi_image", "video")]
        if abs(sum(shares) - 1.0) > 1e-9:
            raise ValueError(f"text_only, single_image, multi_image, video: shares sum to {sum(shares)!r}, not 1")
        if not self.single_tiles:
            raise ValueError("single_tiles: empty")
        for i, (tiles, p) in enumerate(self.single_tiles):
            positive_int(tiles, f"single_tiles[{i}].tiles")
            finite(p, f"single_tiles[{i}].probability", minimum=0.0)
        total = sum(p for _, p in self.single_tiles)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"single_tiles: probabilities sum to {total!r}, not 1")
        for name, low in (("multi_images", 2), ("video_frames", 1)):
            lo, hi = getattr(self, name)
            integer(lo, f"{name}[0]", minimum=low)
            integer(hi, f"{name}[1]", minimum=lo)
        positive_int(self.multi_tile_budget, "multi_tile_budget")
        finite(self.text_median, "text_median", minimum=1.0)
        finite(self.text_sigma, "text_sigma", minimum=0.0)
        positive_int(self.text_max, "text_max")

    def draw(self, count: int, rng: np.random.Generator) -> Samples:
        """`count` samples from the mix."""
        n = integer(count, "count", minimum=0)
        kind = rng.choice(4, size=n, p=[self.text_only, self.single_image, self.multi_image, self.video])
        images = np.zeros(n, np.int64)
        images[kind == 1] = 1
        multi, video = kind == 2, kind == 3
        images[multi] = rng.integers(self.multi_images[0], self.multi_images[1] + 1, int(multi.sum()))
        images[video] = rng.integers(self.video_frames[0], self.video_frames[1] + 1, int(video.sum()))
        values = np.array([t for t, _ in self.single_tiles], np.int64)
        probs = np.array([p for _, p in self.single_tiles])
        tiles = values[rng.choice(values.size, size=int(images.sum()), p=probs / probs.sum())]
        image_kind = np.repeat(kind, images)
        cap = np.repeat(np.maximum(1, self.multi_tile_budget // np.maximum(images, 1)), images)
        tiles = np.where(image_kind == 2, np.minimum(tiles, cap), tiles)
        tiles[image_kind == 3] = 1
        text = np.clip(np.rint(rng.lognormal(np.log(self.text_median), self.text_sigma, n)), 1, self.text_max)
        return Samples(tiles=tiles, images=images, text=text.astype(np.int64))


def mix(count: int, *, seed: int = 0, spec: MixSpec | None = None) -> Samples:
    """`count` samples of an open VLM's training mix (:class:`MixSpec`), reproducible from `seed`."""
    return (spec or MixSpec()).draw(count, np.random.default_rng(integer(seed, "seed", minimum=0)))


def read_samples(path: str | os.PathLike[str], *, tokens_per_tile: int = TOKENS_PER_TILE,
                 max_tiles: int | None = None, max_tokens: int | None = None) -> Samples:
    """A user's data as :class:`Samples`: JSON lines, one sample each, ``{"tiles": [t1, t2, ...]}``
    (one count per image, ``[]`` for text only; optional ``"text": N`` text tokens; other keys are
    ignored; blank lines skipped). Refuses, with a ValueError naming the line and the field: a line
    that is not a JSON object, a tile count below 1 or not an integer, text that is not an
    integer >= 0, a sample over `max_tiles` tiles or `max_tokens` LLM tokens (text plus
    `tokens_per_tile` per tile), and a file without samples."""
    integer(tokens_per_tile, "tokens_per_tile", minimum=1)
    if max_tiles is not None:
        positive_int(max_tiles, "max_tiles")
    if max_tokens is not None:
        positive_int(max_tokens, "max_tokens")
    tiles: list[int] = []
    images: list[int] = []
    text: list[int] = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        if not isinstance(doc, dict):
            raise ValueError(f'{where}: expected an object like {{"tiles": [4, 1]}}, got {type(doc).__name__}')
        if "tiles" not in doc:
            raise ValueError(f"{where}: tiles: missing")
        counts = [positive_int(t, f"{where}: tiles[{i}]") for i, t in enumerate(array(doc["tiles"], f"{where}: tiles"))]
        words = integer(doc.get("text", 0), f"{where}: text", minimum=0)
        if max_tiles is not None and sum(counts) > max_tiles:
            raise ValueError(f"{where}: tiles: {sum(counts)} tiles in the sample, more than the limit of {max_tiles}")
        if max_tokens is not None and words + sum(counts) * tokens_per_tile > max_tokens:
            raise ValueError(f"{where}: tokens: {words} text + {sum(counts)} tiles x {tokens_per_tile} = "
                             f"{words + sum(counts) * tokens_per_tile}, more than the limit of {max_tokens}")
        tiles += counts
        images.append(len(counts))
        text.append(words)
    if not images:
        raise ValueError(f"{path}: no samples (an empty file)")
    return Samples(tiles=np.array(tiles, np.int64), images=np.array(images, np.int64), text=np.array(text, np.int64))
