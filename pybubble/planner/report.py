"""The end-to-end plan of an MLLM (what ``pybubble plan`` prints and writes): pybubble's encoder
plan and schedule beside the baselines, with step time, speedup, MFU, hidden share and memory.

``plan(config)`` derives the LLM step once (:class:`pybubble.llm.step.LLMStep`), runs the search
(:mod:`pybubble.planner.search`), the baselines and the non-colocated layout
(:mod:`pybubble.planner.layouts`) on it (a baseline with an LLM plan of its own gets that plan's
step), and returns a :class:`PlanReport`.

MFU counts the FLOPs that the step executes (:func:`model_flops`), recomputation included, over the
step time and the GPUs' peak: the convention of Megatron-LM's reported throughput (its
``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` under full recomputation) and of the Optimus paper's MFU.
Without recomputation it is the plain model FLOPs. The hidden fraction of a layout is the paper's
scheduling efficiency: the share of the encoder's compute time that runs inside the LLM's bubbles.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config.schema import Config
from ..costs.kernels import layer_flops
from ..costs.roofline import CostModel
from ..llm.step import LLMStep
from ..viz.gantt import save_gantt
from ..viz.trace import save_trace
from .layouts import Baseline, Separate, megatron, megatron_balanced, separate
from .search import Candidate, Search, search

BASELINES = ("megatron", "megatron_balanced", "coarse")
"""The baselines of the comparison, in the order they are printed."""


def llm_flops(config: Config) -> float:
    """The LLM's part of :func:`model_flops`: every layer forward and backward with its recomputed
    forward work, and the output layer's logits GEMM forward and backward (never recomputed), per
    sample, times the global batch."""
    llm, tr = config.llm, config.training
    per_layer = sum(layer_flops(llm, 1, tr.seq_len, phase=ph, recompute=tr.recompute) for ph in ("fwd", "bwd"))
    return (llm.layers * per_layer + 3 * 2.0 * tr.seq_len * llm.hidden * llm.vocab) * tr.global_batch


def encoder_flops(config: Config) -> float:
    """The encoders' part of :func:`model_flops`: each image through each layer, forward and (unless
    frozen) backward with its recomputed forward work, times the images of the global batch."""
    tr = config.training
    total = 0.0
    for enc in config.encoders:
        phases = ("fwd",) if enc.frozen else ("fwd", "bwd")
        per_image = sum(layer_flops(enc.model, 1, enc.model.tokens, phase=ph, recompute=tr.recompute) for ph in phases)
        total += enc.images_per_sample * enc.model.layers * per_image * tr.global_batch
    return total


def model_flops(config: Config) -> float:
    """FLOPs of one training step over the whole cluster, as MFU counts them (see the module
    docstring): :func:`llm_flops` plus :func:`encoder_flops`."""
    return llm_flops(config) + encoder_flops(config)


def mfu(config: Config, step_time: float, costs: CostModel, gpus: int | None = None) -> float:
    """Model FLOPs utilisation of a step of `step_time` us on `gpus` GPUs (default: the cluster's)."""
    gpus = gpus or config.cluster.gpus
    return model_flops(config) / (step_time * 1e-6 * gpus * costs.hardware.peak_flops)


@dataclass(kw_only=True, slots=True)
class Row:
    """One layout of the comparison."""

    name: str
    """The layout's name (a baseline's, ``pybubble`` or ``pybubble non-colocated``)."""
    step_time: float
    """us."""
    gpus: int
    """GPUs the layout uses."""
    memory_bytes: float
    """The largest memory of any GPU (bytes)."""
    hidden_fraction: float | None
    """Share of the encoder's compute inside LLM bubbles (None where the layout has no bubbles to fill)."""
    layout: str
    """The layout in words."""


@dataclass(kw_only=True, slots=True)
class PlanReport:
    """pybubble's plan and the baselines for one config."""

    config: Config
    """The config planned."""
    search: Search
    """pybubble's search (its best candidate is the plan)."""
    baselines: dict[str, Baseline]
    """The baselines, by name (:data:`BASELINES`)."""
    separate: Separate
    """The best non-colocated layout."""
    planner_seconds: float
    """Wall time of the whole plan (s)."""

    @property
    def best(self) -> Candidate:
        """pybubble's plan: the search's best candidate."""
        return self.search.best

    def mfu(self, step_time: float, gpus: int | None = None) -> float:
        """MFU of a step of `step_time` us on `gpus` GPUs (default: the cluster's)."""
        return mfu(self.config, step_time, self.search.costs, gpus)

    @property
    def speedup_vs_megatron(self) -> float:
        """Megatron's step over pybubble's."""
        return self.baselines["megatron"].step_time / self.best.step_time

    def rows(self) -> list[Row]:
        """The comparison, baselines first, pybubble colocated last but one, non-colocated last."""
        g = self.config.cluster.gpus
        coarse = self.search.coarse.hidden_fraction
        out = [Row(name=b.name, step_time=b.step_time, gpus=g, memory_bytes=b.memory_bytes,
                   hidden_fraction=coarse if b.name == "coarse" else None, layout=b.layout)
               for b in self.baselines.values()]
        best, sep = self.best, self.separate
        out.append(Row(name="pybubble", step_time=best.step_time, gpus=g, memory_bytes=best.memory_bytes,
                       hidden_fraction=best.hidden_fraction, layout=describe(best)))
        out.append(Row(name="pybubble non-colocated", step_time=sep.step_time, gpus=g + sep.extra_gpus,
                       memory_bytes=max(sep.candidate.memory_bytes, self.search.llm_memory_bytes),
                       hidden_fraction=None,
                       layout=f"encoder on {sep.extra_gpus} more GPUs: {sep.plan.lanes_per_stage} pipeline(s) "
                              f"x PP {sep.plan.pp_enc} x TP {sep.plan.tp_enc} per replica"))
        return out

    def encoder_plan(self) -> dict[str, int]:
        """pybubble's encoder plan as DP, PP and TP degrees over the cluster."""
        p = self.best.plan
        return {"dp": p.pipelines * self.config.llm_plan.dp, "pp": p.pp_enc, "tp": p.tp_enc}

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable report as a dict (what :meth:`to_json` writes)."""
        best = self.best
        baselines: dict[str, dict[str, Any]] = {name: {"step_time_s": b.step_time * 1e-6}
                                                for name, b in self.baselines.items()}
        baselines["coarse"]["hidden_fraction"] = self.search.coarse.hidden_fraction
        return {
            "baselines": baselines,
            "pybubble": {"step_time_s": best.step_time * 1e-6, "encoder_plan": self.encoder_plan(),
                         "partition": list(best.partition), "hidden_fraction": best.hidden_fraction,
                         "mfu": self.mfu(best.step_time)},
            "speedup_vs_megatron": self.speedup_vs_megatron,
            "planner_seconds": self.planner_seconds,
        }

    def to_json(self) -> str:
        """The machine-readable report as JSON text (what ``pybubble plan --json`` writes): step times
        in seconds of the baselines and of pybubble, pybubble's encoder plan, partition, hidden share
        and MFU, its speedup over megatron and the planner's time."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def save_trace(self, path: str | os.PathLike[str]) -> None:
        """pybubble's step as a Chrome trace: LLM ops, bubbles by kind, encoder kernels per lane."""
        save_trace(self.search.timeline, path, self.best.problem, self.best.schedule)

    def save_plot(self, path: str | os.PathLike[str], window: tuple[float, float] | None = None) -> None:
        """A Gantt chart of one pipeline of pybubble's step: bubbles shaded, the encoder's kernels
        in the bubbles they fill (:func:`pybubble.save_gantt`); `window`: (start, end) in us of the
        step to draw only that part."""
        best, llm = self.best, self.search.timeline.step_time
        save_gantt(self.search.timeline, path, best.problem, best.schedule, window=window,
                   title=f"pybubble: step {best.step_time / 1e3:,.1f} ms (LLM alone {llm / 1e3:,.1f} ms, "
                         f"megatron {self.baselines['megatron'].step_time / 1e3:,.1f} ms); "
                         f"{best.hidden_fraction:.0%} of the encoder's compute in bubbles\n"
                         f"encoder plan: {describe(best)}")


def describe(c: Candidate) -> str:
    """A candidate's encoder plan and partition in words."""
    p = c.plan
    return (f"PP_enc {p.pp_enc}, TP_enc {p.tp_enc}, {p.pipelines} encoder pipeline(s) per replica, "
            f"partition {list(c.partition)}")


def plan(config: Config, *, workers: int = 2, progress: Callable[[int, int], None] | None = None) -> PlanReport:
    """Plans `config`: the LLM step derived once, then the search, the baselines and the
    non-colocated layout on it."""
    t0 = time.perf_counter()
    step = LLMStep.of(config)
    found = search(step, workers=workers, progress=progress)
    coarse = found.coarse
    baselines = {"megatron": megatron(step.with_plan(config.baseline_plan("megatron"))),
                 "megatron_balanced": megatron_balanced(step.with_plan(config.baseline_plan("megatron_balanced"))),
                 "coarse": Baseline(name="coarse", step_time=coarse.step_time, memory_bytes=coarse.memory_bytes,
                                    layout=f"encoder before/after the LLM's work; {describe(coarse)}")}
    return PlanReport(config=config, search=found, baselines=baselines, separate=separate(step),
                      planner_seconds=time.perf_counter() - t0)


__all__ = ["BASELINES", "PlanReport", "Row", "describe", "encoder_flops", "llm_flops", "mfu", "model_flops", "plan"]
