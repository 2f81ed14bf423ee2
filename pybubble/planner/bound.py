"""A lower bound on the step of every schedule of an encoder plan in an LLM step's bubbles: how close
any schedule can come to the LLM alone, counting the dependencies on the LLM.

The bound relaxes the schedule to a fluid: the encoder's compute may split over the GPUs of the
LLM ranks that hold its encoder stage and run in any compute-free window there, kernel boundaries
ignored. What it keeps, for each encoder stage on its ranks (every rank when the encoder has one
stage: an encoder stage ``e`` of ``pp_enc`` lives on the ``pp_llm / pp_enc`` LLM ranks from
``e · pp_llm / pp_enc``, whatever pipeline or piece of a microbatch it runs; the step grows by the
most any stage needs):

- **the forward before the LLM needs it**: the encoder microbatches that feed the LLM microbatches
  needed first (by ``forward_needed``) finish their forward by then, so the least forward work of
  any ``k + 1`` microbatches fits in the free time before the ``(k + 1)``-th deadline, plus what the
  step grows before 0 (``front``);
- **the backward after the LLM's**: likewise the least backward work of any ``M - k`` microbatches
  runs after the ``k``-th smallest ``grad_ready``, in the free time up to the horizon plus what the
  step grows after it (``back``);
- **the total**: all the encoder's work fits in the free time of the step grown by ``front + back``;
- **one piece's chain**: a microbatch splits by images (tiles) at most, one piece per encoder
  pipeline, and a piece's layers run one after another, so the first microbatch's forward of its
  largest piece (its longest dependency path, ``forward_path``) ends by the first deadline, and the
  last one's backward starts after the last ``grad_ready``. The largest piece holds one image at
  least, and with microbatches alike of one encoder, ``ceil(images / pipelines)`` (some pipeline
  holds that many); a piece's path never shrinks as it gains images.

The first three are exactly the conditions under which the fluid fits (Hall's condition for jobs
with windows (-front, F] and [B, horizon + back)); the fourth adds the granularity.

:func:`whole_image_bound` tightens the first three lane by lane (one encoder, or several of as many
images each, which every layout splits alike: a piece holds k images of each; the search applies it to
the least bounds only, :mod:`pybubble.planner.search`; then, with one encoder,
:mod:`~pybubble.planner.short_windows` by the windows too short for the encoder's long kernels): an
image runs whole on one lane of each
encoder stage, so the images a lane holds of the microbatches counted cost at least their least
split into pieces of at most a microbatch's images, each at its own cost (:func:`piece_costs`: a
piece's fixed costs are paid per piece), and must fit in that lane's free time; the step grows by the least
that lets the stage's lanes hold every image counted. A lane's pieces of several microbatches cost
at least that least split, because a piece's cost per image never grows with its images. The work of a
microbatch is its compute kernels' time times the GPUs of its TP group. It is a lower bound for any
split into pieces because a kernel's time per image never grows with its images in the cost model
(the roofline: weights are read once per kernel, the fixed overhead paid once). Encoder
communication is left out (it only adds). The bound covers the encoder plans in the bubbles of one
LLM step; a Megatron-LM layout changes the LLM's own step and is not covered. With several encoders
the whole images tighten the dual settings' least bounds (dual_1 2,895.72 -> 2,907.21 ms, dual_2
2,980.07 -> 2,988.10, dual_3 3,028.73 -> 3,030.42), and on ``bench/plan_gap.py``'s dual instance with
two images per microbatch the bound (73.86 ms) is the CP-SAT optimum over every layout. Times are
microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.checks import positive_int, real_array
from ..llm.timeline import Timeline, Windows
from ..problem.encoder import EncoderWork
from ..problem.arrays import ProblemArrays, Tasks
from ..problem.problem import Problem, prefetched_needs


@dataclass(kw_only=True, slots=True, frozen=True)
class EncoderLoad:
    """What the bound needs of the encoder's work under one plan."""

    forward: np.ndarray
    """GPU time of each microbatch's forward compute (us: kernel time times the TP group's GPUs)."""
    backward: np.ndarray
    """GPU time of each microbatch's backward compute (zeros for a frozen encoder)."""
    forward_path: float
    """The longest dependency path of the forward of a microbatch's largest piece (us; see the
    module docstring): the least time some piece of every microbatch takes."""
    backward_path: float
    """Likewise for its backward."""
    forward_compute: float
    """The longest path of that piece's forward counting its compute kernels only (us): the least
    compute-free time of one rank that it needs."""
    backward_compute: float
    """Likewise for its backward."""
    stage_forward: tuple[float, ...] = (1.0,)
    """Each encoder stage's share of a microbatch's forward compute (they sum to 1)."""
    stage_backward: tuple[float, ...] = (1.0,)
    """Each encoder stage's share of its backward compute."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StepBound:
    """A lower bound on the step of every schedule of one plan (see the module docstring)."""

    step_time: float
    """The bound (us): the horizon plus the least growth."""
    horizon: float
    """The LLM-only step (us)."""
    front: float
    """The least the step grows before 0 (us)."""
    back: float
    """The least the step grows after the horizon (us)."""
    work: float
    """The least the step grows from the total work alone (us): front + back >= work."""

    @property
    def gap(self) -> float:
        """The bound over the LLM alone, less one."""
        return self.step_time / self.horizon - 1.0 if self.horizon > 0 else 0.0


def _longest_paths(tasks: Tasks) -> tuple[float, float, float, float]:
    """The longest paths by duration through the forward and the backward tasks (ids in
    topological order): counting every task, then counting compute tasks only (communication as 0).
    Returns (forward, backward, forward compute, backward compute). The core walks them, as a
    problem of these tasks with no bubble."""
    lanes = int(tasks.lane.max()) + 1 if len(tasks) else 1
    none = Windows(offset=np.zeros(lanes + 1, np.int64), start=np.zeros(0), end=np.zeros(0))
    m = int(tasks.microbatch.max()) + 1 if len(tasks) else 1
    problem = Problem.from_arrays(ProblemArrays(horizon=0.0, compute_free=none, link_free=none,
                                                forward_needed=np.zeros(m), grad_ready=np.zeros(m), tasks=tasks))
    return problem.core.longest_paths()


def encoder_load(work: EncoderWork, scale: np.ndarray | None = None, microbatches: int | None = None) -> EncoderLoad:
    """The load of `work`'s plan: each microbatch's forward and backward GPU time, `microbatches`
    alike, or scaled by ``scale[j]`` (a batch whose microbatch j costs that many times the
    microbatch `work` holds); the paths of a microbatch's largest piece (the same for every
    microbatch: the bound takes the lightest): ``ceil(images / pipelines)`` images with
    `microbatches` alike of one encoder, else one image of each encoder."""
    t = work.microbatch_tasks(0)
    compute = t.resource == 0
    tp = work.plan.tp_enc
    fwd = float(t.duration[compute & (t.phase == 0)].sum()) * tp
    bwd = float(t.duration[compute & (t.phase == 1)].sum()) * tp
    alike = scale is None  # else the microbatches vary: their pieces may hold one image
    if alike:
        scale = np.ones(positive_int(microbatches, "microbatches"))
    s = real_array(scale, "scale", minimum=0.0)
    pipes = work.plan.pipelines
    piece = [-(-n // pipes) for n in work.images] if alike and len(work.images) == 1 else [min(1, n) for n in work.images]
    one = work.microbatch_tasks(0, piece)
    lightest = float(s.min()) if len(s) else 0.0
    paths = [p * lightest for p in _longest_paths(one)]
    lanes = [work.plan.lane(0, e) for e in range(work.plan.pp_enc)]  # pipeline 0's lane of each stage
    shares = []
    for ph in (0, 1):
        keep = compute & (t.phase == ph)
        per_lane = np.bincount(t.lane[keep], weights=t.duration[keep], minlength=max(lanes) + 1)[lanes]
        shares.append(tuple((per_lane / per_lane.sum()).tolist()) if per_lane.sum() > 0 else (1.0,) * len(lanes))
    return EncoderLoad(forward=fwd * s, backward=bwd * s, forward_path=paths[0], backward_path=paths[1],
                       forward_compute=paths[2], backward_compute=paths[3], stage_forward=shares[0],
                       stage_backward=shares[1])


def step_bound(timeline: Timeline, load: EncoderLoad, gpus_per_rank: int, prefetch: int = 0) -> StepBound:
    """The bound of `load` on `timeline` whose ranks have `gpus_per_rank` GPUs each (the LLM's TP
    degree). `prefetch`: the forwards of that many first LLM microbatches run in the step before (a
    frozen encoder's, :func:`~pybubble.problem.problem.prefetched_needs`): they are needed by the
    horizon only."""
    g = positive_int(gpus_per_rank, "gpus_per_rank")
    free = timeline.compute_free
    horizon = timeline.step_time
    per_rank = free.free_time()
    fwd, bwd = np.sort(load.forward), np.sort(load.backward)
    forward_needed, grad_ready = prefetched_needs(timeline, prefetch)
    need = np.sort(forward_needed)
    ready = np.sort(grad_ready)[::-1]  # latest first: the k latest need the k lightest
    before = free.free_before(need)  # ranks x deadlines
    after = per_rank[:, None] - free.free_before(ready)  # ranks x ready times: free time after each
    stages = len(load.stage_forward)
    if timeline.ranks % stages or len(load.stage_backward) != stages:
        raise ValueError(f"load: {stages} encoder stages do not split the {timeline.ranks} ranks")
    r = timeline.ranks // stages
    front = back = work = 0.0
    for e in range(stages):  # each stage's work on its ranks' GPUs
        ranks = slice(e * r, (e + 1) * r)
        f, b, w = _fluid(fwd * load.stage_forward[e], bwd * load.stage_backward[e], before[ranks], after[ranks],
                         float(per_rank[ranks].sum()), g)
        front, back, work = max(front, f), max(back, b), max(work, w)
    if len(fwd):
        first = float(need[0])
        front = max(front, load.forward_path - first, load.forward_compute - float(before[:, 0].max(initial=0.0)))
    if len(bwd) and bwd[-1] > 0:
        last = float(ready[0])
        back = max(back, load.backward_path - (horizon - last), load.backward_compute - float(after[:, 0].max(initial=0.0)))
    grow = max(front + back, work)
    return StepBound(step_time=horizon + grow, horizon=horizon, front=front, back=back, work=work)


def layout_bound(problem: Problem, assignment: np.ndarray | None = None) -> StepBound:
    """A lower bound on the step of every schedule of `problem`: one layout, its tasks fixed on their
    lanes (:class:`StepBound`, ``work`` the least growth from a lane's total work alone).

    For each lane and resource apart (a lane's compute tasks in its compute-free windows, its
    communication in its link-free ones, kernel boundaries ignored): whichever encoder microbatches
    feed the first k LLM microbatches, their forward work on the lane, at least the k lightest's,
    fits in its free time before the k-th smallest forward_needed plus what the step grows before 0;
    likewise the backward after the k-th largest grad_ready, up to the horizon plus what it grows
    after; and all its work in its free time plus both. The step grows by the most any lane needs.
    Tighter than :func:`step_bound` where the layout puts more work on some lanes than the fluid's
    even spread, looser where it leaves out a dependency: the two bound different things (a plan's
    every layout; one layout's every schedule), and each holds.

    `assignment` (``assignment[j]``: the LLM microbatch that encoder microbatch j feeds, a
    schedule's): the bound of every schedule with that assignment, each microbatch's own work
    against its own LLM microbatch's deadline instead of the lightest k's (never lower)."""
    a = problem.arrays()
    t = a.tasks
    m, lanes = len(a.forward_needed), a.num_lanes
    if assignment is None:
        need, ready, by_need, by_ready = np.sort(a.forward_needed), np.sort(a.grad_ready)[::-1], None, None
    else:
        feeds = np.asarray(assignment, np.int64)
        if sorted(feeds.tolist()) != list(range(m)):
            raise ValueError(f"assignment: {feeds.tolist()} is not a permutation of the {m} microbatches")
        by_need = np.argsort(a.forward_needed[feeds], kind="stable")  # encoder microbatches, needed first first
        by_ready = np.argsort(-a.grad_ready[feeds], kind="stable")  # ready last first
        need, ready = a.forward_needed[feeds][by_need], a.grad_ready[feeds][by_ready]
    front = back = work = 0.0
    for res, windows in ((0, a.compute_free), (1, a.link_free)):
        if m == 0 or windows.lanes == 0:
            continue
        per = []
        for ph, order in ((0, by_need), (1, by_ready)):
            keep = (t.resource == res) & (t.phase == ph)
            cells = np.bincount(t.lane[keep] * m + t.microbatch[keep], weights=t.duration[keep],
                                minlength=lanes * m).reshape(lanes, m)
            per.append(np.sort(cells, axis=1) if order is None else cells[:, order])  # lightest first, or in order
        free = windows.free_time()
        front = max(front, float((np.cumsum(per[0], axis=1) - windows.free_before(need)).max(initial=0.0)))
        after = free[:, None] - windows.free_before(ready)
        back = max(back, float((np.cumsum(per[1], axis=1) - after).max(initial=0.0)))
        work = max(work, float((per[0].sum(axis=1) + per[1].sum(axis=1) - free).max(initial=0.0)))
    horizon = float(a.horizon)
    return StepBound(step_time=horizon + max(front + back, work), horizon=horizon, front=front, back=back, work=work)


def _fluid(fwd: np.ndarray, bwd: np.ndarray, before: np.ndarray, after: np.ndarray, free: float,
           g: int) -> tuple[float, float, float]:
    """The least growth before 0, after the horizon and in all of the fluid `fwd`, `bwd` (sorted
    per-microbatch GPU time) on ranks with `before` (ranks x sorted forward_needed) and `after` (ranks
    x grad_ready, latest first) free time and `free` in all, `g` GPUs each."""
    gpus = g * len(before)
    front = back = 0.0
    if len(fwd):
        front = max(0.0, float(((np.cumsum(fwd) - g * before.sum(axis=0)) / gpus).max()))
    if len(bwd) and bwd[-1] > 0:
        back = max(0.0, float(((np.cumsum(bwd) - g * after.sum(axis=0)) / gpus).max()))
    return front, back, max(0.0, (float(fwd.sum() + bwd.sum()) - g * free) / gpus)



def image_piece_tasks(work: EncoderWork) -> list[Tasks] | None:
    """The tasks of a piece of k images on pipeline 0, for k = 1 .. a microbatch's images (what
    :func:`piece_costs` and :func:`~pybubble.planner.short_windows.piece_runs` read): with several
    encoders of as many images each, k images of every encoder (a layout splits their images alike:
    :meth:`EncoderWork.split_images`); None for encoders with different image counts."""
    images = set(work.images)
    if len(images) != 1:
        return None
    return [work.microbatch_tasks(0, (k,) * len(work.images)) for k in range(1, images.pop() + 1)]


def piece_costs(work: EncoderWork, tasks: list[Tasks] | None = None) -> np.ndarray | None:
    """``costs[e, phase, k]``: the compute time on encoder stage e's lane of a piece of k images
    (k = 0 .. a microbatch's images, of every encoder), forward and backward; None for encoders with
    different image counts. `tasks`: :func:`image_piece_tasks` of `work`, when known (else the same
    sums from one layer's kernels, :meth:`EncoderWork.piece_compute`, equal to rounding)."""
    if len(set(work.images)) != 1:
        return None
    plan, n = work.plan, work.images[0]
    costs = np.zeros((plan.pp_enc, 2, n + 1))
    if tasks is None:  # from one layer's kernels per image count (EncoderWork.piece_compute): no tasks built
        for k in range(1, n + 1):
            costs[:, :, k] = work.piece_compute((k,) * len(work.images))
        return costs
    lanes = np.array([plan.lane(0, e) for e in range(plan.pp_enc)])
    for k, t in enumerate(tasks, start=1):
        compute = t.resource == 0
        stage = np.searchsorted(lanes, t.lane[compute])  # pipeline 0's lanes rise with the stage
        for ph in (0, 1):
            keep = t.phase[compute] == ph
            costs[:, ph, k] = np.bincount(stage[keep], weights=t.duration[compute][keep], minlength=plan.pp_enc)
    return costs


def least_costs(costs: np.ndarray, microbatches: int) -> np.ndarray:
    """``least[e, w, j]``: the least compute time of at least j images (j = 0 .. all of `microbatches`)
    on one of stage e's lanes, in pieces of at most a microbatch's images at `costs`
    (:func:`piece_costs`): their forward (w = 0), backward (1) and both (2)."""
    stages, n = costs.shape[0], costs.shape[2] - 1
    total = microbatches * n
    cost = np.concatenate([costs, costs.sum(axis=1, keepdims=True)], axis=1).reshape(-1, n + 1)  # every stage, w
    least = least_splits(cost, total).reshape(stages, 3, total + 1)
    return np.minimum.accumulate(least[:, :, ::-1], axis=2)[:, :, ::-1]


def least_splits(cost: np.ndarray, total: int) -> np.ndarray:
    """``least[r, j]``: for each row r of `cost` (a piece's cost by its images, 0 .. n), the least
    cost of exactly j images (j = 0 .. total) in pieces of at most n; every row at once."""
    n = cost.shape[1] - 1
    least = np.zeros((len(cost), total + 1))
    for k in range(1, total + 1):
        j = np.arange(1, min(n, k) + 1)
        least[:, k] = (cost[:, j] + least[:, k - j]).min(axis=1)
    return least


def whole_image_bound(bound: StepBound, least: np.ndarray, images: int, windows: Windows, forward_needed: np.ndarray,
                      grad_ready: np.ndarray, lanes: list[np.ndarray]) -> StepBound:
    """`bound` tightened by whole images (see the module docstring): `least` from
    :func:`least_costs`, `images` per microbatch, `windows` the compute-free windows of the
    encoder's lanes, `lanes[e]` stage e's lanes (one per pipeline)."""
    m, n = len(forward_needed), images
    free = windows.free_time()
    before = windows.free_before(np.sort(forward_needed))
    after = free[:, None] - windows.free_before(np.sort(grad_ready)[::-1])
    front, back, work = bound.front, bound.back, bound.work
    for e, ls in enumerate(lanes):
        for q in range(m):
            front = max(front, _growth(least[e, 0], (q + 1) * n, before[ls, q]))
            if least[e, 1, -1] > 0:
                back = max(back, _growth(least[e, 1], (q + 1) * n, after[ls, q]))
        work = max(work, _growth(least[e, 2], m * n, free[ls]))
    return StepBound(step_time=bound.horizon + max(front + back, work), horizon=bound.horizon, front=front,
                     back=back, work=work)


def _growth(least: np.ndarray, images: int, free: np.ndarray) -> float:
    """The least growth with which lanes of `free` time more each hold `images` in all, at
    `least` cost: lane l holds k images once the growth reaches ``least[k] - free[l]``, so it is the
    images-th smallest of those."""
    return least_growth(least[1:images + 1][None, :] - free[:, None], images)


def least_growth(need: np.ndarray, images: int) -> float:
    """The images-th smallest of `need` (lanes x image counts 1 .., each row nondecreasing: the
    growth with which a lane holds that many), at least 0: the least growth with which the lanes
    hold `images` in all."""
    return max(0.0, float(np.partition(need.ravel(), images - 1)[images - 1])) if images else 0.0


__all__ = ["EncoderLoad", "StepBound", "encoder_load", "image_piece_tasks", "layout_bound", "least_costs",
           "least_growth", "least_splits", "piece_costs", "step_bound", "whole_image_bound"]
