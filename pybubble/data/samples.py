"""MLLM data as tiles (dynamic resolution, InternVL-style): each sample is text plus 0..N images of
1..T tiles (:class:`Samples`), drawn from an open VLM's mix (:mod:`pybubble.data.mix`) or read from a
user's data file (:mod:`pybubble.data.files`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config.checks import integer
from ..schedule.balance import pack_microbatches
from .workloads import Batch


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
    grids: np.ndarray | None = None
    """Native-resolution images (:mod:`pybubble.data.pixels`): each image's grid of patches
    ``(temporal patches, rows, columns)`` (int64, images x 3), and its ``tiles`` are its LLM tokens
    (its patches over the merger's square); None: tiles of a fixed shape."""

    def __post_init__(self) -> None:
        self.tiles = _counts(self.tiles, "tiles", 1)
        self.images = _counts(self.images, "images", 0)
        self.text = _counts(self.text, "text", 0)
        if self.grids is not None:
            self.grids = np.asarray(self.grids, np.int64).reshape(-1, 3)
            if self.grids.shape[0] != self.tiles.size or (self.grids < 1).any():
                raise ValueError(f"grids: {self.grids.shape[0]} grids of positive sides for {self.tiles.size} images")
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
        """LLM tokens of each sample: its text plus `tokens_per_tile` per tile (int64; with
        :attr:`grids`, a tile is one token whatever `tokens_per_tile`)."""
        per = 1 if self.grids is not None else integer(tokens_per_tile, "tokens_per_tile", minimum=1)
        return self.text + self.sample_tiles * per

    def take(self, index: np.ndarray) -> "Samples":
        """The samples at `index` (in that order, repeats allowed)."""
        idx = np.asarray(index, np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(self))):
            raise ValueError(f"index: shape {idx.shape} or values outside [0, {len(self)})")
        start = np.concatenate(([0], np.cumsum(self.images)))[idx]
        count = self.images[idx]
        first = np.concatenate(([0], np.cumsum(count)))[:-1]
        flat = np.repeat(start - first, count) + np.arange(int(count.sum()), dtype=np.int64)
        return Samples(tiles=self.tiles[flat], images=count, text=self.text[idx],
                       grids=None if self.grids is None else self.grids[flat])

    def draw(self, count: int, rng: np.random.Generator) -> "Samples":
        """`count` samples drawn with replacement: a user's data file replayed as a distribution."""
        if not len(self):
            raise ValueError("samples: none to draw from")
        return self.take(rng.integers(0, len(self), integer(count, "count", minimum=0)))

    def to_batch(self, tokens_per_tile: int = TOKENS_PER_TILE) -> Batch:
        """The samples as a :class:`Batch`: each image's encoder tokens (its tiles times
        `tokens_per_tile`; with :attr:`grids`, its patches, the encoder's sequence before the merger)
        and each sample's LLM tokens."""
        per_image = (self.grids.prod(axis=1) if self.grids is not None  # native resolution: its patches
                     else self.tiles * integer(tokens_per_tile, "tokens_per_tile", minimum=1))
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
