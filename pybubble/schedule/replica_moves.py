"""Encoder work moved between data-parallel replicas before the step starts (numpy and the core,
no torch): images from the replicas with the most encoder seconds to the ones with room, each
output going back to the replica that owns its sample (:func:`balance_replicas`); or tile by tile,
by the chunks each replica runs: :func:`balance_replica_chunks` when each slot's tiles run in
chunks of their own, :func:`balance_replica_stream` when a replica's tiles run as one packed
stream. Every result depends only on its input (ties broken by index), so every rank that gathers
the same tile counts computes the same moves.
"""

from __future__ import annotations

import numpy as np

from .. import _core
from ..config.checks import INT64, index_array, integer, real_array


def balance_replicas(image_cost: np.ndarray, image_owner: np.ndarray, replicas: int,
                     image_slot: np.ndarray | None = None) -> np.ndarray:
    """Moves of encoder work between data-parallel replicas: an int64 array of rows ``(image, from,
    to)``, ``from`` the replica that owns the image's sample (its output goes back there), in the
    order they were decided.

    One greedy pass evens out a load over the replicas: those above the mean, heaviest first, give
    images to the lightest one, the largest image that fits both in what the giver has above the
    mean and in what the taker has below it (else the smallest, if the taker stays below the
    giver) and that the taker may take. With `image_slot` (the LLM slot whose deadline each image
    has), a pass per slot first evens out each slot's encoder seconds, a taker taking only while
    its total stays within the largest total; then a pass over the totals with the images not yet
    moved, a taker taking only while its load in the image's slot stays within that slot's
    largest. So no pass raises the largest total or the largest load of a slot; an image moves at
    most once and only away from its owner; images without cost stay."""
    cost = real_array(image_cost, "image_cost", minimum=0.0)
    r = integer(replicas, "replicas", minimum=1)
    owner = index_array(image_owner, "image_owner", r, cost.shape)
    slot = None if image_slot is None else index_array(image_slot, "image_slot", INT64[1], cost.shape)
    return _core.balance_replicas(cost, owner, r, slot)


def balance_replica_chunks(tiles: np.ndarray, chunk: int) -> np.ndarray:
    """Moves of encoder tiles between data-parallel replicas when the encoder's tiles are
    independent (each tile its own sequence) and each replica runs each LLM slot's tiles in chunks
    of `chunk` (the last one padded, so a chunk costs the same however full): `tiles` is replicas
    x slots, each replica's own tiles per slot; returns int64 rows ``(slot, from, to, tiles)`` in
    the order decided, a moved tile staying in its slot (its output is due at that slot's forward).

    Greedy on the chunks each replica runs: the replica with the most (the lowest index of a tie)
    gives away the tiles of one slot's last chunk (dropping that chunk) when the takers stay below
    what it had: to one replica, or spread over several whose last chunk of that slot has room
    enough (padding the encoder runs anyway). Of the candidate moves, the one that adds the fewest
    chunks to the takers, then leaves the most-loaded taker lowest, then the lowest slot and taker.
    It stops when the replica with the most has no such move. So the most chunks a replica runs
    never rises, tiles move only away from their owner and never into a slot their taker gave
    from, and a step whose padding already hides the imbalance moves nothing."""
    own = _tile_counts(tiles)
    c = integer(chunk, "chunk", minimum=1)
    r, width = own.shape
    load, kept = own.copy(), own.copy()
    chunks = np.ceil(load / c).sum(axis=1)
    gave, took = np.zeros(own.shape, bool), np.zeros(own.shape, bool)
    moves: list[tuple[int, int, int, int]] = []
    while r > 1:
        giver = int(np.argmax(chunks))
        best: tuple | None = None
        for k in range(width):
            n = load[giver, k] - c * (np.ceil(load[giver, k] / c) - 1)  # the tiles of its last chunk
            if load[giver, k] == 0 or took[giver, k] or n > kept[giver, k]:
                continue
            takers = [b for b in range(r) if b != giver and not gave[b, k]]
            room = {b: (-load[b, k]) % c for b in takers}
            added = {b: np.ceil((load[b, k] + n) / c) - np.ceil(load[b, k] / c) for b in takers}
            options = [(added[b], chunks[b] + added[b], k, b, ((b, n),)) for b in takers
                       if chunks[b] + added[b] < chunks[giver]]
            spread, left = [], n
            for b in sorted(takers, key=lambda b: (-room[b], b)):  # padding of several takers
                if left and room[b] and chunks[b] < chunks[giver]:
                    spread.append((b, min(left, room[b])))
                    left -= spread[-1][1]
            if not left and len(spread) > 1:
                options.append((0.0, max(chunks[b] for b, _ in spread), k, spread[0][0], tuple(spread)))
            for o in options:
                if best is None or o[:4] < best[:4]:
                    best = o
        if best is None:
            break
        k = best[2]
        for b, n in best[4]:
            load[giver, k] -= n
            kept[giver, k] -= n
            load[b, k] += n
            chunks[b] = np.ceil(load[b] / c).sum()
            took[b, k] = True
            moves.append((k, giver, b, int(n)))
        chunks[giver] = np.ceil(load[giver] / c).sum()
        gave[giver, k] = True
    return np.array(moves, np.int64).reshape(-1, 4)


