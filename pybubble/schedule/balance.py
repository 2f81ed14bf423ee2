"""Microbatch balancing for data whose cost changes every batch (DFLOP's online step): split the
samples so that no microbatch is much heavier than the rest in either the encoder or the LLM, then
order the microbatches so the encoder-heavy ones meet the largest bubbles."""

from __future__ import annotations

import numpy as np

from .. import _core


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
    microbatch to run in slot s: the heaviest microbatch meets the largest bubble, and so on."""
    load = np.asarray(encoder_load, dtype=np.float64)
    room = np.asarray(bubble, dtype=np.float64)
    if load.ndim != 1 or room.shape != load.shape:
        raise ValueError(f"bubble: shape {room.shape} does not match encoder_load {load.shape}")
    order = np.empty(load.size, np.int64)
    order[np.argsort(-room, kind="stable")] = np.argsort(-load, kind="stable")
    return order
