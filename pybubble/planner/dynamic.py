"""Data that changes every batch, on a config's own problem: the encoder's work per microbatch
follows each batch's samples, and four ways to meet it are compared step by step.

- ``static``: the best encoder plan's schedule for the mean batch, replayed on every batch
  (:func:`pybubble.replay`, a stall model);
- ``balanced``: samples balanced over the microbatches (:func:`pybubble.balance_microbatches`),
  then the best plan rescheduled online;
- ``ordered``: the microbatches as the data loader splits them, run in an order by their encoder
  work: the best plan rescheduled online for each of :func:`~pybubble.planner.workloads.work_orders`
  (the light ones at the two ends and the heavy ones in the middle, the reverse, sorted up and
  down) and for the loader's order (what ``online`` runs), the shortest kept (``order_chosen``
  counts which), so it is never behind ``online``;
- ``online``: the best plan rescheduled online with the batch's durations;
- ``choice``: per batch, the plan among the K best on the mean batch whose reschedule gives the
  shortest step, evaluated within a time budget (:class:`PlanChooser`); same microbatches as
  ``online``, so the difference between the two is the plan choice alone.

Each batch comes from :mod:`pybubble.workloads`; a sample's encoder cost is the sum over the
config's encoders of :func:`~pybubble.workloads.sample_costs`; microbatch j's encoder tasks are
scaled by its cost over the mean microbatch's (the problem holds the mean batch). The LLM's
timeline is held fixed: only the encoder's work varies. Times are microseconds.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config.checks import finite, integer
from ..config.schema import Config
from ..costs.roofline import CostModel
from ..llm.step import LLMStep
from ..schedule.balance import balance_microbatches
from ..schedule.online import OnlineScheduler, replay
from ..schedule.scheduler import Schedule
from ..viz.steps import save_step_chart
from .search import Candidate, search
from .workloads import WORK_ORDERS, Batch, WorkloadSpec, batches, microbatch_loads, sample_costs, work_orders

DYNAMIC_FORMAT = "pybubble.dynamic/1"
"""The format key of a dynamic run's document."""
MODES = ("static", "balanced", "ordered", "online", "choice")
"""The ways of meeting batches that change (see the module docstring)."""


def ranked_candidates(step: LLMStep, k: int) -> list[Candidate]:
    """The `k` encoder plans whose best partition (the planner's search, within memory) gives the
    shortest step on the mean batch, best first."""
    integer(k, "candidates", minimum=1)
    return search(step, keep=k).top[:k]


@dataclass(kw_only=True, slots=True)
class Choice:
    """One batch's plan choice."""

    index: int
    """The chosen candidate (0: the best plan on the mean batch)."""
    schedule: Schedule
    """Its schedule for this batch."""
    evaluated: int
    """Candidates rescheduled before the budget ran out."""
    took: float
    """Seconds the choice took, durations included."""


class PlanChooser:
    """Keeps one :class:`OnlineScheduler` per candidate plan (same LLM step, same encoder
    microbatches) and, per batch, picks the plan whose reschedule gives the shortest step.

    Candidates are tried in the given order (best on the mean batch first). The first is always
    rescheduled; a further one only while the time spent plus that candidate's last measured
    reschedule time stays within `budget` seconds.
    """

    def __init__(self, candidates: Sequence[Candidate], budget: float = 0.010, policy: str = "greedy"):
        if not candidates:
            raise ValueError("candidates: empty")
        finite(budget, "budget", minimum=0.0)
        counts = {c.problem.num_microbatches for c in candidates}
        if len(counts) != 1:
            raise ValueError(f"candidates: encoder microbatches differ between plans ({sorted(counts)})")
        self.candidates = list(candidates)
        """The plans, best on the mean batch first."""
        self.budget = float(budget)
        """Seconds one choice may take."""
        self._online = [OnlineScheduler(c.problem, policy) for c in self.candidates]
        self._last = [0.0] * len(self.candidates)

    @classmethod
    def from_step(cls, step: LLMStep, k: int = 4, budget: float = 0.010, policy: str = "greedy") -> "PlanChooser":
        """The chooser over the `k` best plans on the LLM step (:func:`ranked_candidates`)."""
        return cls(ranked_candidates(step, k), budget, policy)

    def choose(self, scale: np.ndarray) -> Choice:
        """The best plan for a batch whose encoder microbatch j costs ``scale[j]`` times the mean's."""
        t0 = time.perf_counter()
        best: Schedule | None = None
        index = evaluated = 0
        for n, online in enumerate(self._online):
            if n and time.perf_counter() - t0 + self._last[n] > self.budget:
                break
            t = time.perf_counter()
            sched = online.reschedule(online.scaled_durations(scale))
            self._last[n] = time.perf_counter() - t
            evaluated += 1
            if best is None or sched.step_time < best.step_time:
                best, index = sched, n
        assert best is not None
        return Choice(index=index, schedule=best, evaluated=evaluated, took=time.perf_counter() - t0)

    def close(self) -> None:
        """Stops the schedulers' background threads."""
        for online in self._online:
            online.close()


