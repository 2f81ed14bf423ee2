"""One step's encoder input as it comes: data that varies per step.

Real multimodal data changes every batch: one LLM microbatch holds text-only samples, another a
13-tile image, another a video's 30 frames. The encoder's unit is a *tile* (an image tile, a
video frame, or a whole sample when the images are of one fixed shape): an
:class:`EncoderBatch` holds, per LLM microbatch, that microbatch's tiles along dim 0 (one tensor,
or a tuple of tensors for an encoder of several inputs), 0 tiles for a microbatch without images.

The encoder's pieces are traced once, on one chunk of a fixed number of tiles (the runtime's
``example``): each microbatch's tiles run in :meth:`EncoderBatch.chunk` pieces of that shape, the
last one padded with zero tiles, so the pieces and their measured costs are reused every step
(an encoder that mixes tiles, e.g. batch norm in training mode, is refused when it is split).
The padding tiles' outputs are dropped; their gradients are zero.

Packed chains (:class:`Packing`): a microbatch's last chunk is mostly padding when its images are
small (a 1-tile image runs a whole chunk). Run as one stream, slot by slot, the step's tiles need
only ``ceil(all tiles / size)`` chunks: each slot's chain takes whole chunks of the stream, as few
as cover its own tiles that earlier chains did not take, so a chain may also run the first tiles
of later slots (their outputs are ready early; their gradients come later) and only the stream's
last chunk is padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..placement.slots import SlotLayout

Inputs = tuple[torch.Tensor, ...]


def chunk_counts(tiles: Sequence[int], size: int) -> list[int]:
    """Chunks of ``size`` tiles that each of ``tiles`` runs in (the last one padded)."""
    return [-(-int(t) // size) for t in tiles]


def packed_rows(tiles: Sequence[int], size: int) -> list[int]:
    """Per slot, the rows of its packed chain when the slots' ``tiles`` run as one stream (slot by
    slot) in chunks of ``size``: whole chunks of the stream (the last chain: the rest), as few as
    cover the slot's tiles not taken by earlier chains (0 when they took them all)."""
    out, at, end, total = [], 0, 0, sum(int(t) for t in tiles)
    for t in tiles:
        end += int(t)
        take = min(max(0, -(-(end - at) // size) * size), total - at)
        out.append(take)
        at += take
    return out


@dataclass(frozen=True)
class Packing:
    """Which rows of which chain make each slot's encoder output: ``rows[k]`` (slot k's chain as
    given: the tiles whose outputs are slot k's, its own and the moved-in ones) against
    ``packed[k]`` (the chain that runs for slot k's deadline). Unpacked: the two are equal."""

    rows: tuple[int, ...]
    """Per LLM slot: the rows (tiles) of its chain as given, whose outputs are that slot's."""
    packed: tuple[int, ...]
    """Per LLM slot: the rows of the chain that runs for its deadline."""

    @classmethod
    def of(cls, rows: Sequence[int], size: int | None) -> Packing:
        """Packed into chunks of ``size`` (:func:`packed_rows`); None: not packed."""
        rows = tuple(int(t) for t in rows)
        return cls(rows, rows if size is None else tuple(packed_rows(rows, size)))

    def _cut(self, mine: tuple[int, ...], other: tuple[int, ...], k: int) -> list[tuple[int, int, int]]:
        """``(slot, lo, hi)``: the rows of ``other``'s chains that stream rows of ``mine``'s chain
        ``k`` are, in order."""
        start = sum(mine[:k])
        lo, hi, out, at = start, start + mine[k], [], 0
        for g, n in enumerate(other):
            a, b = max(lo, at), min(hi, at + n)
            if a < b:
                out.append((g, a - at, b - at))
            at += n
        return out

    def sources(self, k: int) -> list[tuple[int, int, int]]:
        """``(g, lo, hi)``: the rows ``lo:hi`` of packed chain g that make slot k's chain, in order."""
        return self._cut(self.rows, self.packed, k)

    def parts(self, g: int) -> list[tuple[int, int, int]]:
        """``(k, lo, hi)``: the rows ``lo:hi`` of slot k's chain that packed chain g runs, in order."""
        return self._cut(self.packed, self.rows, g)

    def batch(self, batch: EncoderBatch) -> EncoderBatch:
        """``batch`` (its chains, rows as ``rows``) as the packed chains' inputs."""
        if self.packed == self.rows:
            return batch
        stream = [torch.cat([x[i] for x in batch.inputs]) for i in range(len(batch.inputs[0]))]
        return EncoderBatch([tuple(s[a:a + n] for s in stream)
                             for a, n in zip(np.cumsum((0, *self.packed[:-1])).tolist(), self.packed)])


def inputs_of(x: torch.Tensor | Sequence[torch.Tensor]) -> Inputs:
    """An encoder input as a tuple of tensors."""
    return (x,) if isinstance(x, torch.Tensor) else tuple(x)


def cast_inputs(x: Sequence[torch.Tensor], device: torch.device | None, dtype: torch.dtype | None = None) -> Inputs:
    """Inputs on ``device`` (None: where they are), the floating ones in ``dtype`` (None: their
    own); what is not a tensor is left for the batch's checks to name."""
    return tuple(t if not isinstance(t, torch.Tensor) else
                 t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device) for t in x)


class EncoderBatch:
    """Per LLM microbatch of a step, its encoder input: a tensor (or tuple of tensors) whose dim 0
    counts the microbatch's tiles (0: no images)."""

    def __init__(self, microbatches: Sequence[torch.Tensor | Sequence[torch.Tensor]],
                 images: Sequence[Sequence[int]] | None = None):
        self.inputs: list[Inputs] = [inputs_of(x) for x in microbatches]
        self.images: list[list[int]] | None = None if images is None else [[int(t) for t in x] for x in images]
        """Per microbatch, the tiles of each of its images in order (None: not told); the unit the
        runtime moves between data-parallel replicas."""
        for k, parts in enumerate(self.inputs):
            if not parts or not all(isinstance(t, torch.Tensor) for t in parts):
                raise ValueError(f"batch: microbatch {k} is not a tensor or a tuple of tensors")
            if len({t.shape[0] if t.dim() else -1 for t in parts}) != 1 or parts[0].dim() == 0:
                raise ValueError(f"batch: microbatch {k}'s tensors {[tuple(t.shape) for t in parts]} do not count "
                                 "the same tiles along dim 0")
        self.tiles: list[int] = [int(x[0].shape[0]) for x in self.inputs]
        """Tiles of each microbatch."""

    @classmethod
    def split(cls, x: torch.Tensor | Sequence[torch.Tensor], microbatches: int) -> EncoderBatch:
        """A batch of one fixed shape split into ``microbatches`` along dim 0 (``torch.tensor_split``)."""
        parts = [torch.tensor_split(t, microbatches) for t in inputs_of(x)]
        return cls([tuple(p[k] for p in parts) for k in range(microbatches)])

    @classmethod
    def of(cls, x: EncoderBatch | torch.Tensor | Sequence[torch.Tensor], microbatches: int) -> EncoderBatch:
        """A step's encoder input as it comes: an :class:`EncoderBatch` as it is, one batch of a fixed
        shape split into ``microbatches`` (:meth:`split`)."""
        return x if isinstance(x, EncoderBatch) else cls.split(x, microbatches)

    def __len__(self) -> int:
        return len(self.inputs)

    def to(self, device: torch.device | None, dtype: torch.dtype | None = None) -> EncoderBatch:
        """The batch on ``device`` (None: where it is; its floating tensors in ``dtype``, where given)."""
        return EncoderBatch([cast_inputs(x, device, dtype) for x in self.inputs], self.images)

    def problem(self, example: Inputs, microbatches: int, layout: SlotLayout | None = None) -> str | None:
        """What is wrong with this batch for an encoder traced on ``example`` (one chunk) and a
        schedule of ``microbatches`` (and, when given, the ``layout`` the runtime chose for the
        step's samples); None when nothing is."""
        if len(self) != microbatches:
            return (f"batch: {len(self)} microbatches, the schedule runs {microbatches}"
                    + (" (an empty step)" if not len(self) else ""))
        if self.images is not None and (len(self.images) != len(self)
                                        or [sum(x) for x in self.images] != self.tiles
                                        or any(t < 1 for x in self.images for t in x)):
            return (f"batch: images {self.images} do not count each microbatch's tiles {self.tiles} "
                    "(one count >= 1 per image)")
        for k, x in enumerate(self.inputs):
            if len(x) != len(example):
                return f"batch: microbatch {k} has {len(x)} encoder inputs, the encoder takes {len(example)}"
            for i, (t, e) in enumerate(zip(x, example)):
                if t.shape[1:] != e.shape[1:] or t.dtype != e.dtype:
                    return (f"batch: microbatch {k}'s input {i} has tiles of shape {tuple(t.shape[1:])} "
                            f"({t.dtype}), the encoder's pieces take {tuple(e.shape[1:])} ({e.dtype})")
        if layout is not None and layout.per_chunk is None and self.tiles != layout.slot_tiles:
            return (f"batch: tiles per microbatch {self.tiles}, but the layout lay_out chose ({layout.name!r}) has "
                    f"{layout.slot_tiles}")
        if layout is not None and any(c < f for c, f in zip(self.tiles, layout.fewest_chunks)):
            return (f"batch: chunks per microbatch {self.tiles}, fewer than the layout lay_out chose "
                    f"({layout.name!r}) fills, {layout.fewest_chunks}")
        return None

    def chunk_counts(self, size: int) -> list[int]:
        """Chunks of ``size`` tiles each microbatch runs in."""
        return chunk_counts(self.tiles, size)

    def chunk(self, k: int, c: int, size: int) -> Inputs:
        """Chunk ``c`` of microbatch ``k``: its tiles ``c * size ..`` (``size`` of them, zero tiles
        after the microbatch's last)."""
        out = []
        for t in self.inputs[k]:
            part = t[c * size:(c + 1) * size]
            if part.shape[0] < size:
                part = torch.cat([part, part.new_zeros((size - part.shape[0], *part.shape[1:]))])
            out.append(part)
        return tuple(out)


__all__ = ["EncoderBatch", "Packing", "cast_inputs", "chunk_counts", "inputs_of", "packed_rows"]
