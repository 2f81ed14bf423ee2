"""The end of the search: its best plans scheduled again by the holes filler, and their one-stage
layouts shared out anew by a linear program (Times are microseconds).

The search schedules every layout with the greedy filler (one pass per phase, a cursor per lane and
resource). Its best :data:`REFILL` plans' best layouts (those whose bound is below the best step:
the others cannot win) are then scheduled with the holes filler
(policy ``holes``: the greedy's rules, every task in any free interval left, up to five orders;
docs/scheduler.md), unless their step is already their bound, and each keeps the shorter schedule.

A plan of one encoder stage also gets a *shaped* layout (:func:`share_out`): each microbatch's images
shared out over the encoder pipelines by the linear program that minimises the growth before and
after the LLM under the conditions of the layout's bound (:func:`~pybubble.planner.bound.layout_bound`:
on every lane, the forward of the microbatches the LLM needs first before it needs them, the backward
of the last ones after their gradient is ready, all of it in the free time), microbatch j feeding
LLM microbatch j, rounded to whole images two ways (:func:`rounded`), the one with the lower
layout bound kept. The search's spread layouts share
a microbatch out by the free time before its own deadline; the program weighs every deadline at
once. It ignores one encoder stage waiting for another, so it is not tried on more stages (there its
layouts ran 1-26% longer: bench/results/layout_lp.txt), and it is tried on two one-stage plans of
those re-filled at most: the first (the shortest step) and the one with the lowest plan bound, one
plan when they are the same, as on every Optimus setting (each costs a linear program, a layout and
a holes schedule). The plan with the lowest bound is the one whose whole microbatches lose most to
the layout: on a small instance of the A100 setting's shape (``bench/plan_gap.py --every-layout``)
its shaped layout is 6.7% shorter than the first plan's best. The shaped layout, scheduled with the
holes filler, replaces the plan's when shorter and within memory. The search also hands the re-fill
the one-stage plan of the lowest bound when it is not among its best (weak_a: its whole microbatches
ran 1,493 ms against the best plan's 1,393; its shaped layout 1,387).

**By rank.** The program counts a piece's work linear in its images; rounded to whole images, its
share-out leaves pieces of one to three images (dual_2: 24 of its 57 pieces, 17 of one), and each pays a
piece's fixed costs (weights read per kernel, a kernel's overhead): a ViT-22B + ViT-5B piece of one
256-token image takes 28.4 ms of backward, 17.7 ms per image in a piece of 16. The *by-rank* layout
(:func:`by_rank`) splits each microbatch's images evenly over the pipelines of one LLM rank (its
``lanes_per_stage`` lanes), the microbatches dealt to the ranks in turn: pieces of
``images / lanes_per_stage``, every lane the same work, each rank one microbatch in every R. It is
the layout of the CP-SAT optimum on ``bench/plan_gap.py``'s dual instance with two images per
microbatch (each microbatch's two images on the two lanes of one rank; ``--every-layout``). The
shaped job at weight 1 builds it too, unless the share-out's schedule is already within the polish's
gap (2%) of the plan's bound tightened by whole images (a100, weak_c: left as found, as the polish
leaves such a plan), and schedules it where its layout bound, microbatches in order, is below the
share-out's; the shorter schedule is kept. dual_2: 3,033.85 against 3,046.66 ms, its step
3,072.52 -> 3,055.56 ms; dual_3 3,111.76 -> 3,103.08 (the polish leaves it as found:
:mod:`~pybubble.planner.polish`); on dual_1 and weak_b it is scheduled and longer; on weak_a and
weak_d its bound is above the share-out's.

**Link-busy windows.** Where the encoder has collectives (TP_enc > 1), a compute-free window in
which the link is busy all through (:func:`link_busy`: the LLM's TP collectives) takes a chain's
kernels only up to its next collective, which waits for the link, so a piece crawls through such
windows one run of kernels per window (weak_a's ViT-11B at TP_enc 4: 193 runs in a backward, of
50-520 us by the piece's images, in windows of 330 us). The program counts their free time whole, and its layouts load the lanes
whose time is mostly in them more than any schedule fills them (weak_a: 82-87% of those windows
used on the busiest lanes, 10-13% on the least loaded). Where such windows hold most of the free time (the
TP-8 settings), the shaped layout is tried a second time with their free time weighted by
:data:`BUSY_WEIGHT` in the program; the shorter schedule is kept. Of 0.4-0.8, 0.6 gave the least
sum of the Optimus settings' steps (weak_a 1,392.61 -> 1,387.32 ms, weak_d 3,006.97 -> 2,991.75, dual_3
3,138.01 -> 3,111.76, weak_c 2,904.94 -> 2,900.03; none longer).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from ..llm.timeline import Windows
from ..problem.problem import Problem
from ..schedule.scheduler import schedule_problem
from .bound import layout_bound
from .candidate import Candidate
from .polish import POLISH_GAP
from .space import PlanSpace, layout_entry

REFILL = 3
"""How many of the search's best plans are re-filled (see the module docstring)."""

