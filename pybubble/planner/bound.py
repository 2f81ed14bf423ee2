"""A lower bound on the step of every schedule of an encoder plan in an LLM step's bubbles: how close
any schedule can come to the LLM alone, counting the dependencies on the LLM.

The bound relaxes the schedule to a fluid: the encoder's compute may split over every GPU of the
LLM replica and run in any compute-free window of its rank, kernel boundaries and the plan's
placement of layers ignored. What it keeps:

- **the forward before the LLM needs it**: the encoder microbatches that feed the LLM microbatches
  needed first (by ``forward_needed``) finish their forward by then, so the least forward work of
  any ``k + 1`` microbatches fits in the free time before the ``(k + 1)``-th deadline, plus what the
  step grows before 0 (``front``);
- **the backward after the LLM's**: likewise the least backward work of any ``M - k`` microbatches
  runs after the ``k``-th smallest ``grad_ready``, in the free time up to the horizon plus what the
  step grows after it (``back``);
- **the total**: all the encoder's work fits in the free time of the step grown by ``front + back``;
- **one image's chain**: a microbatch splits by images (tiles) at most, and one image's layers run
  one after another, so the first microbatch's forward of one image (its longest dependency path,
  ``forward_path``) ends by the first deadline, and the last one's backward starts after the last
  ``grad_ready``.

The first three are exactly the conditions under which the fluid fits (Hall's condition for jobs
with windows (-front, F] and [B, horizon + back)); the fourth adds the granularity. The work of a
microbatch is its compute kernels' time times the GPUs of its TP group. It is a lower bound for any
split into pieces because a kernel's time per image never grows with its images in the cost model
(the roofline: weights are read once per kernel, the fixed overhead paid once). Encoder
communication is left out (it only adds). The bound covers the encoder plans in the bubbles of one
LLM step; a Megatron-LM layout changes the LLM's own step and is not covered. Times are
microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.checks import positive_int, real_array
from ..llm.timeline import Timeline
from ..problem.encoder import EncoderWork
from ..problem.problem import prefetched_needs


@dataclass(kw_only=True, slots=True, frozen=True)
class EncoderLoad:
    """What the bound needs of the encoder's work under one plan."""

    forward: np.ndarray
    """GPU time of each microbatch's forward compute (us: kernel time times the TP group's GPUs)."""
    backward: np.ndarray
    """GPU time of each microbatch's backward compute (zeros for a frozen encoder)."""
    forward_path: float
    """The longest dependency path of one image's forward (us): the least time any piece takes."""
    backward_path: float
    """Likewise for one image's backward."""
    forward_compute: float
    """The longest path of one image's forward counting its compute kernels only (us): the least
    compute-free time of one rank that any piece needs."""
    backward_compute: float
    """Likewise for one image's backward."""


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


def _longest_paths(tasks: object) -> tuple[float, float, float, float]:
    """The longest paths by duration through the forward and the backward tasks (ids in
    topological order): counting every task, then counting compute tasks only (communication as 0).
    Returns (forward, backward, forward compute, backward compute)."""
    phase = tasks.phase.tolist()  # type: ignore[attr-defined]
    dur = tasks.duration.tolist()  # type: ignore[attr-defined]
    compute = (tasks.resource == 0).tolist()  # type: ignore[attr-defined]
    off, after = tasks.after_offset.tolist(), tasks.after.tolist()  # type: ignore[attr-defined]
    full, comp = [0.0] * len(dur), [0.0] * len(dur)
    best = [0.0, 0.0, 0.0, 0.0]
    for t, ph in enumerate(phase):
        f = c = 0.0
        for p in after[off[t]:off[t + 1]]:
            if phase[p] == ph:
                f, c = max(f, full[p]), max(c, comp[p])
        full[t] = f + dur[t]
        comp[t] = c + (dur[t] if compute[t] else 0.0)
        best[ph] = max(best[ph], full[t])
        best[2 + ph] = max(best[2 + ph], comp[t])
    return best[0], best[1], best[2], best[3]


def encoder_load(work: EncoderWork, scale: np.ndarray | None = None, microbatches: int | None = None) -> EncoderLoad:
    """The load of `work`'s plan: each microbatch's forward and backward GPU time, `microbatches`
    alike, or scaled by ``scale[j]`` (a batch whose microbatch j costs that many times the
    microbatch `work` holds); one image's paths (the same for every microbatch: the bound takes
    the lightest)."""
    t = work.microbatch_tasks(0)
    compute = t.resource == 0
    tp = work.plan.tp_enc
    fwd = float(t.duration[compute & (t.phase == 0)].sum()) * tp
    bwd = float(t.duration[compute & (t.phase == 1)].sum()) * tp
    if scale is None:
        scale = np.ones(positive_int(microbatches, "microbatches"))
    s = real_array(scale, "scale", minimum=0.0)
    one = work.microbatch_tasks(0, [min(1, n) for n in work.images])
    lightest = float(s.min()) if len(s) else 0.0
    paths = [p * lightest for p in _longest_paths(one)]
    return EncoderLoad(forward=fwd * s, backward=bwd * s, forward_path=paths[0], backward_path=paths[1],
                       forward_compute=paths[2], backward_compute=paths[3])


def step_bound(timeline: Timeline, load: EncoderLoad, gpus_per_rank: int, prefetch: int = 0) -> StepBound:
    """The bound of `load` on `timeline` whose ranks have `gpus_per_rank` GPUs each (the LLM's TP
    degree). `prefetch`: the forwards of that many first LLM microbatches run in the step before (a
    frozen encoder's, :func:`~pybubble.problem.problem.prefetched_needs`): they are needed by the
    horizon only."""
    g = positive_int(gpus_per_rank, "gpus_per_rank")
    gpus = g * timeline.ranks
    free = timeline.compute_free
    horizon = timeline.step_time
    per_rank = free.free_time()
    fwd, bwd = np.sort(load.forward), np.sort(load.backward)
    front = back = 0.0
    forward_needed, grad_ready = prefetched_needs(timeline, prefetch)
    if len(fwd):
        need = np.sort(forward_needed)
        before = free.free_before(need)  # ranks x deadlines
        front = max(0.0, float(((np.cumsum(fwd) - g * before.sum(axis=0)) / gpus).max()))
        first = float(need[0])
        front = max(front, load.forward_path - first, load.forward_compute - float(before[:, 0].max(initial=0.0)))
    if len(bwd) and bwd[-1] > 0:
        ready = np.sort(grad_ready)[::-1]  # latest first: the k latest need the k lightest
        after = per_rank[:, None] - free.free_before(ready)  # ranks x ready times: free time after each
        back = max(0.0, float(((np.cumsum(bwd) - g * after.sum(axis=0)) / gpus).max()))
        last = float(ready[0])
        back = max(back, load.backward_path - (horizon - last), load.backward_compute - float(after[:, 0].max(initial=0.0)))
    work = max(0.0, (float(fwd.sum() + bwd.sum()) - g * float(per_rank.sum())) / gpus)
    grow = max(front + back, work)
    return StepBound(step_time=horizon + grow, horizon=horizon, front=front, back=back, work=work)


__all__ = ["EncoderLoad", "StepBound", "encoder_load", "step_bound"]
