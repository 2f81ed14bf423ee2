"""Balancing data whose cost changes every batch, before the step starts (numpy and the core, no
torch):

- over the microbatches of one replica (DFLOP's online step): split the samples so that no
  microbatch is much heavier than the rest in either the encoder or the LLM
  (:func:`balance_microbatches`), within the LLM's fixed sequence length (:func:`pack_microbatches`),
  then order the microbatches so the encoder-heavy ones meet the largest bubbles
  (:func:`order_by_bubbles`; light ones first and last: :func:`middle_room`), in
  :mod:`~pybubble.schedule.bubble_order`; batches of fixed rows in :mod:`~pybubble.schedule.rows`
  (:func:`fill_rows`, :func:`pack_rows`, :func:`row_layouts`);
- over data-parallel replicas: move images' encoder work from the replicas with the most to the
  ones with room, each output going back to the replica that owns its sample
  (:func:`balance_replicas`; tile by tile, by the chunks each replica runs: :func:`balance_replica_chunks`
  when each slot's tiles run in chunks of their own, :func:`balance_replica_stream` when a replica's
  tiles run as one packed stream), in :mod:`~pybubble.schedule.replica_moves`;
- both for one step, as one JSON-ready result (:func:`balance_step`, :class:`StepBalance`).

The encoder's cost per image is :class:`EncoderCost` (``a*tiles^2 + b*tiles + c``) or any costs the
caller measured. Every result depends only on its input (ties broken by index), so every rank that
gathers the same tile counts computes the same plan. Every public name of those modules is
importable from here too.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..config.checks import finite, index_array, integer, real_array
from .bubble_order import deadline_gaps, middle_room, order_by_bubbles
from .replica_moves import balance_replica_chunks, balance_replica_stream, balance_replicas
from .rows import fill_rows, pack_rows, row_layouts

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
    sample = index_array(image_sample, "image_sample", n, cost.shape)
    own = index_array(owner, "owner", r, t.shape)
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


__all__ = ["STEP_BALANCE_FORMAT", "EncoderCost", "StepBalance", "balance_microbatches", "balance_replica_chunks",
           "balance_replica_stream", "balance_replicas", "balance_step", "deadline_gaps", "fill_rows", "lower_bound",
           "max_microbatch_cost", "middle_room", "order_by_bubbles", "pack_microbatches", "pack_rows", "row_layouts"]
