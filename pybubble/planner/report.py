"""The end-to-end plan of an MLLM (what ``pybubble plan`` prints and writes): pybubble's encoder
plan and schedule beside the baselines, with step time, speedup, MFU, hidden share and memory.

``plan(config)`` derives the LLM step once (:class:`pybubble.llm.step.LLMStep`), runs the search
(:mod:`pybubble.planner.search`), the baselines and the non-colocated layout
(:mod:`pybubble.planner.layouts`) on it (a baseline with an LLM plan of its own gets that plan's
step), and returns a :class:`PlanReport`.

pybubble's layouts include the baselines' own: the search's encoder plans in the bubbles already
cover ``coarse``, and a Megatron-LM layout (the encoder inside the LLM's pipeline) that fits in memory
and is faster than every encoder plan the search found becomes pybubble's plan
(:attr:`PlanReport.chosen`). So pybubble is never behind a baseline that fits; one that does not fit
(its busiest GPU above ``memory_gb``) is printed, marked, and not compared.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..config.schema import Config
from ..costs.kernels import layer_flops
from ..costs.memory import GB
from ..costs.roofline import CostModel
from ..llm.step import LLMStep
from ..problem.encoder import EncoderPlan
from ..viz.gantt import save_gantt
from ..viz.chrome_trace import save_trace
from .layouts import Baseline, Separate, megatron, megatron_balanced, separate
from .bound import layout_bound
from .candidate import Candidate
from .partitions import best_partition
from .search import Search, search
from .space import without_prefetch

BASELINES = ("megatron", "megatron_balanced", "coarse", "optimus")
"""The baselines of the comparison, in the order they are printed. ``optimus`` is Optimus as
published (:attr:`Search.optimus`): whole microbatches per encoder pipeline, the config's own
schedule, the greedy filler in every bubble, over the same encoder plans as pybubble's."""


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
    fits: bool = True
    """Whether its busiest GPU is within the config's memory (a row that does not fit is not compared)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Feature:
    """One way pybubble's plan goes beyond a partition of whole microbatches on the config's LLM
    schedule, and what it bought."""

    name: str
    """``spread`` (the head and tail microbatches spread over every encoder pipeline), ``warmup``
    (the LLM's warm-up depth per pipeline rank), ``prefetch`` (frozen encoders: the next step's
    first forwards in this step, ``training.prefetch``), ``holes`` (the holes filler's schedule),
    ``shaped`` (images shared out by a linear program: :mod:`~pybubble.planner.refill`) or ``polish``
    (single images moved off the busiest pipelines: :mod:`~pybubble.planner.polish`)."""
    uses: str
    """What the plan does, in words."""
    step_without: float | None
    """The step without it (us): the same plan's best partition on the same LLM step (spread; None
    when none fits in memory), the search's best on the config's own schedule (warmup), the same
    layout with every forward in its own step (prefetch), the greedy's schedule of the same layout
    (holes), the plan's own layout re-filled (shaped), or the shaped layout before its moves (polish)."""
    without: str
    """What :attr:`step_without` is, in words."""


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
    chosen: str = "bubbles"
    """pybubble's layout: ``bubbles`` (the search's best encoder plan, in the LLM's bubbles) or the
    name of the Megatron-LM baseline whose layout is faster than every one of those and fits."""
    features: list[Feature] = field(default_factory=list)
    """What the best encoder plan in the bubbles uses beyond whole microbatches on the config's
    schedule, each with the step without it (:func:`features`)."""
    _layout_bound: float | None = field(default=None, init=False, repr=False)

    @property
    def best(self) -> Candidate:
        """The search's best candidate: the best encoder plan in the bubbles (pybubble's plan unless
        :attr:`chosen` names a baseline)."""
        return self.search.best

    @property
    def in_pipeline(self) -> Baseline | None:
        """The baseline layout pybubble adopts (:attr:`chosen`), or None when its plan is in the bubbles."""
        return None if self.chosen == "bubbles" else self.baselines[self.chosen]

    @property
    def step_time(self) -> float:
        """pybubble's step (us): the best encoder plan's, or the adopted baseline layout's."""
        adopted = self.in_pipeline
        return self.best.step_time if adopted is None else adopted.step_time

    @property
    def hidden_fraction(self) -> float | None:
        """Share of the encoder's compute inside LLM bubbles in pybubble's plan (None for a layout
        with the encoder inside the LLM's pipeline)."""
        return self.best.hidden_fraction if self.in_pipeline is None else None

    def mfu(self, step_time: float, gpus: int | None = None) -> float:
        """MFU of a step of `step_time` us on `gpus` GPUs (default: the cluster's)."""
        return mfu(self.config, step_time, self.search.costs, gpus)

    @property
    def speedup_vs_megatron(self) -> float:
        """Megatron's step over pybubble's."""
        return self.baselines["megatron"].step_time / self.step_time

    def baseline_candidate(self, name: str) -> Candidate | None:
        """The encoder plan and schedule of the baseline `name` in the bubbles (``coarse``,
        ``optimus``), None for a Megatron-LM layout (the encoder inside the LLM's pipeline)."""
        return {"coarse": self.search.coarse, "optimus": self.search.optimus}.get(name)

    def rows(self) -> list[Row]:
        """The comparison, baselines first, pybubble colocated last but one, non-colocated last."""
        g = self.config.cluster.gpus
        out = []
        for b in self.baselines.values():
            cand = self.baseline_candidate(b.name)
            out.append(Row(name=b.name, step_time=b.step_time, gpus=g, memory_bytes=b.memory_bytes,
                           hidden_fraction=None if cand is None else cand.hidden_fraction, layout=b.layout,
                           fits=b.fits))
        best, sep, adopted = self.best, self.separate, self.in_pipeline
        if adopted is None:
            out.append(Row(name="pybubble", step_time=best.step_time, gpus=g, memory_bytes=best.memory_bytes,
                           hidden_fraction=best.hidden_fraction, layout=describe(best)))
        else:
            out.append(Row(name="pybubble", step_time=adopted.step_time, gpus=g, memory_bytes=adopted.memory_bytes,
                           hidden_fraction=None, layout=f"{adopted.name}'s layout (faster than the best encoder "
                                                        f"plan in the bubbles, {best.step_time / 1e3:,.1f} ms)"))
        out.append(Row(name="pybubble non-colocated", step_time=sep.step_time, gpus=g + sep.extra_gpus,
                       memory_bytes=max(sep.candidate.memory_bytes, self.search.llm_memory_bytes),
                       hidden_fraction=None,
                       layout=f"encoder on {sep.extra_gpus} more GPUs: {sep.plan.lanes_per_stage} pipeline(s) "
                              f"x PP {sep.plan.pp_enc} x TP {sep.plan.tp_enc} per replica"))
        return out

    def encoder_plan(self, cand: Candidate | None = None) -> dict[str, int]:
        """The best encoder plan in the bubbles (or `cand`'s) as DP, PP and TP degrees over the cluster."""
        p = (cand or self.best).plan
        return {"dp": p.pipelines * self.config.llm_plan.dp, "pp": p.pp_enc, "tp": p.tp_enc}

    @property
    def llm_alone(self) -> float:
        """The LLM-only step under the config's plan (us)."""
        return self.search.timeline.step_time

    @property
    def lower_bound(self) -> float | None:
        """The least step any schedule of the encoder plans in the LLM's bubbles can reach (us;
        :attr:`Search.bound`), or None when no plan's model states fit."""
        bound = self.search.bound
        return None if bound is None else bound.step_time

    @property
    def layout_bound(self) -> float | None:
        """The least step any schedule of pybubble's layout (its tasks on their lanes) can reach (us,
        computed on first use): the larger of :func:`~pybubble.planner.bound.layout_bound` and its
        plan's bound on its LLM step, which holds for every layout of the plan (on the quickstart the
        plan's is the larger); None when pybubble adopts a baseline."""
        if self.in_pipeline is not None:
            return None
        if self._layout_bound is None:
            plan = self.best.bound.step_time if self.best.bound is not None else 0.0
            self._layout_bound = max(layout_bound(self.best.problem).step_time, plan)
        return self._layout_bound

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable report as a dict (what :meth:`to_json` writes)."""
        best = self.best
        baselines: dict[str, dict[str, Any]] = {name: {"step_time_s": b.step_time * 1e-6, "fits": b.fits}
                                                for name, b in self.baselines.items()}
        baselines["coarse"]["hidden_fraction"] = self.search.coarse.hidden_fraction
        optimus = self.search.optimus
        if optimus is not None and "optimus" in baselines:
            baselines["optimus"] |= {"hidden_fraction": optimus.hidden_fraction, "encoder_plan": self.encoder_plan(optimus),
                                     "partition": list(optimus.partition)}
        bubbles = self.in_pipeline is None
        bound = self.lower_bound
        return {
            "baselines": baselines,
            "pybubble": {"step_time_s": self.step_time * 1e-6, "layout": self.chosen,
                         "encoder_plan": self.encoder_plan() if bubbles else None,
                         "partition": list(best.partition) if bubbles else None,
                         "spread": ({"head": best.spread[0], "tail": best.spread[1]}
                                    if bubbles and any(best.spread) else None),
                         "warmup": list(best.step.warmup) if bubbles and best.step and best.step.warmup else None,
                         "features": [{"name": f.name, "uses": f.uses, "without": f.without,
                                       "step_without_s": None if f.step_without is None else f.step_without * 1e-6}
                                      for f in self.features] if bubbles else [],
                         "lower_bound_s": best.bound.step_time * 1e-6 if bubbles and best.bound else None,
                         "layout_bound_s": self.layout_bound * 1e-6 if bubbles else None,
                         "hidden_fraction": self.hidden_fraction, "mfu": self.mfu(self.step_time)},
            "llm_alone_s": self.llm_alone * 1e-6,
            "lower_bound_s": None if bound is None else bound * 1e-6,
            "encoder_plans": [{"pp": p.plan.pp_enc, "tp": p.plan.tp_enc, "dp": p.plan.pipelines * self.config.llm_plan.dp,
                               "step_time_s": None if p.best is None else p.best.step_time * 1e-6,
                               "lower_bound_s": p.bound.step_time * 1e-6, "states_fit": p.states_fit}
                              for p in self.search.plans],
            "warmups": [{"extra": list(w.extra), "llm_alone_s": w.step.timeline.step_time * 1e-6,
                         "lower_bound_s": None if w.bound is None else w.bound.step_time * 1e-6,
                         "step_time_s": None if w.best is None else w.best.step_time * 1e-6}
                        for w in self.search.warmups],
            "speedup_vs_megatron": self.speedup_vs_megatron,
            "planner_seconds": self.planner_seconds,
        }

    def to_json(self) -> str:
        """The machine-readable report as JSON text (what ``pybubble plan --json`` writes): step times
        in seconds of the baselines (each with whether it fits in memory) and of pybubble, pybubble's
        layout (``bubbles`` or the baseline it adopts), its encoder plan, partition and hidden share
        (null for a baseline's layout) and MFU, its speedup over megatron and the planner's time."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def save_trace(self, path: str | os.PathLike[str], layout: str = "pybubble") -> None:
        """pybubble's step as a Chrome trace: LLM ops, bubbles by kind, encoder kernels per lane (an
        adopted baseline layout: its step, the encoder inside the LLM's ops); `layout` ``coarse`` or
        ``optimus``: that baseline's step instead."""
        adopted = self.in_pipeline if layout == "pybubble" else None
        cand = self.best if layout == "pybubble" else self.baseline_candidate(layout)
        if cand is None:
            raise ValueError(f"layout: {layout!r} is not pybubble or a baseline in the bubbles (coarse, optimus)")
        if adopted is not None and adopted.timeline is not None:
            save_trace(adopted.timeline, path)
        else:
            save_trace((cand.step or self.search.step).timeline, path, cand.problem, cand.schedule, cand.task_images())

    def save_plot(self, path: str | os.PathLike[str], window: tuple[float, float] | None = None) -> None:
        """A Gantt chart of one pipeline of pybubble's step: bubbles shaded, the encoder's kernels
        in the bubbles they fill (:func:`pybubble.save_gantt`); `window`: (start, end) in us of the
        step to draw only that part."""
        best, llm, adopted = self.best, self.search.timeline.step_time, self.in_pipeline
        if adopted is not None and adopted.timeline is not None:
            save_gantt(adopted.timeline, path, window=window,
                       title=f"pybubble: {adopted.name}'s layout, step {adopted.step_time / 1e3:,.1f} ms (LLM alone "
                             f"{llm / 1e3:,.1f} ms; the best encoder plan in the bubbles "
                             f"{best.step_time / 1e3:,.1f} ms)\n{adopted.layout}")
            return
        bound = self.lower_bound
        uses = "".join(f"\n{f.uses}" + ("" if f.step_without is None else f" (without: {f.step_without / 1e3:,.1f} ms, "
                                                                          f"{f.without})")
                       for f in self.features)
        save_gantt((best.step or self.search.step).timeline, path, best.problem, best.schedule, window=window,
                   spread=best.spread_microbatches,
                   title=f"pybubble: step {best.step_time / 1e3:,.1f} ms (LLM alone {llm / 1e3:,.1f} ms"
                         + ("" if bound is None else f", lower bound {bound / 1e3:,.1f} ms")
                         + f", megatron {self.baselines['megatron'].step_time / 1e3:,.1f} ms); "
                         f"{best.hidden_fraction:.0%} of the encoder's compute in bubbles\n"
                         f"encoder plan: {describe(best)}{uses}")


def features(found: Search) -> list[Feature]:
    """What the search's best candidate uses beyond whole microbatches on the config's schedule,
    each with the step without it."""
    best, out = found.best, []
    step = best.step or found.step
    if any(best.spread):
        searched = next((p for p in found.plans if p.plan == best.plan), None) if step is found.step else None
        # the optimus search's best partition of the plan, when it is best_partition's (the same search)
        without = searched.partition if searched is not None and searched.partition_known else \
            best_partition(step, best.plan)
        out.append(Feature(name="spread", uses=f"{_spread_words(*best.spread)} spread over every encoder pipeline",
                           step_without=without.step_time if without else None,
                           without="the same encoder plan with whole microbatches"))
    prefetch = found.config.training.prefetch
    if prefetch:
        out.append(Feature(name="prefetch", uses=f"the encoder forward of the first {prefetch} microbatches of the next "
                                                 "step in this step (exact: the encoders are frozen)",
                           step_without=without_prefetch(best).step_time,
                           without="the same layout with every forward in its own step"))
    if step.warmup is not None and found.default_best is not None:
        out.append(Feature(name="warmup", uses=f"{list(step.warmup)} more warm-up forwards per pipeline rank "
                                               f"(LLM alone then {step.timeline.step_time / 1e3:,.1f} ms)",
                           step_without=found.default_best.step_time,
                           without="the best plan on the config's own schedule"))
    if best.shaped:
        uses = (_by_rank_words(best.plan) if best.by_rank else
                "each microbatch's images shared out over the encoder pipelines by a linear program against every "
                "deadline at once")
        out.append(Feature(name="shaped", uses=uses, step_without=best.replaced_step,
                           without="the plan's own layout, re-filled"))
    if best.moved:
        out.append(Feature(name="polish", uses=f"{best.moved} single image(s) moved off the encoder pipelines that end "
                                               "last or start first, each move scheduled",
                           step_without=best.polished_from, without="the shaped layout before the moves"))
    elif best.policy == "holes" and not best.shaped:
        out.append(Feature(name="holes", uses="the holes filler (each kernel in any free interval left on its lane)",
                           step_without=best.replaced_step, without="the greedy filler's schedule of the same layout"))
    if best.justified_from is not None:
        out.append(Feature(name="justified", uses="its kernels packed towards the far end of the step and back, phase by "
                                                  "phase (double justification)",
                           step_without=best.justified_from, without="the same schedule before"))
    return out


def describe(c: Candidate) -> str:
    """A candidate's encoder plan and partition in words."""
    p = c.plan
    words = f"PP_enc {p.pp_enc}, TP_enc {p.tp_enc}, {p.pipelines} encoder pipeline(s) per replica, "
    if c.shaped and c.by_rank:
        return words + _by_rank_words(p)
    if c.shaped:
        spread = len(c.spread_microbatches)
        return words + (f"{spread} microbatch(es) shared out over the pipelines by a linear program, the other "
                        f"{sum(c.partition)} as partition {list(c.partition)}")
    if not any(c.spread):
        return words + f"partition {list(c.partition)}"
    if sum(c.partition) == 0:
        return words + "every microbatch spread over every pipeline"
    return words + (f"{_spread_words(*c.spread)} spread over every pipeline, the other {sum(c.partition)} as "
                    f"partition {list(c.partition)}")


def _by_rank_words(plan: EncoderPlan) -> str:
    """The by-rank layout of `plan` (:func:`~pybubble.planner.refill.by_rank`) in words."""
    return (f"each microbatch's images split evenly over the {plan.lanes_per_stage} encoder pipelines of one LLM rank, "
            f"the microbatches dealt to the {plan.pipelines // plan.lanes_per_stage} ranks in turn")


def _spread_words(head: int, tail: int) -> str:
    """Which microbatches a layout spreads, in words."""
    parts = ([f"the first {head}"] if head else []) + ([f"the last {tail}"] if tail else [])
    return " and ".join(parts) + " microbatch" + ("es" if head + tail > 1 else "")


def plan(config: Config, *, workers: int = 2, progress: Callable[[int, int], None] | None = None,
         costs: CostModel | None = None) -> PlanReport:
    """Plans `config`: the LLM step derived once, then the search, the baselines and the
    non-colocated layout on it (with `costs`, default: the config's cost model and calibration)."""
    t0 = time.perf_counter()
    step = LLMStep.of(config, costs)
    with ThreadPoolExecutor(max_workers=1) as beside:
        # The Megatron-LM layouts and the non-colocated one do not depend on the search: with more
        # than one worker they are simulated beside it (its scheduling runs without the GIL).
        others = beside.submit(_others, step) if workers > 1 else None
        found = search(step, workers=workers, progress=progress, optimus=True)
        mega, balanced, sep = others.result() if others is not None else _others(step)
    coarse, optimus, limit = found.coarse, found.optimus, config.memory_gb * GB
    baselines = {"megatron": mega, "megatron_balanced": balanced,
                 "coarse": Baseline(name="coarse", step_time=coarse.step_time, memory_bytes=coarse.memory_bytes,
                                    layout=f"encoder before/after the LLM's work; {describe(coarse)}",
                                    memory_limit=limit)}
    if optimus is not None:  # None only when no partition fits in memory (then the search raised)
        baselines["optimus"] = Baseline(name="optimus", step_time=optimus.step_time, memory_bytes=optimus.memory_bytes,
                                        layout=f"Optimus as published: whole microbatches, the config's schedule; "
                                               f"{describe(optimus)}", memory_limit=limit)
    chosen, used = choose(found.best, baselines), features(found)
    return PlanReport(config=config, search=found, baselines=baselines, separate=sep,
                      planner_seconds=time.perf_counter() - t0, chosen=chosen, features=used)


def _others(step: LLMStep) -> tuple[Baseline, Baseline, Separate]:
    """The layouts that do not depend on the search: Megatron-LM's two (each on its own LLM plan)
    and the encoder on GPUs of its own."""
    config = step.config
    return (megatron(step.with_plan(config.baseline_plan("megatron"))),
            megatron_balanced(step.with_plan(config.baseline_plan("megatron_balanced"))), separate(step))


def choose(best: Candidate, baselines: dict[str, Baseline]) -> str:
    """pybubble's layout among its own and the baselines': ``bubbles`` for `best` (the search's best
    encoder plan), or the name of the fastest baseline with a timeline of its own (a Megatron-LM
    layout) that fits in memory and is strictly faster than `best`."""
    faster = [b for b in baselines.values() if b.timeline is not None and b.fits and b.step_time < best.step_time]
    return min(faster, key=lambda b: b.step_time).name if faster else "bubbles"


__all__ = ["BASELINES", "Feature", "PlanReport", "Row", "choose", "describe", "features", "encoder_flops", "llm_flops", "mfu", "model_flops", "plan"]
