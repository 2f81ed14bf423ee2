"""The layouts users know, simulated with the same bubble predictor and cost model as pybubble's:

- ``megatron``: the encoders run in pipeline stage 0's pre-process (Megatron-LM's
  ``pre_process``): every microbatch's encoder forward before stage 0's first LLM chunk, its
  backward after that chunk's backward, with the LLM's TP degree;
- ``megatron_balanced``: the encoder and LLM layers as one sequence cut into the pp x vpp virtual
  stages so that the slowest virtual stage is as fast as it can be (contiguous cuts, encoder layers
  first, every virtual stage non-empty); virtual stage ``c`` is chunk ``c // pp`` of rank
  ``c % pp``;
- ``coarse`` (Optimus's coarse-grained bubble exploitation, and Megatron-Core's colocated MIMO
  schedule): the encoder, under its own parallel plan on the same GPUs, runs its forward for the
  whole batch before the LLM's work on each rank and its backward after it, in the leading and
  trailing bubbles where they hold it; the planner reports the best plan under that policy
  (:attr:`pybubble.planner.search.Search.coarse`);
- non-colocated (:func:`separate`): the encoder on GPUs of its own, scheduled against the LLM step.

Each Megatron layout runs on its own LLM plan where the config gives one (``baselines:``, e.g. plain
Megatron-LM without interleaving): pass :meth:`LLMStep.with_plan` of it. The encoders'
data-parallel gradient traffic is left out of every layout alike (it is the same bytes in each).
Times are microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.schema import Config, LLMPlan
from ..costs.memory import GB
from ..llm.step import LLMStep, even_split, wgrad_share
from ..llm.timeline import Timeline, Windows
from ..problem.arrays import Tasks
from ..problem.encoder import EncoderPlan, EncoderWork
from ..problem.problem import Problem
from ..schedule.scheduler import schedule_problem
from .candidate import Candidate, encoder_tp_ok, encoder_work


@dataclass(kw_only=True, slots=True)
class Baseline:
    """One baseline layout, simulated."""

    name: str
    """``megatron``, ``megatron_balanced`` or ``coarse``."""
    step_time: float
    """Step time (us)."""
    memory_bytes: float
    """The largest memory of any GPU (bytes)."""
    timeline: Timeline | None = None
    """The simulated step (megatron and megatron_balanced)."""
    layout: str = ""
    """How the layers are placed, in words."""
    memory_limit: float = float("inf")
    """The config's memory per GPU (bytes): a layout above it does not fit and is not compared."""

    @property
    def fits(self) -> bool:
        """Whether the layout's busiest GPU holds it within :attr:`memory_limit`."""
        return self.memory_bytes <= self.memory_limit


def plan_words(plan: LLMPlan) -> str:
    """An LLM plan in a few words, e.g. ``DP 48 x PP 8 x TP 8, interleaved_1f1b V 12``."""
    chunks = f" V {plan.vpp}" if plan.vpp > 1 else ""
    return f"DP {plan.dp} x PP {plan.pp} x TP {plan.tp}, {plan.schedule}{chunks}"


def encoder_tp(config: Config) -> int:
    """The encoders' TP degree in the Megatron layouts: the LLM's, or the largest divisor of it that
    splits every encoder's heads (Megatron's ``--encoder-tensor-model-parallel-size``)."""
    tp = config.llm_plan.tp
    return max(d for d in range(1, tp + 1) if tp % d == 0 and encoder_tp_ok(config, d))


