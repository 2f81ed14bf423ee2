"""The planner's building blocks: the LLM step of a config as a simulated timeline, and the
encoder's kernel tasks for an encoder plan placed into that step's bubbles.

The search itself (memory pruning, partitions, baselines, the `pybubble plan` command) builds on
these; see the issue notes. Times are microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Config
from .costmodel import CostModel
from .encoder_plan import EncoderPlan, encoder_tasks
from .problem import Problem
from .scheduler import Schedule, schedule
from .timeline import Timeline, simulate_pipeline


def cost_model(config: Config) -> CostModel:
    """The cost model of the config's GPU."""
    return CostModel(config.cluster.gpu)


def llm_timeline(config: Config, costs: CostModel | None = None) -> Timeline:
    """The LLM-only step of one pipeline: per-chunk forward and backward times from the cost model
    (TP collectives included, and opened as `tp` bubbles), point-to-point activation transfers, and
    the distributed optimizer's exposed parameter all-gather and gradient reduce-scatter."""
    costs = costs or cost_model(config)
    llm, plan, tr = config.llm, config.llm_plan, config.training
    per_chunk = llm.layers // (plan.pp * plan.vpp)
    mb, seq = tr.micro_batch, tr.seq_len
    fwd = per_chunk * costs.layer_time(llm, mb, seq, tp=plan.tp, phase="fwd")
    bwd = per_chunk * costs.layer_time(llm, mb, seq, tp=plan.tp, phase="bwd")
    collectives = costs.tp_collective_times(llm, mb, seq, tp=plan.tp, phase="fwd") if plan.tp > 1 else []
    tp_comm = (per_chunk * len(collectives), sum(collectives) / len(collectives)) if collectives else None
    activation = float(llm.dtype_bytes * mb * seq * llm.hidden) / plan.tp
    p2p = costs.p2p_time(activation) if plan.pp > 1 else 0.0
    # Each DP rank holds 1/dp of its stage's parameters (bf16) and gathers the rest; gradients
    # are reduce-scattered the same way.
    stage_bytes = float(llm.params_per_layer * (llm.layers // plan.pp) * llm.dtype_bytes) / plan.tp
    dp = plan.dp
    gather = costs.collective_time("all_gather", stage_bytes, dp) if dp > 1 else 0.0
    scatter = costs.collective_time("reduce_scatter", stage_bytes, dp) if dp > 1 else 0.0
    return simulate_pipeline(plan.schedule, stages=plan.pp, microbatches=config.microbatches,
                             chunks=plan.vpp, fwd=fwd, bwd=bwd, p2p=p2p, tp_comm=tp_comm,
                             dp_allgather=gather, dp_reducescatter=scatter)


def even_partition(microbatches: int, pipelines: int) -> list[int]:
    """Microbatches spread over the encoder pipelines as evenly as possible (earlier ones get the
    remainder)."""
    q, r = divmod(microbatches, pipelines)
    return [q + (i < r) for i in range(pipelines)]


def encoder_problem(config: Config, timeline: Timeline, plan: EncoderPlan, partition: list[int],
                    costs: CostModel | None = None) -> Problem:
    """The problem of placing every encoder's kernels, under `plan` and `partition`, into the
    bubbles of `timeline` (colocated: the encoder runs on the LLM's GPUs)."""
    costs = costs or cost_model(config)
    models = [e.model for e in config.encoders]
    tokens_per_image = [e.model.tokens for e in config.encoders]
    images = [max(1, e.tokens_per_sample // t) for e, t in zip(config.encoders, tokens_per_image)]
    tasks = encoder_tasks(models, plan=plan, partition=partition,
                          micro_batch=config.training.micro_batch * max(images), costs=costs,
                          frozen=[e.frozen for e in config.encoders])
    return timeline.to_problem(tasks, lanes_per_stage=plan.lanes_per_stage)


@dataclass(kw_only=True, slots=True)
class Candidate:
    """One encoder plan and partition, scheduled."""

    plan: EncoderPlan
    """The encoder's parallel plan."""
    partition: list[int]
    """Encoder microbatches per encoder pipeline."""
    problem: Problem
    """The scheduling problem it gives."""
    schedule: Schedule
    """The greedy schedule of that problem."""

    @property
    def step_time(self) -> float:
        return self.schedule.step_time


def candidates(config: Config) -> list[EncoderPlan]:
    """Every encoder plan the config allows: PP_enc dividing PP_llm, TP_enc dividing TP_llm, and
    as many encoder pipelines per LLM replica as there are LLM microbatches at most."""
    p = config.llm_plan
    out = []
    for pp_enc in (d for d in range(1, p.pp + 1) if p.pp % d == 0):
        for tp_enc in (d for d in range(1, p.tp + 1) if p.tp % d == 0):
            plan = EncoderPlan(pp_enc=pp_enc, tp_enc=tp_enc, pp_llm=p.pp, tp_llm=p.tp)
            if plan.pipelines <= config.microbatches and all(plan.stage_layers(e.model.layers)[-1] > 0
                                                            for e in config.encoders):
                out.append(plan)
    return out


def best_plan(config: Config, costs: CostModel | None = None) -> Candidate:
    """The encoder plan (with an even partition) whose greedy schedule gives the shortest step."""
    costs = costs or cost_model(config)
    timeline = llm_timeline(config, costs)
    best: Candidate | None = None
    for plan in candidates(config):
        partition = even_partition(config.microbatches, plan.pipelines)
        problem = encoder_problem(config, timeline, plan, partition, costs)
        cand = Candidate(plan=plan, partition=partition, problem=problem, schedule=schedule(problem))
        if best is None or cand.step_time < best.step_time:
            best = cand
    if best is None:
        raise ValueError("encoders: no encoder plan fits the LLM plan (too few layers for its stages?)")
    return best
