"""A training mix shaped like an open VLM's instruction data (:class:`MixSpec`), drawn reproducibly
from a seed (:func:`mix`). docs/dynamic.md gives the mix's numbers and where they come from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.checks import finite, integer, positive_int
from .samples import Samples


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


@dataclass(kw_only=True, slots=True, frozen=True)
class NativeMixSpec:
    """The open-VLM mix at native resolution: the sample kinds, images per multi-image sample and
    text of :attr:`base` (a :class:`MixSpec`), each image a size in pixels drawn from :attr:`sizes`,
    each video :attr:`video_frames` frames of :attr:`video_size`; the processor's rules
    (:class:`~pybubble.data.pixels.VisionProcessor`) give each its grid and tokens. The sizes and
    where they come from: docs/dynamic.md (illustrative)."""

    base: MixSpec = MixSpec()
    """The shares of text-only, single-image, multi-image and video samples, and the text."""
    sizes: tuple[tuple[int, int, float], ...] = ((224, 224, 0.10), (336, 336, 0.10), (480, 640, 0.30),
                                                 (720, 1280, 0.20), (1024, 768, 0.15), (1600, 600, 0.10),
                                                 (56, 56, 0.05))
    """(height, width, probability) of an image, probabilities summing to 1."""
    video_frames: tuple[int, int] = (8, 16)
    """Frames of a video: uniform in this closed range."""
    video_size: tuple[int, int] = (224, 336)
    """(height, width) of a video's frames."""
    scale: float = 1.0
    """Every side times this (a smaller run of the same shapes), at least 1 pixel."""

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("sizes: empty")
        for i, (h, w, p) in enumerate(self.sizes):
            positive_int(h, f"sizes[{i}].height")
            positive_int(w, f"sizes[{i}].width")
            finite(p, f"sizes[{i}].probability", minimum=0.0)
        total = sum(p for _, _, p in self.sizes)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"sizes: probabilities sum to {total!r}, not 1")
        lo, hi = self.video_frames
        integer(lo, "video_frames[0]", minimum=1)
        integer(hi, "video_frames[1]", minimum=lo)
        positive_int(self.video_size[0], "video_size[0]")
        positive_int(self.video_size[1], "video_size[1]")
        finite(self.scale, "scale", minimum=1e-9)

    def draw(self, count: int, rng: np.random.Generator, processor=None) -> Samples:
        """`count` samples from the mix, their images' grids and tokens by `processor`'s rules
        (default Qwen2.5-VL's)."""
        if processor is None:
            from ..config.processors import PROCESSORS

            processor = PROCESSORS["qwen2_5_vl"]
        b = self.base
        n = integer(count, "count", minimum=0)
        kind = rng.choice(4, size=n, p=[b.text_only, b.single_image, b.multi_image, b.video])
        images = np.where(kind == 0, 0, 1).astype(np.int64)
        multi = kind == 2
        images[multi] = rng.integers(b.multi_images[0], b.multi_images[1] + 1, int(multi.sum()))
        probs = np.array([p for _, _, p in self.sizes])
        drawn = rng.choice(len(self.sizes), size=int(images.sum()), p=probs / probs.sum())
        frames = rng.integers(self.video_frames[0], self.video_frames[1] + 1, int(images.sum()))
        grids = []
        for image_kind, size, f in zip(np.repeat(kind, images), drawn, frames):
            h, w = self.video_size if image_kind == 3 else self.sizes[size][:2]
            side = [max(1, round(x * self.scale)) for x in (h, w)]
            grids.append(processor.grid(*side, frames=int(f) if image_kind == 3 else 1))
        text = np.clip(np.rint(rng.lognormal(np.log(b.text_median), b.text_sigma, n)), 1, b.text_max)
        return Samples(tiles=np.array([processor.tokens(g) for g in grids], np.int64), images=images,
                       text=text.astype(np.int64), grids=np.array(grids, np.int64).reshape(-1, 3))


def native_mix(count: int, *, seed: int = 0, spec: NativeMixSpec | None = None, processor=None) -> Samples:
    """`count` samples of the open-VLM mix at native resolution (:class:`NativeMixSpec`; `processor`
    default Qwen2.5-VL's), reproducible from `seed`."""
    return (spec or NativeMixSpec()).draw(count, np.random.default_rng(integer(seed, "seed", minimum=0)), processor)