def encoder_costs(batch: Batch, config: Config, costs: CostModel) -> np.ndarray:
    """N x 2: per sample, the encoder cost summed over the config's encoders and the LLM cost."""
    out = None
    for enc in config.encoders:
        c = sample_costs(batch, encoder=enc.model, llm=config.llm, costs=costs, frozen=enc.frozen,
                         recompute=config.training.recompute)
        if out is None:
            out = c
        else:
            out[:, 0] += c[:, 0]
    assert out is not None
    return out


def workload_spec(config: Config) -> WorkloadSpec:
    """The default mix for a config: its first encoder's tokens per image, and on average the
    config's images per sample."""
    enc = config.encoders[0]
    return WorkloadSpec(tokens_per_image=max(16, enc.model.tokens), images_mean=float(enc.images_per_sample))


@dataclass(kw_only=True, slots=True)
class DynamicRun:
    """Step times of each mode over the same batches."""

    horizon: float
    """The LLM-only step (us)."""
    plans: list[dict[str, Any]]
    """The candidate plans, best on the mean batch first: pp_enc, tp_enc, partition, mean_step."""
    step_time: dict[str, np.ndarray]
    """Per mode (MODES), the step time of each batch (us)."""
    reschedule: np.ndarray
    """Seconds of each online reschedule (mode ``online``)."""
    balance_took: np.ndarray
    """Seconds of each balancing plus its reschedule (mode ``balanced``)."""
    order_took: np.ndarray
    """Seconds of each ordering plus its reschedule (mode ``ordered``)."""
    choice_took: np.ndarray
    """Seconds of each plan choice (mode ``choice``)."""
    chosen: np.ndarray
    """The candidate chosen for each batch."""
    evaluated: np.ndarray
    """Candidates evaluated for each batch."""
    budget: float
    """The choice's budget (s)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More keys for the document (steps, seed, microbatches)."""

    def summary(self) -> dict[str, dict[str, float]]:
        """Per mode: mean and p95 step (us) and the gain over static (static mean / mode mean)."""
        ref = float(np.mean(self.step_time["static"]))
        return {m: {"mean": float(np.mean(v)), "p95": float(np.percentile(v, 95)),
                    "gain_vs_static": ref / float(np.mean(v))} for m, v in self.step_time.items()}

    def save_plot(self, path: str | os.PathLike[str], title: str = "") -> None:
        """Writes the chart of the step times per mode (:func:`pybubble.viz.steps.save_step_chart`:
        each mode's steps sorted, and its mean and 95th percentile), the LLM-only step dashed."""
        save_step_chart(self.step_time, self.horizon, path, title=title)

    def to_dict(self) -> dict[str, Any]:
        """The run as a pybubble.dynamic/1 document."""
        summ = self.summary()
        return {
            "format": DYNAMIC_FORMAT,
            **self.extra,
            "horizon": float(self.horizon),
            "budget_ms": self.budget * 1e3,
            "plans": self.plans,
            "modes": {m: {**summ[m], "step_time": [float(x) for x in v]} for m, v in self.step_time.items()},
            "reschedule_ms": {"online_median": float(statistics.median(self.reschedule)) * 1e3,
                              "balanced_median": float(statistics.median(self.balance_took)) * 1e3,
                              "ordered_median": float(statistics.median(self.order_took)) * 1e3,
                              "choice_median": float(statistics.median(self.choice_took)) * 1e3,
                              "choice_max": float(np.max(self.choice_took)) * 1e3},
            "chosen": [int(x) for x in self.chosen],
            "evaluated": [int(x) for x in self.evaluated],
        }


