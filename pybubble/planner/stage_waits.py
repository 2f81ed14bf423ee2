"""The bound of a plan of several encoder stages tightened by each stage waiting for the ones after
it (:func:`staged_bound`; times are microseconds).

The fluid bound (:func:`pybubble.planner.bound.step_bound`) holds each encoder stage's forward to
the LLM's deadlines and its backward to the LLM's gradients, as if the other stages took no time.
They do: a piece of microbatch j leaves stage e only to run stages e + 1 .. last, on one rank of
each, and the last must end by j's deadline. A piece of one image of one encoder has the least
compute on every stage (a piece of one encoder waits for its own later stages only, so with several
encoders the least encoder's counts). So every piece of j ends stage e by ``T_e``: walking back from the
deadline stage by stage, the latest start at which the stage's one-image compute fits in its
rank's free time up to the next stage's start (the best rank of each stage; the time before 0 all
free), and its kernels longer than ``theta`` in the windows longer than ``theta`` (a kernel runs
whole in one window; ``theta`` as in :mod:`pybubble.planner.short_windows`). The backward mirrors
it: stage e's backward of j starts after the later stages' one-image backward, walked forward
from j's gradient (the time after the horizon all free). Stage e's fluid conditions then hold at
the shifted times, the work that must come before 0 (or after the horizon) counted in the step's
growth. On the interleaved TP-8 settings the later stages' ranks are busy with short TP gaps at
the deadlines of the steady state: stage 0's deadlines move 12-64 ms earlier on weak_b's PP_enc 4
plan, its gradients 44-336 ms later, and its bound rises 1,449.99 -> 1,508.98 ms (4.1%).
"""

from __future__ import annotations

import numpy as np

from ..llm.timeline import Windows
from ..problem.encoder import EncoderWork
from .bound import EncoderLoad, StepBound


def stage_chains(work: EncoderWork, theta: float | None) -> np.ndarray:
    """``chains[e, phase, x]``: the least compute of a one-image piece of any one encoder on pipeline
    0's lane of encoder stage e, forward and backward: x = 0 in all, 1 in kernels longer than
    `theta` (0 when `theta` is None). Each encoder's piece waits for its own later stages only, so
    with several encoders the least of theirs counts."""
    plan = work.plan
    out = np.full((plan.pp_enc, 2, 2), np.inf)
    for k in range(len(work.images)):
        one = tuple(int(i == k) for i in range(len(work.images)))  # one image of encoder k, none of the others
        t = work.microbatch_tasks(0, one)
        for e in range(plan.pp_enc):
            mine = (t.lane == plan.lane(0, e)) & (t.resource == 0)
            for ph in (0, 1):
                keep = mine & (t.phase == ph)
                out[e, ph, 0] = min(out[e, ph, 0], t.duration[keep].sum())
                out[e, ph, 1] = min(out[e, ph, 1], 0.0 if theta is None else t.duration[keep & (t.duration > theta)].sum())
    return out


def latest_starts(windows: Windows, rank: int, work: float, deadlines: np.ndarray) -> np.ndarray:
    """For each deadline D, the latest T with `work` of `rank`'s free time in [T, D] (before 0: all
    of it free, so T may be negative)."""
    lo, hi = int(windows.offset[rank]), int(windows.offset[rank + 1])
    start, end = windows.start[lo:hi], windows.end[lo:hi]
    d = np.asarray(deadlines, np.float64)
    if work <= 0.0:
        return d.copy()
    before = windows.free_before(np.clip(d, 0.0, None))[rank]
    need = before - work  # free time before T, at most
    cum = np.concatenate([[0.0], np.cumsum(end - start)])
    out = np.minimum(need, 0.0)  # before 0 when the free time after 0 falls short
    inside = (need >= 0) & (len(start) > 0)
    i = np.clip(np.searchsorted(cum, need[inside], side="right") - 1, 0, max(len(start) - 1, 0))
    at = start[i] + (need[inside] - cum[i])
    # at a window's end (to rounding) the free time stays the same up to the next window's start
    nxt = np.where(i + 1 < len(start), start[np.minimum(i + 1, max(len(start) - 1, 0))], np.inf)
    out[inside] = np.where(at >= end[i] - 1e-6, nxt, at)
    return np.minimum(out, d)


