"""Which LLM slot (microbatch) each sample of a step runs in, when the samples' encoder work varies:
the layouts :func:`~pybubble.schedule.balance.row_layouts` proposes (as given; the given and the
balanced microbatches and, in chunks, the packed ones, each ordered light first and last or by the
room of the last plan), each priced by the step it would predict, the shortest taken
(:func:`choose_layout`). The result, a :class:`SlotLayout`, says which layout it is and how to lay
the trainer's per-sample inputs out in it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config.checks import integer
from ..schedule.balance import row_layouts

GIVEN = "given"
"""The name of the layout that keeps the samples in their given slots."""


@dataclass(frozen=True, eq=False)
class SlotLayout:
    """One step's samples over the LLM's slots. The samples come in the trainer's order, ``rows``
    per slot: sample i's given slot is ``i // rows``."""

    name: str
    """Which layout (``given``, or a name of :func:`~pybubble.schedule.balance.row_layouts`)."""
    slot: np.ndarray
    """Each sample's slot (int64)."""
    tiles: np.ndarray
    """Each sample's encoder work, in tiles (int64)."""
    slots: int
    """The step's slots (the schedule's microbatches)."""
    per_chunk: int | None = None
    """Packed chunks (native-resolution encoders, :mod:`pybubble.runtime.packed`): ``tiles`` count
    each sample's patches, ``per_chunk`` of them fill one chunk; None: ``tiles`` are tiles."""

    @classmethod
    def as_given(cls, tiles: Sequence[int] | np.ndarray, slots: int, per_chunk: int | None = None) -> SlotLayout:
        """The samples in their given slots."""
        t = _tiles(tiles, slots)
        return cls(name=GIVEN, slot=np.arange(t.size, dtype=np.int64) // (t.size // slots), tiles=t, slots=slots,
                   per_chunk=per_chunk)

    @property
    def rows(self) -> int:
        """Samples per slot."""
        return self.tiles.size // self.slots

    @property
    def order(self) -> np.ndarray:
        """The samples in the order they run: slot by slot, in their given order within one."""
        return np.lexsort((np.arange(self.slot.size), self.slot))

    @property
    def slot_tiles(self) -> list[int]:
        """Tiles per slot, as laid out."""
        return np.bincount(self.slot, weights=self.tiles, minlength=self.slots).astype(int).tolist()

    @property
    def fewest_chunks(self) -> list[int]:
        """Per slot, the fewest chunks its work fills (packed: its patches over a chunk's; else its tiles)."""
        return fewest_chunks(np.asarray(self.slot_tiles), self.per_chunk).tolist()

    @property
    def given_tiles(self) -> list[int]:
        """Tiles per slot, as given."""
        given = np.arange(self.tiles.size) // self.rows
        return np.bincount(given, weights=self.tiles, minlength=self.slots).astype(int).tolist()

    def take(self, per_sample: Sequence[Any]) -> list[Any]:
        """``per_sample`` (one entry per sample, in the given order) in the order the samples run."""
        if len(per_sample) != self.tiles.size:
            raise ValueError(f"per_sample: {len(per_sample)} entries for {self.tiles.size} samples")
        return [per_sample[i] for i in self.order.tolist()]

    def per_slot(self, per_sample: Sequence[Any]) -> list[list[Any]]:
        """``per_sample`` grouped by slot, each slot's in the order its samples run."""
        ran = self.take(per_sample)
        return [ran[k * self.rows:(k + 1) * self.rows] for k in range(self.slots)]


def _tiles(tiles: Sequence[int] | np.ndarray, slots: int) -> np.ndarray:
    """``tiles`` as int64 counts >= 0, as many as ``slots`` times a whole number of rows."""
    t = np.asarray(tiles)
    integer(slots, "slots", minimum=1)
    if t.ndim != 1 or t.dtype.kind not in "iuf" or (t.size and (t.min() < 0 or np.any(t != np.round(t)))):
        raise ValueError(f"tiles: {t.tolist() if t.size < 20 else t.shape} is not one tile count >= 0 per sample")
    if t.size == 0 or t.size % slots:
        raise ValueError(f"tiles: {t.size} samples do not fill {slots} slots with the same rows")
    return t.astype(np.int64)


def fewest_chunks(slot_tiles: np.ndarray, per_chunk: int | None) -> np.ndarray:
    """Per slot, the fewest chunks its ``slot_tiles`` fill (int64): packed chunks (``per_chunk``), its
    patches over a chunk's, rounded up; else its tiles."""
    t = np.asarray(slot_tiles).astype(np.int64)
    return t if per_chunk is None else -(-t // per_chunk)


def choose_layout(tiles: Sequence[int] | np.ndarray, slots: int, predict: Callable[[np.ndarray], float],
                  room: np.ndarray | None = None, chunk_tiles: int | None = None,
                  per_chunk: int | None = None) -> SlotLayout:
    """The layout of :func:`~pybubble.schedule.balance.row_layouts` (samples of ``tiles``, ``slots``
    slots, ``room``: the last plan's room per slot, ``chunk_tiles``: the encoder's chunk) whose step
    ``predict(tiles per slot)`` says is shortest (the first of equals, in row_layouts' order); with
    ``per_chunk`` (packed chunks), ``tiles`` are patches, ``per_chunk`` of them a chunk, and
    ``predict`` takes chunks per slot (the fewest each slot's patches fill)."""
    t = _tiles(tiles, slots)
    layouts = row_layouts(t, slots, t.size // slots, room, per_chunk or chunk_tiles)
    name = min(layouts, key=lambda n: predict(fewest_chunks(np.bincount(layouts[n], weights=t, minlength=slots),
                                                            per_chunk)))
    return SlotLayout(name=name, slot=layouts[name], tiles=t, slots=slots, per_chunk=per_chunk)


__all__ = ["GIVEN", "SlotLayout", "choose_layout", "fewest_chunks"]