def run(config: Config, *, steps: int, seed: int = 0, k: int = 4, budget: float = 0.010,
        spec: WorkloadSpec | None = None, costs: CostModel | None = None,
        progress: Callable[[int], None] | None = None) -> DynamicRun:
    """Draws `steps` batches for the config (``global_batch / dp`` samples each) and runs every
    mode on them; `progress(i)` is called after batch i."""
    integer(steps, "steps", minimum=1)
    step = LLMStep.of(config, costs)
    costs = step.costs
    spec = spec or workload_spec(config)
    m = config.microbatches
    chooser = PlanChooser.from_step(step, k, budget)
    best = chooser.candidates[0]
    online = OnlineScheduler(best.problem)
    sample = [encoder_costs(b, config, costs)
              for b in batches(spec, samples=m * config.training.micro_batch, steps=steps, seed=seed)]
    mean = float(np.mean([c[:, 0].sum() for c in sample])) / m
    out: dict[str, list[float]] = {mode: [] for mode in MODES}
    took, balance_took, order_took, choice_took, chosen, evaluated = [], [], [], [], [], []
    slot = best.schedule.assignment  # encoder microbatch j feeds LLM microbatch slot[j] on the mean batch
    order_chosen = dict.fromkeys(("loader", *WORK_ORDERS), 0)
    try:
        for i, c in enumerate(sample):
            plain = microbatch_loads(c[:, 0], m) / mean
            d_plain = online.scaled_durations(plain)
            out["static"].append(replay(best.problem.with_durations(d_plain), best.schedule))
            t0 = time.perf_counter()
            out["online"].append(online.reschedule(d_plain).step_time)
            took.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            balanced = microbatch_loads(c[:, 0], m, balance_microbatches(c, m)) / mean
            out["balanced"].append(online.reschedule(online.scaled_durations(balanced)).step_time)
            balance_took.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            by_order = {"loader": out["online"][-1]}
            by_order.update({name: online.reschedule(online.scaled_durations(plain[order][slot])).step_time
                             for name, order in work_orders(plain).items()})  # order[k]: the microbatch in slot k
            name = min(by_order, key=by_order.__getitem__)  # the first of equals: the loader's
            out["ordered"].append(by_order[name])
            order_chosen[name] += 1
            order_took.append(time.perf_counter() - t0)
            pick = chooser.choose(plain)
            out["choice"].append(pick.schedule.step_time)
            choice_took.append(pick.took)
            chosen.append(pick.index)
            evaluated.append(pick.evaluated)
            if progress is not None:
                progress(i)
    finally:
        online.close()
        chooser.close()
    plans = [{"pp_enc": c.plan.pp_enc, "tp_enc": c.plan.tp_enc, "partition": list(c.partition),
              "mean_step": float(c.step_time)} for c in chooser.candidates]
    return DynamicRun(horizon=best.problem.horizon, plans=plans,
                      step_time={mode: np.array(v) for mode, v in out.items()}, reschedule=np.array(took),
                      balance_took=np.array(balance_took), order_took=np.array(order_took),
                      choice_took=np.array(choice_took), chosen=np.array(chosen, np.int64),
                      evaluated=np.array(evaluated, np.int64), budget=float(budget),
                      extra={"steps": steps, "seed": seed, "microbatches": m, "order_chosen": order_chosen})