BUSY_WEIGHT = 0.6
"""The weight of a link-busy window's free time in the shaped layout's second program (see the
module docstring)."""


def share_out(space: PlanSpace, busy: float = 1.0) -> tuple[list[int | tuple[int, ...]], Problem] | None:
    """The shaped layout of `space`'s plan (see the module docstring) and its problem: per LLM
    microbatch, the pipeline that takes every image of its encoder microbatch, or the images per
    pipeline; None for a plan of more than one encoder stage or of encoders with different image
    counts. Of the program's share-out rounded microbatch by microbatch and rounded so that each
    pipeline's images of the first k microbatches stay within one of the program's
    (:func:`rounded`), the one with the lower :func:`~pybubble.planner.bound.layout_bound` under
    the program's assignment (microbatch j feeds LLM microbatch j): that bound picked the shorter
    schedule on the five Optimus settings whose best plan is shaped. `busy`: the weight of the
    link-busy windows' free time in the program (:func:`link_busy`)."""
    if space.plan.pp_enc != 1:
        return None
    found = _program(space, busy=busy)
    if found is None:
        return None
    n, share = space.work.images[0], found[1]
    layouts = [rounded(share, n, cumulative) for cumulative in (False, True)]
    made = [(layout, space.bubbles.with_tasks(space.work.layout_tasks(layout)))
            for layout in layouts[:1 if layouts[0] == layouts[1] else 2]]  # one layout to build when they agree
    return made[0] if len(made) == 1 else min(
        made, key=lambda m: layout_bound(m[1], np.arange(m[1].num_microbatches)).step_time)


def by_rank(space: PlanSpace) -> list[int | tuple[int, ...]] | None:
    """The by-rank layout of `space`'s plan (see the module docstring): microbatch j's images split
    evenly over the pipelines of LLM rank ``j mod R`` (the plan's ``lanes_per_stage`` pipelines on
    each of its R ranks; the remainder to the rank's last pipelines, as
    :meth:`EncoderWork.split_images` splits a share), whole on one pipeline where it holds one image; None for a plan of more than one encoder stage or of one lane per rank, or for
    encoders with different image counts (as :func:`share_out`)."""
    plan, images = space.plan, set(space.work.images)
    k = plan.lanes_per_stage
    if plan.pp_enc != 1 or k < 2 or len(images) != 1:
        return None
    ranks = plan.pipelines // k
    layout: list[int | tuple[int, ...]] = []
    for j in range(space.step.config.microbatches):
        share = [0] * plan.pipelines
        share[(j % ranks) * k:(j % ranks + 1) * k] = [1] * k
        layout.append(layout_entry([held[0] for held in space.work.split_images(share)]))
    return layout


def rounded(share: np.ndarray, n: int, cumulative: bool = False) -> list[int | tuple[int, ...]]:
    """`share` (microbatches x pipelines, each row summing to `n`) in whole images: each row by
    largest remainder, or (`cumulative`) each row by largest remainder of what keeps every
    pipeline's images of the rows so far nearest the share's; per row, the pipeline that takes all
    `n` or the images per pipeline."""
    layout: list[int | tuple[int, ...]] = []
    so_far, taken = np.zeros(share.shape[1]), np.zeros(share.shape[1])
    for row in share:
        so_far = so_far + row
        want = np.clip(so_far - taken, 0.0, None) if cumulative else row
        want = want * (n / want.sum()) if want.sum() > 0 else row
        got = np.floor(want + 1e-9).astype(np.int64)
        got[np.argsort(-(want - got), kind="stable")[:n - int(got.sum())]] += 1  # largest remainder
        taken = taken + got
        layout.append(layout_entry(got))
    return layout


def share_out_program(space: PlanSpace, integral: bool = False) -> tuple[float, list[int | tuple[int, ...]]] | None:
    """The linear program of :func:`share_out` on any plan of `space`: its optimum (us, the horizon
    plus the least growth) and its share-out rounded to whole images by largest remainder; None for
    encoders with different image counts or no solution. `integral`: whole images in the program
    itself (a mixed-integer program, 20 s at most: ``bench/layout_lp.py``)."""
    found = _program(space, integral)
    return None if found is None else (found[0], rounded(found[1], space.work.images[0]))