def encoder_layer_times(step: LLMStep) -> list[tuple[int, float, float]]:
    """Per encoder: (layers, forward, backward) of one layer for one microbatch on one LLM rank's
    GPUs, at :func:`encoder_tp`; with a TP degree below the LLM's, the rank's TP groups split the
    microbatch's images (the slowest group's share counts). The backward holds the recomputed
    forward work of ``training.recompute``; a frozen encoder's backward is 0."""
    config, costs = step.config, step.costs
    tp = encoder_tp(config)
    groups = config.llm_plan.tp // tp
    out = []
    for enc, count in zip(config.encoders, config.encoder_images):
        m, images = enc.model, -(-count // groups)
        f = costs.layer_time(m, images, m.tokens, tp=tp, phase="fwd")
        b = 0.0 if enc.frozen else costs.layer_time(m, images, m.tokens, tp=tp, phase="bwd",
                                                    recompute=config.training.recompute)
        out.append((m.layers, f, b))
    return out


def megatron(step: LLMStep) -> Baseline:
    """Encoders in stage 0's pre-process."""
    config = step.config
    p = config.llm_plan
    layers = step.chunk_layers
    fwd, bwd = layers * step.layer_fwd, layers * step.layer_bwd
    enc = encoder_layer_times(step)
    wgrad = bwd * wgrad_share(step.costs)  # the encoder's backward splits in halves (I and W)
    fwd[0, 0] += sum(n * f for n, f, _ in enc)
    bwd[0, 0] += sum(n * b for n, _, b in enc)
    wgrad[0, 0] += sum(n * b for n, _, b in enc) / 2
    tl = step.simulate(fwd, bwd, wgrad=wgrad)
    enc_layers = np.zeros((p.pp, p.vpp))
    enc_layers[0, 0] = sum(n for n, _, _ in enc)
    mem = step.stage_memory(tl, encoder_layers=enc_layers, encoder_tp=encoder_tp(config))
    return Baseline(name="megatron", step_time=tl.step_time, memory_bytes=float(mem.max()), timeline=tl,
                    layout=f"encoders on stage 0 (TP {encoder_tp(config)}); LLM {plan_words(p)}",
                    memory_limit=config.memory_gb * GB)


def balanced_cuts(costs: np.ndarray, parts: int) -> np.ndarray:
    """Cuts a sequence of layer costs into `parts` contiguous non-empty pieces minimising the
    largest piece's sum; returns the first layer of each piece (and the end). Binary search on the
    bottleneck over the candidate sums, greedy feasibility."""
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"parts: {parts} is not in [1, {n}] (one layer per virtual stage at least)")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])

    def cuts(limit: float) -> np.ndarray | None:
        out = [0]
        i = 0
        for piece in range(parts):
            left = parts - piece - 1  # pieces still to fill after this one
            if left == 0:
                j = n
            else:
                # the furthest end within the limit that leaves a layer for each remaining piece
                j = int(np.searchsorted(prefix, prefix[i] + limit * (1 + 1e-12), side="right")) - 1
                j = min(j, n - left)
            if j <= i or prefix[j] - prefix[i] > limit * (1 + 1e-12):
                return None
            out.append(j)
            i = j
        return np.array(out)

    lo, hi = float(costs.max()), float(prefix[-1])
    for _ in range(100):  # converges to the bottleneck within float precision
        mid = (lo + hi) / 2
        if cuts(mid) is not None:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    found = cuts(hi)
    assert found is not None
    return found


