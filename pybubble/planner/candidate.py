"""The encoder plans a config allows, the encoder work and problem each gives on an LLM step, and
a candidate: one plan and layout of the encoder microbatches, scheduled into the step's bubbles
(what the search (:mod:`pybubble.planner.search`) compares and keeps). Times are microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config.schema import Config
from ..costs.kernels import splits_heads
from ..llm.step import LLMStep
from ..problem.encoder import EncoderPlan, EncoderWork
from ..problem.problem import Problem
from ..schedule.scheduler import Schedule
from .bound import StepBound


def encoder_tp_ok(config: Config, tp: int) -> bool:
    """Whether every encoder of the config can run at tensor parallelism `tp`."""
    return all(splits_heads(e.model, tp) for e in config.encoders)


def encoder_work(step: LLMStep, plan: EncoderPlan, separate: bool = False, like: EncoderWork | None = None
                 ) -> EncoderWork:
    """The config's encoders under `plan`: colocated on the LLM's GPUs, or on GPUs of their own
    (`like`: :class:`EncoderWork`'s)."""
    config = step.config
    return EncoderWork([e.model for e in config.encoders], plan=plan, micro_batch=config.encoder_images,
                       costs=step.costs, frozen=[e.frozen for e in config.encoders], separate=separate,
                       recompute=config.training.recompute, like=like)


def encoder_problem(step: LLMStep, plan: EncoderPlan, partition: Sequence[int]) -> Problem:
    """The problem of placing every encoder's kernels, under `plan` and `partition`, into the
    bubbles of the LLM step (colocated: the encoder runs on the LLM's GPUs)."""
    return Problem.on_timeline(step.timeline, encoder_work(step, plan).tasks(partition),
                               lanes_per_stage=plan.lanes_per_stage, windows=step.encoder_windows(plan.lanes_per_stage))


def encoder_plans(config: Config) -> list[EncoderPlan]:
    """Every encoder plan the config allows: PP_enc dividing PP_llm, TP_enc dividing TP_llm, as
    many encoder pipelines per LLM replica as there are LLM microbatches at most, at least one
    layer of every encoder on each encoder stage, and TP_enc splitting every encoder's heads."""
    p = config.llm_plan
    out = []
    for pp_enc in (d for d in range(1, p.pp + 1) if p.pp % d == 0):
        for tp_enc in (d for d in range(1, p.tp + 1) if p.tp % d == 0 and encoder_tp_ok(config, d)):
            plan = EncoderPlan(pp_enc=pp_enc, tp_enc=tp_enc, pp_llm=p.pp, tp_llm=p.tp)
            if plan.pipelines <= config.microbatches and all(plan.stage_layers(e.model.layers)[-1] > 0
                                                            for e in config.encoders):
                out.append(plan)
    return out


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
    """Its schedule: the greedy filler's, or the holes filler's where the search re-filled it
    (:attr:`policy`)."""
    memory_bytes: float = 0.0
    """The largest memory of any GPU (bytes)."""
    spread: tuple[int, int] = (0, 0)
    """Encoder microbatches spread over every pipeline, at the head (feeding the first LLM
    microbatches) and at the tail (the last); `partition` then counts the whole ones between."""
    layout: list[int | tuple[int, ...]] | None = None
    """Where each encoder microbatch runs (:meth:`EncoderWork.layout_tasks`) when it is not the
    partition's pipeline-by-pipeline order; None for that order."""
    bound: StepBound | None = None
    """The lower bound of its plan on its LLM step (:mod:`pybubble.planner.bound`)."""
    step: LLMStep | None = None
    """The LLM step it fills (its warm-up may differ from the config's schedule)."""
    policy: str = "greedy"
    """The filler that gave :attr:`schedule` (``greedy`` or ``holes``: :func:`pybubble.schedule_problem`)."""
    shaped: bool = False
    """Its layout is one of the search's re-fill's (:mod:`pybubble.planner.refill`): the share-out by
    a linear program (:func:`~pybubble.planner.refill.share_out`) or the by-rank layout
    (:attr:`by_rank`), not a spread or partition of the search's."""
    by_rank: bool = False
    """Its shaped layout is the re-fill's by-rank layout (:func:`pybubble.planner.refill.by_rank`):
    each microbatch's images split evenly over the pipelines of one LLM rank."""
    replaced_step: float | None = None
    """The step of what the re-fill replaced with it (us): the greedy's schedule of the same layout
    (:attr:`policy` ``holes``), or the plan's own layout re-filled (:attr:`shaped`); None when the
    search left it as it found it."""
    holes_order: int | None = None
    """With :attr:`policy` ``holes``, where known: the holes order (0-4) that gave :attr:`schedule`
    (:func:`~pybubble.schedule.scheduler.holes_schedule`)."""
    moved: int = 0
    """Images the search's polish moved between encoder pipelines (:mod:`~pybubble.planner.polish`)."""
    polished_from: float | None = None
    """The step before the polish's moves (us); None when it moved nothing."""
    justified_from: float | None = None
    """The step before the search justified its schedule (us: the best's, where it was more than the
    polish's gap over the bound before the polish: :func:`~pybubble.schedule.scheduler.justified`);
    None when it did not."""

    @property
    def step_time(self) -> float:
        """The scheduled step (us)."""
        return self.schedule.step_time

    @property
    def hidden_fraction(self) -> float:
        """Share of the encoder's compute inside the LLM step's bubbles."""
        return self.schedule.hidden_fraction(self.problem)

    def task_images(self) -> np.ndarray | None:
        """Per task, the images of each encoder its piece holds (tasks x encoders), or None when every
        microbatch runs whole (a partition)."""
        if self.layout is None or not self.spread_microbatches:
            return None
        return encoder_work(self.step, self.plan).layout_images(self.layout) if self.step else None

    @property
    def spread_microbatches(self) -> list[int]:
        """The encoder microbatches spread over the pipelines (empty for a partition)."""
        return [] if self.layout is None else [j for j, p in enumerate(self.layout) if not isinstance(p, int)]


__all__ = ["Candidate", "encoder_plans", "encoder_problem", "encoder_tp_ok", "encoder_work"]
