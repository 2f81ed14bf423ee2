"""The order of one replica's microbatches against the step's bubbles (numpy, no torch): a bubble
profile gives each LLM slot the idle time the encoder has for it (:func:`middle_room`, light
microbatches first and last; :func:`deadline_gaps`, from a step's deadlines), and
:func:`order_by_bubbles` puts the encoder-heavy microbatches in the slots with the most room. Ties
are broken by index, so every rank computes the same order.
"""

from __future__ import annotations

import numpy as np

from ..config.checks import integer
from ..problem.problem import Problem


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



__all__ = ["deadline_gaps", "middle_room", "order_by_bubbles"]
