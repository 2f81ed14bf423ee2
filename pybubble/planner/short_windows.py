"""The whole-image bound tightened by the windows shorter than the encoder's long kernels
(:func:`short_window_bound`; times are microseconds).

The fluid and whole-image bounds (:mod:`pybubble.planner.bound`) count every compute-free window of
a lane as usable. Many are not: the LLM's tensor-parallel collectives leave windows of tens of
microseconds (88.9 us on the A100 setting's TP 2 ranks, 640 of them per lane in the steady state,
57 ms of its 196 ms of free time), and a kernel runs whole in one window. Take a length ``theta``:
a window no longer than it is *short*, a kernel no longer than it is *short*. Then, in any schedule:

- a long kernel never runs in a short window;
- between two long windows (a *stretch*), a piece runs only short kernels, and those of its chain
  (its *spine*: the dependency path from its phase's last task back to its first) one after another
  with no long kernel between them: at most the longest run of short spine kernels per stretch
  (``run``), plus the short kernels off the spine (``off``: the weight gradients that hang off it),
  once in all. So a piece of k images uses at most ``usable(k) = min(short(k), S * run(k) + off(k))``
  of the short windows, S the lane's stretches, and no more than their free time in all.

A lane's pieces of the microbatches counted (the conditions of the whole-image bound, before a
deadline or after a gradient) cost ``A = sum c(k_i)`` and need ``B = sum (c(k_i) - usable(k_i))``
of long windows or time outside the step: the step grows at least by ``max(A - F, B - F_long)`` (F
the lane's free time, F_long that of its long windows), hence by ``lam (A - F) + (1 - lam) (B -
F_long)`` for every lam in [0, 1], whose least over the splits of the lane's images into pieces is a
least-cost split (:func:`pybubble.planner.bound.least_costs`'s recursion on the combined costs). A
one-image piece of ViT-3B on an A100 has no kernel over 48 us and uses short windows freely, but
costs 8.75 ms forward against 7.18 ms per image in a piece of 16: the lanes that hold images must
pay that, which the whole-image bound lets them skip. ``theta`` is the longest window shorter than
the longest kernel of a microbatch's whole piece (no window is short otherwise); S the most
stretches any of the stage's lanes has in the step (a piece has at most as many in any part of it).
"""

from __future__ import annotations

import numpy as np

from ..llm.timeline import Windows
from ..problem.arrays import Tasks
from ..problem.encoder import EncoderWork
from .bound import StepBound, image_piece_tasks, least_growth, least_splits

LAMBDAS = np.linspace(0.0, 1.0, 11)
"""The multipliers lam tried; each gives a valid bound, the largest is kept per lane and count."""


def short_theta(work: EncoderWork, windows: Windows) -> float | None:
    """The longest of `windows` shorter than the longest compute kernel of a microbatch's whole
    piece on pipeline 0; None when there is none (no window is too short for a kernel)."""
    t = work.microbatch_tasks(0)
    longest = float(t.duration[t.resource == 0].max(initial=0.0))
    lengths = windows.end - windows.start
    short = lengths[lengths < longest]
    return float(short.max()) if len(short) else None


def piece_runs(work: EncoderWork, theta: float, tasks: list[Tasks] | None = None) -> np.ndarray:
    """``runs[e, phase, x, k]`` for a piece of k images on pipeline 0 (k = 0 .. a microbatch's
    images), on encoder stage e's lane: x = 0 its compute kernels no longer than `theta` (us, in
    all), 1 the longest run of them along its spine with no longer kernel of the lane between, 2
    those off its spine (see the module docstring). One encoder; `tasks`:
    :func:`~pybubble.planner.bound.image_piece_tasks` of `work`, when known."""
    plan, n = work.plan, work.images[0]
    lanes = [plan.lane(0, e) for e in range(plan.pp_enc)]
    runs = np.zeros((plan.pp_enc, 2, 3, n + 1))
    shape, spine = None, np.zeros(0, bool)
    for k, t in enumerate(tasks if tasks is not None else image_piece_tasks(work), start=1):
        if shape is None or not all(np.array_equal(a, b) for a, b in zip(shape, (t.after_offset, t.after, t.phase))):
            shape = (t.after_offset, t.after, t.phase)  # the same graph for every image count: its spine once
            spine = _path_to_last(t, 0) | _path_to_last(t, 1)
        for e, lane in enumerate(lanes):
            mine = (t.lane == lane) & (t.resource == 0)
            short = np.where(mine & (t.duration <= theta), t.duration, 0.0)
            for ph in (0, 1):
                on = spine & (t.phase == ph)
                cut = np.cumsum(on & mine & (t.duration > theta))[on]  # long kernels of the lane end a run
                runs[e, ph, 0, k] = short[t.phase == ph].sum()
                runs[e, ph, 1, k] = np.bincount(cut, weights=short[on]).max(initial=0.0) if on.any() else 0.0
                runs[e, ph, 2, k] = short[(t.phase == ph) & ~spine].sum()
    return runs


