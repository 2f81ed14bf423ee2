"""Balancing data whose cost changes every batch, before the step starts (numpy and the core, no
torch):

- over the microbatches of one replica (DFLOP's online step): split the samples so that no
  microbatch is much heavier than the rest in either the encoder or the LLM
  (:func:`balance_microbatches`), within the LLM's fixed sequence length (:func:`pack_microbatches`),
  then order the microbatches so the encoder-heavy ones meet the largest bubbles
  (:func:`order_by_bubbles`; light ones first and last: :func:`middle_room`);
- over data-parallel replicas: move images' encoder work from the replicas with the most to the
  ones with room, each output going back to the replica that owns its sample
  (:func:`balance_replicas`; tile by tile, by the chunks each replica runs: :func:`balance_replica_chunks`
  when each slot's tiles run in chunks of their own, :func:`balance_replica_stream` when a replica's
  tiles run as one packed stream);
- both for one step, as one JSON-ready result (:func:`balance_step`, :class:`StepBalance`).

The encoder's cost per image is :class:`EncoderCost` (``a*tiles^2 + b*tiles + c``) or any costs the
caller measured. Every result depends only on its input (ties broken by index), so every rank that
gathers the same tile counts computes the same plan.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..config.checks import INT64, finite, integer, real_array
from ..problem.problem import Problem

STEP_BALANCE_FORMAT = "pybubble.step_balance/1"
"""The format key of a :class:`StepBalance` document."""


def balance_microbatches(costs: np.ndarray, num_microbatches: int) -> np.ndarray:
    """Assigns samples to microbatches: ``costs`` is N x 2 (encoder cost, LLM cost per sample);
    returns an int64 array of N microbatch indices in [0, num_microbatches), every microbatch
    non-empty, keeping the largest per-microbatch cost of either part close to its lower bound
    (:func:`lower_bound`). Runs in the C++ core, which refuses lossy dtypes (ValueError)."""
    return _core.balance_microbatches(costs, num_microbatches)


def lower_bound(costs: np.ndarray, num_microbatches: int) -> float:
    """No assignment can do better: max(each part's total / num_microbatches, the largest cost)."""
    return _core.balance_lower_bound(costs, num_microbatches)


def max_microbatch_cost(costs: np.ndarray, assignment: np.ndarray, num_microbatches: int) -> float:
    """The largest per-microbatch summed cost of either part under `assignment`."""
    return _core.max_microbatch_cost(costs, assignment, num_microbatches)


def order_by_bubbles(encoder_load: np.ndarray, bubble: np.ndarray) -> np.ndarray:
    """Bubble-aware order: ``encoder_load[k]`` is microbatch k's encoder cost, ``bubble[s]`` the
    idle time available to the encoder before LLM slot s. Returns ``order`` with ``order[s]`` the
    microbatch to run in slot s: the heaviest microbatch meets the largest bubble, and so on (ties
    by index). A 2-D `encoder_load` (one row per replica) is ordered row by row, against one
    `bubble` profile for all rows or one row each."""
    load = np.asarray(encoder_load, dtype=np.float64)
    room = np.asarray(bubble, dtype=np.float64)
    if load.ndim not in (1, 2) or room.ndim > load.ndim or room.shape[-1:] != load.shape[-1:] \
            or (room.ndim == 2 and room.shape != load.shape):
        raise ValueError(f"bubble: shape {room.shape} does not match encoder_load {load.shape}")
    slots = np.broadcast_to(np.argsort(-room, axis=-1, kind="stable"), load.shape)
    order = np.empty(load.shape, np.int64)
    np.put_along_axis(order, slots, np.argsort(-load, axis=-1, kind="stable"), axis=-1)
    return order


def middle_room(microbatches: int) -> np.ndarray:
    """A bubble profile for :func:`order_by_bubbles` that puts light microbatches first and last
    and heavy ones in the middle: slot s has room ``min(s, microbatches - 1 - s)``. In a pipeline
    step the first microbatch's encoder forward runs before the LLM can start and the last one's
    backward after it ends, while the middle ones meet the warm-up, steady and cool-down bubbles."""
    m = integer(microbatches, "microbatches", minimum=1)
    s = np.arange(m, dtype=np.float64)
    return np.minimum(s, m - 1 - s)


def deadline_gaps(problem: Problem) -> np.ndarray:
    """A bubble profile for :func:`order_by_bubbles` from a step's deadlines: for LLM slot k, the
    time from slot k-1's forward deadline to slot k's (from 0 for the first) plus the time from
    slot k's gradient to slot k+1's (to the step's end for the last): the room the encoder has
    for that slot's forward before it and its backward after it."""
    a = problem.arrays()
    need, ready = np.asarray(a.forward_needed, np.float64), np.asarray(a.grad_ready, np.float64)
    return np.diff(need, prepend=0.0) + np.diff(ready, append=max(problem.horizon, float(ready.max(initial=0.0))))


@dataclass(kw_only=True, slots=True, frozen=True)
class EncoderCost:
    """The encoder's seconds on one image of `tiles` tiles: ``a*tiles^2 + b*tiles + c`` (the form
    LoongForge fits to its ViT during warm-up: attention grows with the square of an image's
    length, the rest with its length, plus a fixed cost per image). With tiles that the encoder
    runs one by one (InternVL), ``a`` is 0."""

    a: float = 0.0
    """Seconds per tile squared."""
    b: float = 1.0
    """Seconds per tile."""
    c: float = 0.0
    """Seconds per image."""

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            finite(getattr(self, name), name, minimum=0.0)

    def __call__(self, tiles: np.ndarray) -> np.ndarray:
        """Seconds of each image of ``tiles[i]`` tiles (float64)."""
        t = np.asarray(tiles, dtype=np.float64)
        return (self.a * t + self.b) * t + self.c

    @classmethod
    def fit(cls, tiles: np.ndarray, seconds: np.ndarray) -> "EncoderCost":
        """Least squares over measured images (`tiles`, `seconds`), every coefficient >= 0: of the
        fits on each subset of the three terms whose coefficients come out non-negative, the one
        with the smallest residual."""
        t = real_array(tiles, "tiles", minimum=0.0)
        y = real_array(seconds, "seconds", minimum=0.0)
        if t.shape != y.shape or t.size == 0:
            raise ValueError(f"seconds: shape {y.shape} does not match tiles {t.shape} (or no measurements)")
        columns = np.stack([t * t, t, np.ones_like(t)], axis=1)
        best, best_residual = (0.0, 0.0, 0.0), float(y @ y)
        for keep in itertools.chain.from_iterable(itertools.combinations(range(3), k) for k in (1, 2, 3)):
            x = np.linalg.lstsq(columns[:, keep], y, rcond=None)[0]
            if (x < 0).any():
                continue
            r = y - columns[:, keep] @ x
            if float(r @ r) < best_residual * (1 - 1e-12):
                coef = [0.0, 0.0, 0.0]
                for k, v in zip(keep, x):
                    coef[k] = float(v)
                best, best_residual = tuple(coef), float(r @ r)
        return cls(a=best[0], b=best[1], c=best[2])


def pack_microbatches(tokens: np.ndarray, microbatches: int, sequence_length: int | None = None, *,
                      encoder: np.ndarray | None = None) -> np.ndarray:
    """The LLM microbatch of each sample (int64 in [0, microbatches)), so that the LLM's shapes stay
    fixed: each microbatch's tokens fit in one packed sequence of `sequence_length` (None: no
    limit). The samples are balanced on their encoder work (`encoder`, default their tokens) and
    their tokens together, each part scaled by its mean (:func:`balance_microbatches`); when that
    overfills a sequence, they are packed by tokens alone, largest first into the emptiest
    microbatch. With fewer samples than microbatches, sample i goes to microbatch i (the rest are
    padding). Refuses a sample that does not fit in one sequence, and samples that do not pack."""
    t = _tokens(tokens)
    m = integer(microbatches, "microbatches", minimum=1)
    limit = _fits(t, sequence_length)
    work = t.astype(np.float64) if encoder is None else real_array(encoder, "encoder", minimum=0.0)
    if work.shape != t.shape:
        raise ValueError(f"encoder: shape {work.shape} does not match tokens {t.shape}")
    return _pack(t, _parts(work, t), m, limit)


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


def _tokens(values: Any) -> np.ndarray:
    """`values` as one int64 token count >= 0 per sample."""
    t = np.asarray(values)
    if t.ndim != 1 or (t.size and (t.dtype.kind not in "iu" or t.min() < 0)):
        raise ValueError(f"tokens: expected one integer >= 0 per sample, got {t.dtype} of shape {t.shape}")
    return t.astype(np.int64)


def _parts(work: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """N x 2: each sample's encoder work and tokens, each part over its mean (scale-free)."""
    parts = np.empty((tokens.size, 2))
    parts[:, 0], parts[:, 1] = work, tokens
    mean = parts.mean(axis=0) if tokens.size else np.ones(2)
    return parts / np.where(mean > 0, mean, 1.0)


def _pack(tokens: np.ndarray, parts: np.ndarray, microbatches: int, limit: int | None,
          where: str = "tokens") -> np.ndarray:
    """:func:`pack_microbatches` on checked input (`where` names the samples in an error)."""
    if tokens.size <= microbatches:
        return np.arange(tokens.size, dtype=np.int64)
    assignment = _core.balance_microbatches(parts, microbatches)
    if limit is not None and np.bincount(assignment, weights=tokens, minlength=microbatches).max() > limit:
        assignment = _pack_by_tokens(tokens, microbatches, limit, where)
    return assignment


def _fits(tokens: np.ndarray, sequence_length: int | None) -> int | None:
    """`sequence_length` checked, after a ValueError naming the first sample longer than it."""
    if sequence_length is None:
        return None
    limit = integer(sequence_length, "sequence_length", minimum=1)
    if tokens.size and tokens.max() > limit:
        i = int(np.argmax(tokens > limit))
        raise ValueError(f"tokens[{i}]: a sample of {int(tokens[i])} tokens does not fit in one sequence of {limit}")
    return limit


def _pack_by_tokens(tokens: np.ndarray, microbatches: int, limit: int, where: str) -> np.ndarray:
    """Largest sample first into the microbatch with the fewest tokens (worst-fit decreasing)."""
    out = np.empty(tokens.size, np.int64)
    heap = [(0, k) for k in range(microbatches)]
    for i in np.argsort(-tokens, kind="stable").tolist():
        used, k = heap[0]
        if used + int(tokens[i]) > limit:
            raise ValueError(f"{where}: {int(tokens.sum())} tokens in {tokens.size} samples do not pack into "
                             f"{microbatches} sequences of {limit} (largest first into the emptiest)")
        heapq.heapreplace(heap, (used + int(tokens[i]), k))
        out[i] = k
    return out


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
    owner = _indices(image_owner, "image_owner", r, cost.shape)
    slot = None if image_slot is None else _indices(image_slot, "image_slot", INT64[1], cost.shape)
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
    own = real_array(tiles, "tiles", minimum=0.0, ndim=2)
    if not np.array_equal(own, np.round(own)):
        raise ValueError("tiles: expected whole tile counts")
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
    own = real_array(tiles, "tiles", minimum=0.0, ndim=2)
    if not np.array_equal(own, np.round(own)):
        raise ValueError("tiles: expected whole tile counts")
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


def _indices(values: Any, where: str, bound: int, shape: tuple[int, ...]) -> np.ndarray:
    """`values` as an int64 array of `shape` with entries in [0, bound)."""
    a = np.asarray(values)
    if a.shape != shape or (a.size and (a.dtype.kind not in "iu" or a.min() < 0 or a.max() >= bound)):
        raise ValueError(f"{where}: expected {shape} integers in [0, {bound}), got {a.dtype} of shape {a.shape}")
    return a.astype(np.int64)


@dataclass(kw_only=True, slots=True)
class StepBalance:
    """One step's data balanced over the LLM's microbatches and the data-parallel replicas
    (:func:`balance_step`). Samples and images are indexed as in the step's input."""

    microbatch: np.ndarray
    """The microbatch (of its owner's packing) of each sample."""
    order: np.ndarray
    """replicas x microbatches: ``order[r, s]`` the microbatch replica r runs in LLM slot s (a
    permutation per row, by the bubble profile)."""
    moves: np.ndarray
    """Rows ``(image, from, to)``: image's encoder work runs on replica ``to``, its output goes
    back to ``from``, the replica that owns its sample (an all-to-all each way)."""
    runs_on: np.ndarray
    """The replica that runs each image's encoder work."""
    slot: np.ndarray
    """The LLM slot of each image: the slot of its sample's microbatch on its owner (where its
    output is needed, whichever replica computes it)."""
    encoder_before: np.ndarray
    """Encoder seconds of each replica on its own images."""
    encoder_after: np.ndarray
    """Encoder seconds of each replica after the moves."""
    slot_load: np.ndarray
    """replicas x microbatches: encoder seconds each replica runs for each LLM slot, after the
    moves."""

    @staticmethod
    def _imbalance(load: np.ndarray) -> float:
        mean = float(load.mean()) if load.size else 0.0
        return float(load.max()) / mean if mean > 0 else 1.0

    @property
    def imbalance_before(self) -> float:
        """The replicas' largest over mean encoder seconds before balancing (1 when even)."""
        return self._imbalance(self.encoder_before)

    @property
    def imbalance_after(self) -> float:
        """The replicas' largest over mean encoder seconds after balancing."""
        return self._imbalance(self.encoder_after)

    def to_dict(self) -> dict[str, Any]:
        """The balance as a pybubble.step_balance/1 document (plain JSON types)."""
        return {"format": STEP_BALANCE_FORMAT, "replicas": int(self.order.shape[0]),
                "microbatches": int(self.order.shape[1]),
                "imbalance_before": self.imbalance_before, "imbalance_after": self.imbalance_after,
                "microbatch": self.microbatch.tolist(), "order": self.order.tolist(),
                "moves": self.moves.tolist(), "slot": self.slot.tolist(),
                "encoder_before": self.encoder_before.tolist(), "encoder_after": self.encoder_after.tolist(),
                "slot_load": self.slot_load.tolist()}


def balance_step(image_cost: np.ndarray, image_sample: np.ndarray, tokens: np.ndarray, owner: np.ndarray, *,
                 replicas: int, microbatches: int, sequence_length: int | None = None,
                 bubble: np.ndarray | None = None) -> StepBalance:
    """One step, before it starts: each replica's samples (``owner[i]`` the replica of sample i)
    packed into its `microbatches` (:func:`pack_microbatches` on `tokens` and the samples' encoder
    seconds), its microbatches ordered by :func:`order_by_bubbles` against `bubble` (one room per
    LLM slot; by default :func:`middle_room`, light first and last; :func:`deadline_gaps` gives one
    from the step's problem), then images' encoder work moved between replicas
    (:func:`balance_replicas`, by slot). ``image_cost[j]`` is the encoder seconds of image j, which
    belongs to sample ``image_sample[j]`` (e.g. :class:`EncoderCost` on its tiles)."""
    r = integer(replicas, "replicas", minimum=1)
    m = integer(microbatches, "microbatches", minimum=1)
    cost = real_array(image_cost, "image_cost", minimum=0.0)
    t = _tokens(tokens)
    n = t.size
    sequence_length = _fits(t, sequence_length)
    sample = _indices(image_sample, "image_sample", n, cost.shape)
    own = _indices(owner, "owner", r, t.shape)
    work = np.bincount(sample, weights=cost, minlength=n)
    microbatch = np.empty(n, np.int64)
    by_owner = np.argsort(own, kind="stable")
    bounds = np.searchsorted(own[by_owner], np.arange(r + 1)).tolist()
    t_sorted, parts = t[by_owner], _parts(work, t)[by_owner]
    for k in range(r):
        lo, hi = bounds[k], bounds[k + 1]
        microbatch[by_owner[lo:hi]] = _pack(t_sorted[lo:hi], parts[lo:hi], m, sequence_length,
                                            f"tokens (replica {k})")
    load = np.bincount(own * m + microbatch, weights=work, minlength=r * m).reshape(r, m)
    room = middle_room(m) if bubble is None else real_array(bubble, "bubble")
    if room.shape != (m,):
        raise ValueError(f"bubble: shape {room.shape}, expected ({m},): one room per microbatch")
    order = order_by_bubbles(load, room)
    slot_of = np.empty((r, m), np.int64)
    np.put_along_axis(slot_of, order, np.broadcast_to(np.arange(m), (r, m)), axis=1)
    image_owner = own[sample]
    slot = slot_of[image_owner, microbatch[sample]]
    moves = balance_replicas(cost, image_owner, r, slot)
    runs_on = image_owner.copy()
    runs_on[moves[:, 0]] = moves[:, 2]
    return StepBalance(microbatch=microbatch, order=order, moves=moves, runs_on=runs_on, slot=slot,
                       encoder_before=np.bincount(image_owner, weights=cost, minlength=r),
                       encoder_after=np.bincount(runs_on, weights=cost, minlength=r),
                       slot_load=np.bincount(runs_on * m + slot, weights=cost, minlength=r * m).reshape(r, m))