def megatron_balanced(step: LLMStep) -> Baseline:
    """Encoder and LLM layers cut to balance the slowest virtual stage."""
    config = step.config
    p = config.llm_plan
    lf, lb = step.layer_fwd, step.layer_bwd
    enc = encoder_layer_times(step)
    f = np.array([f for n, f, _ in enc for _ in range(n)] + [lf] * config.llm.layers)
    b = np.array([b for n, _, b in enc for _ in range(n)] + [lb] * config.llm.layers)
    is_enc = np.arange(len(f)) < sum(n for n, _, _ in enc)
    v = p.pp * p.vpp
    ends = balanced_cuts(f + b, v)
    fwd, bwd, wgrad = np.zeros((p.pp, p.vpp)), np.zeros((p.pp, p.vpp)), np.zeros((p.pp, p.vpp))
    llm_layers, enc_layers = np.zeros((p.pp, p.vpp)), np.zeros((p.pp, p.vpp))
    share = np.where(is_enc, 0.5, wgrad_share(step.costs))  # the encoder's backward splits in halves
    for c in range(v):
        s, k, sl = c % p.pp, c // p.pp, slice(ends[c], ends[c + 1])
        fwd[s, k], bwd[s, k], wgrad[s, k] = f[sl].sum(), b[sl].sum(), (b[sl] * share[sl]).sum()
        enc_layers[s, k], llm_layers[s, k] = is_enc[sl].sum(), (~is_enc[sl]).sum()
    # a virtual stage of frozen encoder layers alone computes no backward; the pipeline still runs
    # its backward action (it passes the step on): one nanosecond
    tl = step.simulate(fwd, np.maximum(bwd, 1e-3), wgrad=np.maximum(wgrad, 5e-4))
    mem = step.stage_memory(tl, encoder_layers=enc_layers, llm_layers=llm_layers, encoder_tp=encoder_tp(config))
    stages_with_encoder = int((enc_layers.sum(axis=1) > 0).sum())
    return Baseline(name="megatron_balanced", step_time=tl.step_time, memory_bytes=float(mem.max()),
                    timeline=tl, layout=f"layers balanced over {v} virtual stages; encoders on "
                                        f"{stages_with_encoder} stage(s); LLM {plan_words(p)}",
                    memory_limit=config.memory_gb * GB)


@dataclass(kw_only=True, slots=True)
class Separate:
    """The encoder on GPUs of its own (non-colocated placement), scheduled against the LLM step."""

    plan: EncoderPlan
    """pp_enc x tp_enc per pipeline; ``plan.lanes_per_stage`` pipelines per LLM replica."""
    candidate: Candidate
    """Its problem (one lane per encoder GPU group, free the whole step) and schedule."""
    extra_gpus: int
    """GPUs added to the cluster for the encoder (all LLM replicas)."""

    @property
    def step_time(self) -> float:
        """Step time (us)."""
        return self.candidate.step_time


def separate(step: LLMStep) -> Separate:
    """The best non-colocated layout: the encoder on ``dp · n · pp_enc · tp_enc`` GPUs of its own
    (pp_enc dividing the encoders' layers up to PP_llm, tp_enc up to a node, n pipelines per LLM
    replica up to the microbatches), chosen for the least GPU time (step time x all GPUs), within
    memory. Its output and gradient cross to and from LLM rank 0 as pipeline sends. Options are
    scheduled best bound first and only while their bound beats the best GPU time found: their
    GPUs x the larger of the busiest lane's compute and the horizon grown by the encoder forwards
    that cannot be done by their ``forward_needed`` and the backwards that cannot be done after their
    ``grad_ready`` (the k-th earliest forward needs one microbatch's chain through every layer plus
    ``ceil(k / n) - 1`` more passes through the slowest stage; the backward likewise)."""
    config, gpus = step.config, step.config.cluster.gpus
    best: Separate | None = None
    works: dict[tuple[int, int], EncoderWork] = {}  # per stages and TP: its layer costs and templates, shared
    for bound, pp_enc, tp_enc, n, extra in sorted(_separate_options(step)):
        if best is not None and bound >= best.step_time * (gpus + best.extra_gpus):
            break  # every option left is bounded no better
        option = _separate_option(step, pp_enc, tp_enc, n, extra, works)
        if option is None:
            continue
        if best is None or option.step_time * (gpus + extra) < best.step_time * (gpus + best.extra_gpus):
            best = option
    if best is None:
        raise ValueError(f"memory_gb: no non-colocated encoder layout fits in {config.memory_gb:g} GB per GPU")
    return best