def _program(space: PlanSpace, integral: bool = False, busy: float = 1.0) -> tuple[float, np.ndarray] | None:
    """:func:`share_out_program`'s optimum and its share (microbatches x pipelines, images), the
    link-busy windows' free time weighted by `busy`."""
    plan, total = space.plan, space.step.config.microbatches
    images = set(space.work.images)
    if len(images) != 1:
        return None
    from scipy.optimize import linprog, milp, Bounds, LinearConstraint  # its own BLAS: only where solved

    n, pipes = images.pop(), plan.pipelines
    work = space.per_phase / n  # (phase, pipeline, lane): one image's compute
    windows = space.windows[0]
    if busy != 1.0:
        scale = np.where(link_busy(*space.windows), busy, 1.0)
        windows = Windows(offset=windows.offset, start=windows.start,
                          end=windows.start + scale * (windows.end - windows.start))
    free = windows.free_time()
    before = windows.free_before(space.forward_needed)
    after = free[:, None] - windows.free_before(space.grad_ready)
    first = np.tril(np.ones((total, total)))  # row k: microbatches 0..k
    rows, upper = [], []
    for lane in range(work.shape[2]):
        fwd, bwd = work[0, :, lane], work[1, :, lane]
        rows += [np.hstack([np.kron(first, fwd), -np.ones((total, 1)), np.zeros((total, 1))]),
                 np.hstack([np.kron(first.T, bwd), np.zeros((total, 1)), -np.ones((total, 1))]),
                 np.hstack([np.tile(fwd + bwd, total)[None, :], -np.ones((1, 2))])]
        upper += [before[lane], after[lane], [free[lane]]]
    cost = np.r_[np.zeros(total * pipes), 1.0, 1.0]  # front + back
    every = np.hstack([np.kron(np.eye(total), np.ones(pipes)), np.zeros((total, 2))])  # each image placed
    if integral:
        res = milp(cost, constraints=[LinearConstraint(np.vstack(rows), -np.inf, np.concatenate(upper)),
                                      LinearConstraint(every, n, n)],
                   integrality=np.r_[np.ones(total * pipes), 0, 0], options={"time_limit": 20},
                   bounds=Bounds(np.zeros(len(cost)), np.r_[np.full(total * pipes, n), np.inf, np.inf]))
        if res.x is None:
            return None
    else:
        res = linprog(cost, A_ub=np.vstack(rows), b_ub=np.concatenate(upper), A_eq=every, b_eq=np.full(total, n),
                      bounds=(0, None), method="highs")
        if res.status != 0:
            return None
    return space.horizon + float(res.fun), res.x[:-2].reshape(total, pipes)


def link_busy(compute: Windows, link: Windows) -> np.ndarray:
    """Per window of `compute` (compute-free windows), whether the link is busy all through it (no
    window of `link`, the same lanes' link-free windows, overlaps it): an encoder chain that runs in
    it cannot complete a collective there, so it runs at most one run of kernels between two of
    its collectives in it."""
    busy = np.ones(len(compute.start), bool)
    for lane in range(compute.lanes):
        lo, hi = int(compute.offset[lane]), int(compute.offset[lane + 1])
        a, b = int(link.offset[lane]), int(link.offset[lane + 1])
        if a == b:
            continue
        ends = link.end[a:b]
        nxt = np.searchsorted(ends, compute.start[lo:hi], side="right")  # first link window ending after the start
        hit = nxt < b - a
        busy[lo:hi][hit] = link.start[a:b][nxt[hit]] >= compute.end[lo:hi][hit]
    return busy


