"""What samples cost: each sample's encoder and LLM time from the cost model, the microbatches'
loads, and the orders to run microbatches in by their encoder work."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..config.checks import integer
from ..config.models import EncoderConfig, LLMConfig
from ..costs.roofline import CostModel
from ..data.workloads import Batch
from ..schedule.balance import middle_room, order_by_bubbles


def microbatch_loads(cost: np.ndarray, microbatches: int, assignment: np.ndarray | None = None) -> np.ndarray:
    """Per microbatch, the summed `cost` of its samples (one cost per sample). Without `assignment`
    the samples fill the microbatches in order, in equal groups (a data loader's split); with it,
    sample i goes to microbatch ``assignment[i]`` (e.g. from balance_microbatches)."""
    c = np.asarray(cost, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"cost: shape {c.shape} is not one cost per sample")
    integer(microbatches, "microbatches", minimum=1)
    if assignment is None:
        if c.size % microbatches:
            raise ValueError(f"microbatches: {c.size} samples do not split into {microbatches} equal groups")
        return c.reshape(microbatches, -1).sum(axis=1)
    a = np.asarray(assignment)
    if a.shape != c.shape or (a.size and (a.min() < 0 or a.max() >= microbatches)):
        raise ValueError(f"assignment: shape {a.shape} or values outside [0, {microbatches}) for {c.size} samples")
    return np.bincount(a, weights=c, minlength=microbatches)


WORK_ORDERS = ("light_ends", "heavy_ends", "ascending", "descending")
"""The orders of microbatches by encoder work that :func:`work_orders` gives."""


def work_orders(loads: np.ndarray) -> dict[str, np.ndarray]:
    """Orders to run microbatches in, by their encoder `loads` (``order[k]``: the microbatch that feeds
    LLM microbatch k), one per :data:`WORK_ORDERS`: the light ones first and last and the heavy ones
    in the middle (:func:`~pybubble.schedule.balance.order_by_bubbles` against
    :func:`~pybubble.schedule.balance.middle_room`), its reverse (the heavy ones at the ends), and
    sorted up and down. Which one gives the shortest step depends on the plan: a whole microbatch
    loads one pipeline's lanes, a spread one all of them, so the heavy ones belong where the plan has
    the most room around them."""
    c = np.asarray(loads, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"loads: shape {c.shape} is not one load per microbatch")
    room = middle_room(len(c)) if len(c) else np.zeros(0)
    return {"light_ends": order_by_bubbles(c, room), "heavy_ends": order_by_bubbles(-c, room),
            "ascending": np.argsort(c, kind="stable"), "descending": np.argsort(-c, kind="stable")}


def encoder_time(encoder: EncoderConfig, tokens: int, costs: CostModel, *, tp: int = 1, frozen: bool = False,
                 recompute: str = "none") -> float:
    """The encoder's time on one image of `tokens` tokens (us): all layers, forward plus backward
    unless frozen; the backward holds the recomputed forward work of `recompute`."""
    t = costs.layer_time(encoder, 1, tokens, tp=tp, phase="fwd")
    if not frozen:
        t += costs.layer_time(encoder, 1, tokens, tp=tp, phase="bwd", recompute=recompute)
    return encoder.layers * t


def image_costs(samples, encoders, costs: CostModel, *, recompute: str = "none") -> np.ndarray:
    """Each image's encoder time (us) of `samples` (a :class:`~pybubble.data.samples.Samples`), summed
    over `encoders` (the config's, each with its ``model`` and ``frozen``): a tile is one image of
    the first encoder's ``tokens`` (tiles run one by one, InternVL-style); a native-resolution image
    (with ``grids``) is one sequence of its own patches, so its attention grows faster than its area."""
    @lru_cache(maxsize=None)
    def image(tokens: int) -> float:
        return sum(encoder_time(e.model, tokens, costs, frozen=e.frozen, recompute=recompute) for e in encoders)

    if samples.grids is None:
        return samples.tiles * image(encoders[0].model.tokens)
    return np.array([image(int(p)) for p in samples.grids.prod(axis=1)], dtype=np.float64)


def llm_time(llm: LLMConfig, tokens: int, costs: CostModel, *, tp: int = 1, recompute: str = "none") -> float:
    """The LLM's time on one sequence of `tokens` tokens (us): all layers, forward plus backward."""
    return llm.layers * (costs.layer_time(llm, 1, tokens, tp=tp, phase="fwd")
                         + costs.layer_time(llm, 1, tokens, tp=tp, phase="bwd", recompute=recompute))


def sample_costs(batch: Batch, *, encoder: EncoderConfig, llm: LLMConfig, costs: CostModel,
                 encoder_tp: int = 1, llm_tp: int = 1, frozen: bool = False, recompute: str = "none") -> np.ndarray:
    """N x 2 array: each sample's encoder time (all layers, forward + backward unless frozen, each
    image at its own length) and LLM time (all layers, forward + backward), in microseconds; the
    backwards hold the recomputed forward work of `recompute`."""

    @lru_cache(maxsize=None)
    def enc(tokens: int) -> float:
        return encoder_time(encoder, tokens, costs, tp=encoder_tp, frozen=frozen, recompute=recompute)

    @lru_cache(maxsize=None)
    def lm(tokens: int) -> float:
        return llm_time(llm, tokens, costs, tp=llm_tp, recompute=recompute)

    out = np.empty((len(batch.image_tokens), 2))
    for i, tokens in enumerate(batch.image_tokens):
        out[i, 0] = sum(enc(int(t)) for t in tokens)
        out[i, 1] = lm(int(batch.llm_tokens[i]))
    return out
