"""The end-to-end plan of an MLLM (what ``pybubble plan`` prints and writes): pybubble's encoder
plan and schedule beside the baselines, with step time, speedup, MFU, hidden share and memory.

``plan(config)`` runs the search (:mod:`pybubble.planner`), the baselines
(:mod:`pybubble.baselines`) and the non-colocated layout, and returns a :class:`PlanReport`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import baselines as base
from .config import Config
from .planner import Candidate, Search, Separate, mfu, search, separate

BASELINES = ("megatron", "megatron_balanced", "coarse")


@dataclass(kw_only=True, slots=True)
class Row:
    """One layout of the comparison."""

    name: str
    step_time: float
    """us."""
    gpus: int
    memory_bytes: float
    hidden_fraction: float | None
    """Share of the encoder's compute inside LLM bubbles (None where the layout has no bubbles to fill)."""
    layout: str


@dataclass(kw_only=True, slots=True)
class PlanReport:
    """pybubble's plan and the baselines for one config."""

    config: Config
    search: Search
    baselines: dict[str, base.Baseline]
    separate: Separate
    planner_seconds: float

    @property
    def best(self) -> Candidate:
        return self.search.best

    def mfu(self, step_time: float, gpus: int | None = None) -> float:
        return mfu(self.config, step_time, gpus, self.search.costs)

    @property
    def speedup_vs_megatron(self) -> float:
        return self.baselines["megatron"].step_time / self.best.step_time

    def rows(self) -> list[Row]:
        """The comparison, baselines first, pybubble colocated last but one, non-colocated last."""
        g = self.config.cluster.gpus
        coarse = self.search.coarse.hidden_fraction  # 0 by construction: all of it outside the step
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

    def to_json(self) -> dict[str, Any]:
        """The machine-readable report (the keys ``pybubble plan --json`` promises)."""
        best = self.best
        return {
            "baselines": {name: {"step_time_s": b.step_time * 1e-6} for name, b in self.baselines.items()},
            "pybubble": {"step_time_s": best.step_time * 1e-6, "encoder_plan": self.encoder_plan(),
                         "partition": list(best.partition), "hidden_fraction": best.hidden_fraction,
                         "mfu": self.mfu(best.step_time)},
            "speedup_vs_megatron": self.speedup_vs_megatron,
            "planner_seconds": self.planner_seconds,
        }

    def save_trace(self, path: str | os.PathLike[str]) -> None:
        """pybubble's step as a Chrome trace: LLM ops, bubbles by kind, encoder kernels per lane."""
        self.search.timeline.save_trace(path, self.best.problem, self.best.schedule)

    def save_plot(self, path: str | os.PathLike[str]) -> None:
        """A Gantt chart of one pipeline of pybubble's step, bubbles shaded, encoder kernels in bands."""
        from .plot import save_gantt

        best = self.best
        save_gantt(self.search.timeline, path, best.problem, best.schedule,
                   title=f"pybubble: {describe(best)}; step {best.step_time / 1e3:,.1f} ms "
                         f"(LLM alone {self.search.timeline.step_time / 1e3:,.1f} ms)")


def describe(c: Candidate) -> str:
    """A candidate's encoder plan and partition in words."""
    p = c.plan
    return (f"PP_enc {p.pp_enc}, TP_enc {p.tp_enc}, {p.pipelines} encoder pipeline(s) per replica, "
            f"partition {list(c.partition)}")


def plan(config: Config, *, workers: int = 2, progress: Callable[[int, int], None] | None = None) -> PlanReport:
    """Plans `config`: the search, the baselines and the non-colocated layout."""
    t0 = time.perf_counter()
    found = search(config, workers=workers, progress=progress)
    costs = found.costs
    coarse = found.coarse
    baselines = {"megatron": base.megatron(config, costs), "megatron_balanced": base.megatron_balanced(config, costs),
                 "coarse": base.Baseline(name="coarse", step_time=coarse.step_time, memory_bytes=coarse.memory_bytes,
                                         layout=f"encoder before/after the LLM; {describe(coarse)}")}
    sep = separate(config, costs, found.timeline)
    return PlanReport(config=config, search=found, baselines=baselines, separate=sep,
                      planner_seconds=time.perf_counter() - t0)


__all__ = ["BASELINES", "PlanReport", "Row", "describe", "plan"]