def _separate_options(step: LLMStep) -> list[tuple[float, int, int, int, int]]:
    """Every non-colocated option as (its bound on the GPU time, pp_enc, tp_enc, n, extra GPUs)
    (see :func:`separate`)."""
    config, timeline = step.config, step.timeline
    p, horizon = config.llm_plan, timeline.step_time
    gpus, recompute = config.cluster.gpus, config.training.recompute
    layers = min(e.model.layers for e in config.encoders)
    per_layer: dict[int, list[tuple[float, float]]] = {}  # per tp_enc and encoder: one layer's compute, fwd and bwd
    needed = np.sort(timeline.forward_needed)
    ready = np.sort(timeline.grad_ready)[::-1]
    rank = np.arange(len(needed))  # the k-th earliest forward_needed, the k-th latest grad_ready

    def layer_compute(tp_enc: int) -> list[tuple[float, float]]:
        if tp_enc not in per_layer:
            per_layer[tp_enc] = [
                (step.costs.compute_time(e.model, images, e.model.tokens, tp=tp_enc),
                 0.0 if e.frozen else step.costs.compute_time(e.model, images, e.model.tokens, tp=tp_enc,
                                                              phase="bwd", recompute=recompute))
                for e, images in zip(config.encoders, config.encoder_images)]
        return per_layer[tp_enc]

    options = []
    for pp_enc in (d for d in range(1, p.pp + 1) if layers >= d):
        for tp_enc in (d for d in (1, 2, 4, 8, 16) if d <= config.cluster.gpus_per_node and encoder_tp_ok(config, d)):
            times = layer_compute(tp_enc)
            stages = [[sum(t[i] * even_split(e.model.layers, pp_enc)[k] for e, t in zip(config.encoders, times))
                       for k in range(pp_enc)] for i in (0, 1)]  # per phase, each stage's work for a microbatch
            chains = [max(e.model.layers * t[i] for e, t in zip(config.encoders, times)) for i in (0, 1)]
            n = 1
            while n <= config.microbatches:
                extra = p.dp * pp_enc * n * tp_enc
                passes = -(-(rank + 1) // n) - 1  # microbatches ahead of the k-th on its pipeline's slowest stage
                front = max(0.0, float((chains[0] + passes * max(stages[0]) - needed).max()))
                back = max(0.0, float((ready + chains[1] + passes * max(stages[1]) - horizon).max()))
                busiest = max(f + b for f, b in zip(*stages)) * -(-config.microbatches // n)
                options.append((max(horizon + front + back, busiest) * (gpus + extra), pp_enc, tp_enc, n, extra))
                n *= 2
    return options


def _separate_option(step: LLMStep, pp_enc: int, tp_enc: int, n: int, extra: int,
                     works: dict[tuple[int, int], EncoderWork]) -> Separate | None:
    """One non-colocated option scheduled: `n` pipelines of `pp_enc` x `tp_enc` GPUs, an even
    partition, every lane free the whole step; None when it does not fit in memory (`works`: the
    options' works so far by stages and TP, whose costs and templates this one shares)."""
    config, timeline = step.config, step.timeline
    plan = EncoderPlan(pp_enc=pp_enc, tp_enc=tp_enc, pp_llm=pp_enc, tp_llm=tp_enc * n)
    partition = even_split(config.microbatches, n)
    work = works[pp_enc, tp_enc] = encoder_work(step, plan, separate=True, like=works.get((pp_enc, tp_enc)))
    memory = float(work.lane_bytes(partition).max())
    if memory > config.memory_gb * GB:
        return None
    whole = Windows.whole(pp_enc * n, 0.0, timeline.step_time)
    bubbles = Problem.on_timeline(timeline, Tasks.empty(), windows=(whole, whole),
                                  lane_names=[f"enc{e}.lane{i}" for e in range(pp_enc) for i in range(n)])
    problem = work.problem(bubbles, partition)
    cand = Candidate(plan=plan, partition=partition, problem=problem, schedule=schedule_problem(problem),
                     memory_bytes=memory)
    return Separate(plan=plan, candidate=cand, extra_gpus=extra)


__all__ = ["Baseline", "Separate", "balanced_cuts", "encoder_layer_times", "encoder_tp", "megatron",
           "megatron_balanced", "plan_words", "separate"]
