"""A user's samples from a data file: JSON lines, one sample each (:func:`read_samples`)."""

from __future__ import annotations

import json
import os

import numpy as np

from ..config.checks import array, integer, positive_int
from ..config.documents import read_text
from .pixels import PROCESSORS, VisionProcessor, patches, pixel_sample
from .samples import TOKENS_PER_TILE, Samples

PIXEL_KEYS = ("images", "videos")
"""The keys of a line that describes its sample in pixels (native resolution)."""


def read_samples(path: str | os.PathLike[str], *, tokens_per_tile: int = TOKENS_PER_TILE,
                 max_tiles: int | None = None, max_tokens: int | None = None,
                 processor: VisionProcessor | None = None, max_patches: int | None = None,
                 cut_rows: int | None = None) -> Samples:
    """A user's data as :class:`Samples`: JSON lines, one sample each, ``{"tiles": [t1, t2, ...]}``
    (one count per image, ``[]`` for text only; optional ``"text": N`` text tokens; other keys are
    ignored; blank lines skipped), or, at native resolution, ``{"images": [[h, w], ...], "videos":
    [[frames, h, w], ...], "text": N}`` (sizes in pixels; `processor`'s rules, default Qwen2.5-VL's,
    decide each one's grid of patches and its LLM tokens: :attr:`Samples.grids`). Refuses, with a
    ValueError naming the line and the field: a line that is not a JSON object, a tile count below
    1 or not an integer, an image size the processor refuses (below 1 pixel, an aspect ratio over
    200), text that is not an integer >= 0, a file mixing tile and pixel lines, a sample over
    `max_tiles` tiles, an image or video over `max_patches` patches (with `cut_rows`, an image may
    be cut between every `cut_rows` rows of a frame, as packed chunks span it: each band of them
    within `max_patches`) or a sample over `max_tokens` LLM tokens (text plus `tokens_per_tile` per
    tile, or its images' tokens), and a file without samples."""
    integer(tokens_per_tile, "tokens_per_tile", minimum=1)
    for name, limit in (("max_tiles", max_tiles), ("max_tokens", max_tokens), ("max_patches", max_patches),
                        ("cut_rows", cut_rows)):
        if limit is not None:
            positive_int(limit, name)
    read = _Lines(tokens_per_tile, max_tiles, max_tokens, max_patches,
                  processor if processor is not None else PROCESSORS["qwen2_5_vl"], cut_rows)
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if line.strip():
            read.line(line, f"{path} line {number}")
    if not read.images:
        raise ValueError(f"{path}: no samples (an empty file)")
    return Samples(tiles=np.array(read.tiles, np.int64), images=np.array(read.images, np.int64),
                   text=np.array(read.text, np.int64),
                   grids=np.array(read.grids, np.int64).reshape(-1, 3) if read.kind == "pixels" else None)


class _Lines:
    """The samples of a data file's lines, read one at a time."""

    def __init__(self, tokens_per_tile: int, max_tiles: int | None, max_tokens: int | None, max_patches: int | None,
                 processor: VisionProcessor, cut_rows: int | None = None):
        self.tokens_per_tile, self.max_tiles, self.max_tokens, self.max_patches = (tokens_per_tile, max_tiles,
                                                                                   max_tokens, max_patches)
        self.cut_rows = cut_rows
        self.processor = processor
        self.tiles: list[int] = []  # each image's tiles (in pixels: its tokens)
        self.images: list[int] = []
        self.text: list[int] = []
        self.grids: list[tuple[int, int, int]] = []
        self.kind: str | None = None  # "tiles" or "pixels", from the first sample with images

    def line(self, line: str, where: str) -> None:
        """The sample of one line (not blank)."""
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        if not isinstance(doc, dict):
            raise ValueError(f'{where}: expected an object like {{"tiles": [4, 1]}}, got {type(doc).__name__}')
        mine = "pixels" if any(k in doc for k in PIXEL_KEYS) else "tiles" if "tiles" in doc else None
        if None not in (self.kind, mine) and mine != self.kind:
            raise ValueError(f"{where}: a sample in {mine} in a file of samples in {self.kind} (give images in tiles "
                             "or in pixels, one or the other)")
        self.kind = self.kind or mine
        if mine is None and "text" not in doc:
            raise ValueError(f"{where}: tiles: missing (or images and videos in pixels)")
        counts, grids = [], []
        if mine == "pixels":
            grids = pixel_sample(doc, where, self.processor)[0]
            counts = [self.processor.tokens(g) for g in grids]
        elif mine == "tiles":
            counts = [positive_int(t, f"{where}: tiles[{i}]") for i, t in enumerate(array(doc["tiles"], f"{where}: tiles"))]
        words = integer(doc.get("text", 0), f"{where}: text", minimum=0)
        self._check(where, counts, grids, words)
        self.grids += grids
        self.tiles += counts
        self.images.append(len(counts))
        self.text.append(words)

    def _check(self, where: str, counts: list[int], grids: list[tuple[int, int, int]], words: int) -> None:
        """A sample within the limits."""
        for i, grid in enumerate(grids):
            if self.max_patches is None or patches(grid) <= self.max_patches:
                continue
            if self.cut_rows is None:
                raise ValueError(f"{where}: image {i}: grid {grid} of {patches(grid)} patches, more than the limit "
                                 f"of {self.max_patches}")
            band = min(grid[1], self.cut_rows) * grid[2]
            if band > self.max_patches:
                raise ValueError(f"{where}: image {i}: grid {grid}: {min(grid[1], self.cut_rows)} rows of {grid[2]} "
                                 f"patches ({band}) cannot be cut, more than the limit of {self.max_patches} (an image "
                                 f"larger than a chunk is cut between every {self.cut_rows} rows)")
        if not grids and self.max_tiles is not None and sum(counts) > self.max_tiles:
            raise ValueError(f"{where}: tiles: {sum(counts)} tiles in the sample, more than the limit of "
                             f"{self.max_tiles}")
        per = 1 if grids else self.tokens_per_tile
        if self.max_tokens is not None and words + sum(counts) * per > self.max_tokens:
            what = f"{sum(counts)} image tokens" if grids else f"{sum(counts)} tiles x {per}"
            raise ValueError(f"{where}: tokens: {words} text + {what} = {words + sum(counts) * per}, more than "
                             f"the limit of {self.max_tokens}")