def _path_to_last(t, ph: int) -> np.ndarray:
    """Per task of `t`, whether it lies on the dependency path of phase `ph` from the phase's last
    task back to its first (each task's first predecessor of the phase; doubling: every ancestor
    at distance below 2^(i + 1) after step i)."""
    count = len(t.duration)
    own = np.arange(count)
    has = np.diff(t.after_offset) > 0
    pred = np.where(has, t.after[np.minimum(t.after_offset[:-1], max(len(t.after) - 1, 0))], own)
    pred = np.where(t.phase[pred] == t.phase, pred, own)  # a predecessor of the other phase ends the path
    ids = np.nonzero(t.phase == ph)[0]
    on = np.zeros(count, bool)
    if not len(ids):
        return on
    on[ids[-1]] = True
    jump = pred
    for _ in range(max(1, int(count).bit_length())):
        on[jump[on]] = True
        jump = jump[jump]
    return on


def stretches(windows: Windows, theta: float) -> np.ndarray:
    """Per lane, its stretches: the runs of windows no longer than `theta` between longer ones."""
    out = np.zeros(windows.lanes, np.int64)
    for lane in range(windows.lanes):
        lo, hi = int(windows.offset[lane]), int(windows.offset[lane + 1])
        long_ = (windows.end[lo:hi] - windows.start[lo:hi]) > theta
        out[lane] = len(np.unique(np.cumsum(long_)[~long_]))
    return out


def long_windows(windows: Windows, theta: float) -> Windows:
    """`windows` less those no longer than `theta`."""
    keep = (windows.end - windows.start) > theta
    lane = np.repeat(np.arange(windows.lanes), np.diff(windows.offset))
    counts = np.bincount(lane[keep], minlength=windows.lanes)
    return Windows(offset=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), start=windows.start[keep],
                   end=windows.end[keep])


def _lagrangian_least(cost: np.ndarray, usable: np.ndarray, total: int) -> np.ndarray:
    """``least[r, l, j]``: for each row r of `cost` and `usable` (piece sizes 0 .. n), the least of
    lam c + (1 - lam) (c - usable) over splits of j images (j = 0 .. total) into pieces of at most
    n, for each lam of :data:`LAMBDAS` (:func:`~pybubble.planner.bound.least_splits`)."""
    n = cost.shape[1] - 1
    per = (cost[:, None, :] - (1.0 - LAMBDAS)[None, :, None] * usable[:, None, :]).reshape(-1, n + 1)
    return least_splits(per, total).reshape(len(cost), len(LAMBDAS), total + 1)


def short_window_bound(bound: StepBound, costs: np.ndarray, runs: np.ndarray, theta: float, windows: Windows,
                       forward_needed: np.ndarray, grad_ready: np.ndarray, lanes: list[np.ndarray]) -> StepBound:
    """`bound` with its front and back tightened by the short windows (see the module docstring):
    `costs` from :func:`~pybubble.planner.bound.piece_costs`, `runs` from :func:`piece_runs` at
    `theta`, `windows` the compute-free windows of the encoder's lanes, `lanes[e]` stage e's lanes."""
    m, n = len(forward_needed), costs.shape[2] - 1
    need, ready = np.sort(forward_needed), np.sort(grad_ready)[::-1]
    long_ = long_windows(windows, theta)
    free, free_long = windows.free_time(), long_.free_time()
    fits = [(windows.free_before(need), long_.free_before(need)),
            (free[:, None] - windows.free_before(ready), free_long[:, None] - long_.free_before(ready))]
    per_lane = stretches(windows, theta)
    front, back = bound.front, bound.back
    for e, ls in enumerate(lanes):
        s = float(per_lane[ls].max(initial=0))
        phases = [ph for ph in (0, 1) if costs[e, ph, -1] > 0]
        usable = np.minimum(runs[e, phases, 0], s * runs[e, phases, 1] + runs[e, phases, 2])
        leasts = _lagrangian_least(costs[e, phases], usable, m * n)  # both phases at once
        lam = LAMBDAS[:, None, None]
        for ph, least in zip(phases, leasts):
            for q in range(m):
                every, longs = fits[ph][0][ls, q], fits[ph][1][ls, q]  # lanes
                spare = lam * every[None, :, None] + (1.0 - lam) * longs[None, :, None]  # lam x lanes x 1
                # a lane holds at least j of the (q + 1) n images counted, and at most all of them
                held = np.minimum.accumulate(least[:, (q + 1) * n:0:-1], axis=1)[:, ::-1]
                grown = least_growth((held[:, None, :] - spare).max(axis=0), (q + 1) * n)  # lanes x images
                if ph == 0:
                    front = max(front, grown)
                else:
                    back = max(back, grown)
    return StepBound(step_time=bound.horizon + max(front + back, bound.work), horizon=bound.horizon, front=front,
                     back=back, work=bound.work)


__all__ = ["LAMBDAS", "long_windows", "piece_runs", "short_theta", "short_window_bound", "stretches"]
