"""A user's samples from a data file: JSON lines, one sample each (:func:`read_samples`)."""

from __future__ import annotations

import json
import os

import numpy as np

from ..config.checks import array, integer, positive_int
from ..config.documents import read_text
from .samples import TOKENS_PER_TILE, Samples


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