def balance_replica_stream(tiles: np.ndarray, chunk: int) -> np.ndarray:
    """Moves of encoder tiles between data-parallel replicas when each replica runs all its tiles
    as one stream in chunks of `chunk` (the slots' tiles packed, only the stream's last chunk
    padded: :func:`pybubble.runtime.batch.packed_rows`): `tiles` is replicas x slots, each
    replica's own tiles per slot; returns int64 rows ``(slot, from, to, tiles)``, a moved tile
    staying in its slot (its output is due at that slot's forward).

    A replica runs ``ceil(its tiles / chunk)`` chunks; the fewest the busiest can run is ``m =
    ceil(all tiles / (replicas * chunk))``. Nothing moves when the busiest runs ``m`` already.
    Else each replica over ``m * chunk`` tiles (in replica order) gives its excess, from its last
    slot backwards (their outputs are due last), to the replicas under it, the one with the most
    room first (ties: the lower index). Only the tiles over the target move: the fewest bytes of
    pixels, outputs and gradients that bring every replica to ``m`` chunks."""
    own = _tile_counts(tiles)
    c = integer(chunk, "chunk", minimum=1)
    load = own.sum(axis=1).astype(np.int64)
    r, width = own.shape
    moves: list[tuple[int, int, int, int]] = []
    if r < 2 or not load.sum():
        return np.zeros((0, 4), np.int64)
    cap = c * -(-int(load.sum()) // (r * c))
    if -(-int(load.max()) // c) * c <= cap:
        return np.zeros((0, 4), np.int64)
    left = own.astype(np.int64).copy()
    for giver in range(r):
        excess = int(load[giver]) - cap
        for k in range(width - 1, -1, -1):
            while excess > 0 and left[giver, k] > 0:
                taker = min((b for b in range(r) if load[b] < cap), key=lambda b: (load[b], b))
                n = min(excess, int(left[giver, k]), cap - int(load[taker]))
                left[giver, k] -= n
                load[giver] -= n
                load[taker] += n
                excess -= n
                moves.append((k, giver, taker, n))
    return np.array(moves, np.int64).reshape(-1, 4)


def _tile_counts(tiles: np.ndarray) -> np.ndarray:
    """`tiles` (replicas x slots) checked: whole tile counts >= 0, as float64."""
    own = real_array(tiles, "tiles", minimum=0.0, ndim=2)
    if not np.array_equal(own, np.round(own)):
        raise ValueError("tiles: expected whole tile counts")
    return own


__all__ = ["balance_replica_chunks", "balance_replica_stream", "balance_replicas"]