def refilled(cands: list[Candidate], space_of: Callable[[Candidate], PlanSpace], workers: int,
             shape: bool = True) -> list[Candidate]:
    """Each of `cands` re-filled (see the module docstring), in the same order; `space_of(c)` is
    c's plan on c's LLM step. `shape`: try the shaped layouts (the share-out at each weight and, at
    weight 1, the by-rank layout: see the module docstring) of the first candidate of one encoder
    stage and of the one with the lowest plan bound (False: whole microbatches stay whole). The
    holes schedules and the shaped layouts are separate jobs on `workers` threads."""
    open_ = [i for i, c in enumerate(cands) if c.bound is None or c.step_time > c.bound.step_time]
    one_stage = [i for i in open_ if cands[i].plan.pp_enc == 1] if shape else []
    shaped = {one_stage[0], min(one_stage, key=lambda i: _bound(cands[i]))} if one_stage else set()
    jobs = [job for i in open_ for job in [(i, "holes", 1.0)] + [(i, "shaped", w) for w in
                                                                 (_weights(space_of(cands[i])) if i in shaped else ())]]

    def run(job: tuple[int, str, float]) -> Candidate | None:
        i, kind, busy = job
        cand = cands[i]
        if kind == "holes":
            holes = schedule_problem(cand.problem, "holes")
            return replace(cand, schedule=holes, policy="holes", replaced_step=cand.step_time) \
                if holes.step_time < cand.step_time else None
        space = space_of(cand)
        found = share_out(space, busy)
        made = [] if found is None else [_scheduled(space, *found, dealt=False)]
        if busy == 1.0 and not (made and made[0] is not None and _within_gap(made[0].step_time, space)):
            dealt = _by_rank_below(space, None if found is None else found[1])
            made.append(None if dealt is None else _scheduled(space, *dealt, dealt=True))
        return min((c for c in made if c is not None), key=lambda c: c.step_time, default=None)

    if workers > 1 and len(jobs) > 1:
        # the longest first (the shaped layouts: a program, layouts and a schedule; then the largest
        # problems), so that the threads end together
        first = sorted(jobs, key=lambda job: (job[1] == "holes", -cands[job[0]].problem.num_tasks))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            got = dict(zip(first, pool.map(run, first)))
        done = [got[job] for job in jobs]
    else:
        done = [run(job) for job in jobs]
    out, own = list(cands), {}
    for (i, kind, _), got in zip(jobs, done):  # a candidate's holes job comes before its shaped ones
        shorter = got is not None and got.step_time < out[i].step_time
        if kind == "holes":
            out[i] = got if shorter else out[i]
            own[i] = out[i].step_time  # the plan's own layout, re-filled: what a shaped layout replaces
        elif shorter:
            out[i] = replace(got, replaced_step=own[i])
    return out



def _within_gap(step_time: float, space: PlanSpace) -> bool:
    """Whether `step_time` (us) is within :data:`~pybubble.planner.polish.POLISH_GAP` of `space`'s plan
    bound tightened by whole images (:meth:`PlanSpace.whole_image_bound`, asked only where the fluid
    bound does not settle it): a shaped layout there is left as found, as the polish leaves it."""
    limit = 1.0 + POLISH_GAP
    return step_time <= limit * space.step_bound.step_time or step_time <= limit * space.whole_image_bound().step_time


def _by_rank_below(space: PlanSpace, shaped: Problem | None) -> tuple[list[int | tuple[int, ...]], Problem] | None:
    """The by-rank layout of `space`'s plan and its problem where its layout bound, microbatches in
    order, is below that of the share-out's problem `shaped` (or there is none); else None."""
    dealt = by_rank(space)
    if dealt is None:
        return None
    problem = space.bubbles.with_tasks(space.work.layout_tasks(dealt))
    order = np.arange(problem.num_microbatches)
    below = shaped is None or layout_bound(problem, order).step_time < layout_bound(shaped, order).step_time
    return (dealt, problem) if below else None


def _scheduled(space: PlanSpace, layout: list[int | tuple[int, ...]], problem: Problem, dealt: bool) -> Candidate | None:
    """A shaped `layout` of `space`'s plan (its `problem`) scheduled by the holes filler, `dealt`
    the by-rank one; None where it does not fit in memory."""
    memory = space.layout_memory(layout)
    if memory > space.memory_limit:
        return None
    return replace(space.layout_candidate(layout, (0, 0), memory, policy="holes", problem=problem),
                   shaped=True, by_rank=dealt)


def _weights(space: PlanSpace) -> tuple[float, ...]:
    """The weights of the link-busy windows that `space`'s shaped layouts are tried with: 1, and
    :data:`BUSY_WEIGHT` too where the encoder's pieces communicate and the link-busy windows hold
    most of the free time (the TP-8 settings' steady state)."""
    if not (space.work.microbatch_tasks(0).resource == 1).any():
        return (1.0,)
    compute = space.windows[0]
    width = compute.end - compute.start
    return (1.0, BUSY_WEIGHT) if 2 * width[link_busy(*space.windows)].sum() > width.sum() else (1.0,)


def _bound(cand: Candidate) -> float:
    """`cand`'s plan bound (us; infinite when it has none)."""
    return cand.bound.step_time if cand.bound is not None else float("inf")


__all__ = ["BUSY_WEIGHT", "REFILL", "by_rank", "link_busy", "refilled", "rounded", "share_out", "share_out_program"]