def earliest_ends(windows: Windows, rank: int, work: float, ready: np.ndarray, horizon: float) -> np.ndarray:
    """For each time R, the earliest U with `work` of `rank`'s free time in [R, U] (after the
    horizon: all of it free)."""
    lo, hi = int(windows.offset[rank]), int(windows.offset[rank + 1])
    start, end = windows.start[lo:hi], windows.end[lo:hi]
    r = np.asarray(ready, np.float64)
    if work <= 0.0:
        return r.copy()
    cum = np.concatenate([[0.0], np.cumsum(end - start)])
    target = windows.free_before(np.clip(r, 0.0, horizon))[rank] + work
    out = np.maximum(r, horizon) + np.maximum(target - cum[-1], 0.0)  # after the horizon when the step falls short
    inside = target <= cum[-1] + 1e-6  # free_before and this sum may differ in the last bits
    i = np.clip(np.searchsorted(cum, target[inside], side="left") - 1, 0, max(len(start) - 1, 0))
    out[inside] = start[i] + (target[inside] - cum[i]) if len(start) else r[inside]
    return np.maximum(out, r)


def staged_bound(bound: StepBound, load: EncoderLoad, chains: np.ndarray, windows: Windows, long_: Windows,
                 forward_needed: np.ndarray, grad_ready: np.ndarray, gpus_per_rank: int) -> StepBound:
    """`bound` with each encoder stage's fluid front and back at the times the later stages leave it
    (see the module docstring): `load` the plan's (:func:`~pybubble.planner.bound.encoder_load`),
    `chains` from :func:`stage_chains`, `windows` the LLM ranks' compute-free windows and `long_`
    those longer than the chains' ``theta`` (the same windows when there is none)."""
    stages, g = chains.shape[0], gpus_per_rank
    r = windows.lanes // stages
    horizon = bound.horizon
    need, ready = np.sort(forward_needed), np.sort(grad_ready)[::-1]
    fwd, bwd = np.cumsum(np.sort(load.forward)), np.cumsum(np.sort(load.backward))
    free = windows.free_time()
    front, back = bound.front, bound.back
    late, early = need.copy(), ready.copy()  # the times stage e must end by / may start from
    for e in range(stages - 1, -1, -1):
        ranks = np.arange(e * r, (e + 1) * r)
        if e < stages - 1:  # stage e + 1's one-image piece between stage e and the deadline
            late = np.max([np.minimum(latest_starts(windows, k, chains[e + 1, 0, 0], late),
                                      latest_starts(long_, k, chains[e + 1, 0, 1], late))
                           for k in range((e + 1) * r, (e + 2) * r)], axis=0)
            early = np.min([np.maximum(earliest_ends(windows, k, chains[e + 1, 1, 0], early, horizon),
                                       earliest_ends(long_, k, chains[e + 1, 1, 1], early, horizon))
                            for k in range((e + 1) * r, (e + 2) * r)], axis=0)
        before = windows.free_before(np.clip(late, 0.0, horizon))[ranks].sum(axis=0)
        after = (free[ranks, None] - windows.free_before(np.clip(early, 0.0, horizon))[ranks]).sum(axis=0)
        share_f, share_b = load.stage_forward[e], load.stage_backward[e]
        if len(fwd):
            front = max(front, float(((fwd * share_f - g * before) / (g * r) - np.minimum(late, 0.0)).max()))
        if len(bwd) and bwd[-1] > 0:
            back = max(back, float(((bwd * share_b - g * after) / (g * r) + np.maximum(early - horizon, 0.0)).max()))
    return StepBound(step_time=horizon + max(front + back, bound.work), horizon=horizon, front=front, back=back,
                     work=bound.work)


__all__ = ["earliest_ends", "latest_starts", "stage_chains", "staged_bound"]
