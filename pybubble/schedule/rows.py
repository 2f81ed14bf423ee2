"""Batches of fixed rows (numpy, no torch): every LLM microbatch holds exactly ``rows`` samples,
each one padded sequence. Which sample goes to which microbatch: balanced on the samples' work
(:func:`fill_rows`), or packed so the encoder runs the fewest chunks of tiles (:func:`pack_rows`);
and the candidate layouts of a step, each of those ordered against a bubble profile
(:func:`row_layouts`). Every result depends only on its input (ties broken by index), so every
rank computes the same layout.
"""

from __future__ import annotations

import numpy as np

from ..config.checks import integer, real_array
from .bubble_order import middle_room, order_by_bubbles


def fill_rows(work: np.ndarray, microbatches: int, rows: int) -> np.ndarray:
    """The microbatch of each sample (int64) when every LLM microbatch holds exactly `rows`
    samples (a batch of fixed rows, each sample one padded sequence), balanced on `work` (e.g. the
    samples' tiles): heaviest first into the microbatch with the least work that still has a free
    row (ties: the lower index, so the result is the same on every rank)."""
    w = real_array(work, "work", minimum=0.0)
    m = integer(microbatches, "microbatches", minimum=1)
    r = integer(rows, "rows", minimum=1)
    if w.ndim != 1 or w.size != m * r:
        raise ValueError(f"work: shape {w.shape}, expected ({m * r},): {m} microbatches of {r} rows")
    load, free = np.zeros(m), np.full(m, r)
    out = np.empty(w.size, np.int64)
    for i in np.argsort(-w, kind="stable"):
        k = int(np.argmin(np.where(free > 0, load, np.inf)))
        out[i], load[k], free[k] = k, load[k] + w[i], free[k] - 1
    return out


def pack_rows(tiles: np.ndarray, microbatches: int, rows: int, chunk: int) -> np.ndarray:
    """The microbatch of each sample (int64) when every LLM microbatch holds exactly `rows`
    samples and each microbatch's encoder work runs in chunks of `chunk` tiles (the last one
    padded): the fewest chunks over all microbatches, then the most even loads. From
    :func:`fill_rows` on `tiles` and from the given order (sample i in ``i // rows``), the better
    of two descents: the swap of two samples of different microbatches that lowers
    (chunks, sum of squared loads) the most is made until none does (ties: the lowest pair, so the
    result is the same on every rank). Every chunk saved is a chunk of padding the encoder does not
    run: microbatches whose tiles are just over a multiple of `chunk` give their extra tiles to
    ones just under."""
    t = real_array(tiles, "tiles", minimum=0.0)
    c = integer(chunk, "chunk", minimum=1)
    starts = [fill_rows(t, microbatches, rows), np.arange(t.size, dtype=np.int64) // int(rows)]
    return min((_swap_down(t, start, int(microbatches), c) for start in starts), key=lambda x: x[0])[1]


def _swap_down(t: np.ndarray, out: np.ndarray, m: int, c: int) -> tuple[tuple[float, float], np.ndarray]:
    """:func:`pack_rows`' descent from the assignment `out`: ((chunks, sum of squared loads), the
    assignment it ends at)."""
    out = out.copy()
    load = np.bincount(out, weights=t, minlength=m)
    while t.size > 1:
        # every pair (i, j): i leaves its microbatch a = out[i] for b = out[j], j the other way
        d = t[None, :] - t[:, None]  # what i's microbatch gains: t[j] - t[i]
        a, b = out[:, None], out[None, :]
        la, lb = load[a], load[b]
        chunks = (np.ceil((la + d) / c) + np.ceil((lb - d) / c)) - (np.ceil(la / c) + np.ceil(lb / c))
        squares = (la + d) ** 2 + (lb - d) ** 2 - la ** 2 - lb ** 2
        better = (a != b) & ((chunks < 0) | ((chunks == 0) & (squares < -1e-9)))
        if not better.any():
            break
        key = np.where(better, chunks * (1.0 + np.abs(squares).max()) + squares, np.inf)
        i, j = divmod(int(np.argmin(key)), t.size)
        load[out[i]] += t[j] - t[i]
        load[out[j]] += t[i] - t[j]
        out[i], out[j] = out[j], out[i]
    return (float(np.ceil(load / c).sum()), float((load ** 2).sum())), out


def row_layouts(work: np.ndarray, microbatches: int, rows: int, room: np.ndarray | None = None,
                chunk: int | None = None) -> dict[str, np.ndarray]:
    """Candidate LLM slots of each sample (int64 arrays by name) when every microbatch holds
    exactly `rows` samples: ``given`` (sample i in slot ``i // rows``), then the given and the
    balanced (:func:`fill_rows` on `work`) microbatches each ordered by :func:`order_by_bubbles`
    against :func:`middle_room` (light first and last: ``given_ends``, ``balanced_ends``) and, with
    `room` (one per slot, e.g. :func:`deadline_gaps` of the last plan), against it (``given_room``,
    ``balanced_room``); with `chunk` (the encoder's work runs in chunks of this many of `work`'s
    units, e.g. tiles), the packed microbatches (:func:`pack_rows`) ordered the same two ways
    (``packed_ends``, ``packed_room``). Which is best depends on the step's bubbles: compare their
    predictions (e.g. ``EncoderRuntime.predict``)."""
    w = real_array(work, "work", minimum=0.0)
    m, r = integer(microbatches, "microbatches", minimum=1), integer(rows, "rows", minimum=1)
    given = np.arange(w.size, dtype=np.int64) // r
    out = {"given": given}
    rooms = {"ends": middle_room(m), **({} if room is None else {"room": real_array(room, "room")})}
    bases = [("given", given), ("balanced", fill_rows(w, m, r))]
    if chunk is not None:
        bases.append(("packed", pack_rows(w, m, r, chunk)))
    for name, microbatch in bases:
        load = np.bincount(microbatch, weights=w, minlength=m)
        for kind, profile in rooms.items():
            out[f"{name}_{kind}"] = np.argsort(order_by_bubbles(load, profile))[microbatch]
    return out



__all__ = ["fill_rows", "pack_rows", "row_layouts"]
