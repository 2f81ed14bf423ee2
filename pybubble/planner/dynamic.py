"""Data that changes every batch, on a config's own problem: the encoder's work per microbatch
follows each batch's samples, and five ways to meet it are compared step by step.

- ``static``: the best encoder plan's schedule for the mean batch, replayed on every batch
  (:func:`pybubble.replay`, a stall model);
- ``balanced``: samples balanced over the microbatches (:func:`pybubble.balance_microbatches`),
  then the best plan rescheduled online;
- ``ordered``: the microbatches as the data loader splits them, run in an order by their encoder
  work: the best plan rescheduled online for each of :func:`~pybubble.planner.sample_costs.work_orders`
  (the light ones at the two ends and the heavy ones in the middle, the reverse, sorted up and
  down) and for the loader's order (what ``online`` runs), the shortest kept (``order_chosen``
  counts which), so it is never behind ``online``;
- ``online``: the best plan rescheduled online with the batch's durations;
- ``choice``: per batch, the plan among the K best on the mean batch whose reschedule gives the
  shortest step, evaluated within a time budget (:class:`PlanChooser`); same microbatches as
  ``online``, so the difference between the two is the plan choice alone.

Each batch comes from :mod:`pybubble.workloads`; a sample's encoder cost is the sum over the
config's encoders of :func:`~pybubble.planner.sample_costs.sample_costs`; microbatch j's encoder tasks are
scaled by its cost over the mean microbatch's (the problem holds the mean batch). The LLM's
timeline is held fixed: only the encoder's work varies. Times are microseconds.

With MLLM data (``data``: the mix of :class:`~pybubble.data.mix.MixSpec` or a user's
:class:`~pybubble.data.samples.Samples`), every step draws samples for each of `replicas`
data-parallel replicas, each mode runs on every replica, and the step is the slowest replica's (the
replicas meet at the gradient collective); one more mode, ``balanced_dp``, balances the step over
the microbatches and the replicas (:func:`pybubble.schedule.balance.balance_step`, microbatches
ordered by the plan's deadline gaps) before each replica is rescheduled.
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
from ..schedule.balance import balance_microbatches, balance_step, deadline_gaps
from ..schedule.online import OnlineScheduler, ReplicaScheduler, data_parallel_step, replay
from ..schedule.scheduler import Schedule
from ..viz.steps import save_step_chart
from .candidate import Candidate
from .search import search
from ..data.mix import MixSpec, NativeMixSpec
from ..data.samples import Samples
from ..data.workloads import Batch, WorkloadSpec, batches
from .sample_costs import WORK_ORDERS, image_costs, llm_time, microbatch_loads, sample_costs, work_orders

DYNAMIC_FORMAT = "pybubble.dynamic/1"
"""The format key of a dynamic run's document."""
MODES = ("static", "balanced", "ordered", "online", "choice")
"""The ways of meeting batches that change (see the module docstring)."""
REPLICA_MODES = MODES + ("balanced_dp",)
"""The modes with MLLM data over data-parallel replicas: one more, balanced over the microbatches
and the replicas."""


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
    """More keys for the document (steps, seed, microbatches; with MLLM data: data, replicas)."""
    imbalance_before: np.ndarray | None = None
    """With MLLM data: per step, the replicas' largest over mean encoder seconds on their own
    samples."""
    imbalance_after: np.ndarray | None = None
    """With MLLM data: the same after balancing over the replicas (mode ``balanced_dp``)."""
    dp_wait: dict[str, np.ndarray] = field(default_factory=dict)
    """With MLLM data: per mode, per step, the slowest replica's step less the replicas' mean step
    (us): the time the replicas wait for each other at the gradient collective."""
    balance_dp_took: np.ndarray | None = None
    """With MLLM data: seconds of each step's balancing over microbatches and replicas (without the
    reschedules)."""

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
            **self._replica_keys(),
        }

    def _replica_keys(self) -> dict[str, Any]:
        """The keys that MLLM data over replicas adds to the document (none without it)."""
        if self.imbalance_before is None or self.imbalance_after is None or self.balance_dp_took is None:
            return {}
        return {"imbalance": {"before": [float(x) for x in self.imbalance_before],
                              "after": [float(x) for x in self.imbalance_after],
                              "before_median": float(np.median(self.imbalance_before)),
                              "after_median": float(np.median(self.imbalance_after))},
                "dp_wait": {m: float(np.mean(v)) for m, v in self.dp_wait.items()},
                "balance_dp_ms_median": float(np.median(self.balance_dp_took)) * 1e3}


def run(config: Config, *, steps: int, seed: int = 0, k: int = 4, budget: float = 0.010,
        spec: WorkloadSpec | None = None, costs: CostModel | None = None,
        progress: Callable[[int], None] | None = None, data: MixSpec | NativeMixSpec | Samples | None = None,
        replicas: int | None = None) -> DynamicRun:
    """Draws `steps` batches for the config (``global_batch / dp`` samples each) and runs every
    mode on them; `progress(i)` is called after batch i. With `data` (MLLM samples: a mix to draw
    from, or a user's samples drawn with replacement), each step draws that many samples for each
    of `replicas` replicas (default: the config's dp) and the step is the slowest replica's."""
    integer(steps, "steps", minimum=1)
    step = LLMStep.of(config, costs)
    costs = step.costs
    m = config.microbatches
    chooser = PlanChooser.from_step(step, k, budget)
    best = chooser.candidates[0]
    online = OnlineScheduler(best.problem)
    meet = _Meeting(online=online, best=best, chooser=chooser, microbatches=m)
    try:
        if data is None:
            spec = spec or workload_spec(config)
            sample = [encoder_costs(b, config, costs)
                      for b in batches(spec, samples=m * config.training.micro_batch, steps=steps, seed=seed)]
            meet.mean = float(np.mean([c[:, 0].sum() for c in sample])) / m
            for i, c in enumerate(sample):
                meet.keep(*meet.modes(c))
                if progress is not None:
                    progress(i)
        else:
            r = config.llm_plan.dp if replicas is None else integer(replicas, "replicas", minimum=1)
            _run_replicas(meet, config, costs, data, steps=steps, seed=seed, replicas=r, progress=progress)
    finally:
        online.close()
        chooser.close()
    plans = [{"pp_enc": c.plan.pp_enc, "tp_enc": c.plan.tp_enc, "partition": list(c.partition),
              "mean_step": float(c.step_time)} for c in chooser.candidates]
    return DynamicRun(horizon=best.problem.horizon, plans=plans,
                      step_time={mode: np.array(v) for mode, v in meet.out.items()},
                      reschedule=np.array(meet.took), balance_took=np.array(meet.balance_took),
                      order_took=np.array(meet.order_took), choice_took=np.array(meet.choice_took),
                      chosen=np.array(meet.chosen, np.int64), evaluated=np.array(meet.evaluated, np.int64),
                      budget=float(budget),
                      extra={"steps": steps, "seed": seed, "microbatches": m, "order_chosen": meet.order_chosen,
                             **meet.extra},
                      **meet.replica_fields())


@dataclass(kw_only=True, slots=True)
class _Meeting:
    """Runs the modes on batches and keeps what they give."""

    online: OnlineScheduler
    best: Candidate
    chooser: PlanChooser
    microbatches: int
    mean: float = 1.0
    out: dict[str, list[float]] = field(default_factory=lambda: {mode: [] for mode in MODES})
    took: list[float] = field(default_factory=list)
    balance_took: list[float] = field(default_factory=list)
    order_took: list[float] = field(default_factory=list)
    order_chosen: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("loader", *WORK_ORDERS), 0))
    choice_took: list[float] = field(default_factory=list)
    chosen: list[int] = field(default_factory=list)
    evaluated: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    wait: dict[str, list[float]] = field(default_factory=dict)
    dp_took: list[float] = field(default_factory=list)

    def modes(self, c: np.ndarray) -> tuple[dict[str, float], Choice]:
        """The modes of :data:`MODES` on one batch (N x 2 sample costs): their step times and the plan
        choice (the times each took are kept)."""
        m, online = self.microbatches, self.online
        plain = microbatch_loads(c[:, 0], m) / self.mean
        d_plain = online.scaled_durations(plain)
        steps = {"static": replay(self.best.problem.with_durations(d_plain), self.best.schedule)}
        t0 = time.perf_counter()
        steps["online"] = online.reschedule(d_plain).step_time
        self.took.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        balanced = microbatch_loads(c[:, 0], m, balance_microbatches(c, m)) / self.mean
        steps["balanced"] = online.reschedule(online.scaled_durations(balanced)).step_time
        self.balance_took.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        slot = self.best.schedule.assignment  # encoder microbatch j feeds LLM microbatch slot[j]
        by_order = {"loader": steps["online"]}
        by_order.update({name: online.reschedule(online.scaled_durations(plain[order][slot])).step_time
                         for name, order in work_orders(plain).items()})  # order[k]: the microbatch in slot k
        name = min(by_order, key=by_order.__getitem__)  # the first of equals: the loader's
        steps["ordered"] = by_order[name]
        self.order_chosen[name] += 1
        self.order_took.append(time.perf_counter() - t0)
        pick = self.chooser.choose(plain)
        steps["choice"] = pick.schedule.step_time
        self.choice_took.append(pick.took)
        return steps, pick

    def keep(self, steps: dict[str, float], pick: Choice) -> None:
        """Keeps one batch's step times and plan choice."""
        for mode, t in steps.items():
            self.out[mode].append(t)
        self.chosen.append(pick.index)
        self.evaluated.append(pick.evaluated)

    def replica_fields(self) -> dict[str, Any]:
        """The :class:`DynamicRun` fields of MLLM data over replicas (none without it)."""
        if not self.before:
            return {}
        return {"imbalance_before": np.array(self.before), "imbalance_after": np.array(self.after),
                "dp_wait": {mode: np.array(v) for mode, v in self.wait.items()},
                "balance_dp_took": np.array(self.dp_took)}


def _run_replicas(meet: _Meeting, config: Config, costs: CostModel, data: MixSpec | NativeMixSpec | Samples, *,
                  steps: int, seed: int, replicas: int, progress: Callable[[int], None] | None) -> None:
    """Each step: samples for every replica, the modes of :data:`MODES` on each replica (the step: the
    slowest one's), and ``balanced_dp``. A tile costs the summed encoders' time on one image of the first
    encoder's tokens (tiles run one by one, InternVL-style); a native-resolution image (samples with
    grids) the summed encoders' time on a sequence of its own patches (attention over the image: its
    cost grows faster than its area); a sample's LLM cost is its tokens (text plus that many per
    tile, or its images' tokens) at the per-token cost of a full training sequence."""
    m, micro = meet.microbatches, config.training.micro_batch
    n = m * micro
    tokens_per_tile = config.encoders[0].model.tokens
    seq = config.training.seq_len
    per_token = llm_time(config.llm, seq, costs, recompute=config.training.recompute) / seq
    rng = np.random.default_rng(integer(seed, "seed", minimum=0))
    draws = [data.draw(replicas * n, rng) for _ in range(steps)]
    costs_of = [image_costs(d, config.encoders, costs, recompute=config.training.recompute) for d in draws]
    meet.mean = float(np.mean([c.sum() for c in costs_of])) / (replicas * m)
    meet.out["balanced_dp"] = []
    meet.wait = {mode: [] for mode in REPLICA_MODES}
    meet.extra = {"data": "mix" if isinstance(data, MixSpec) else "native" if isinstance(data, NativeMixSpec)
                  else "file", "replicas": replicas}
    owner = np.repeat(np.arange(replicas), n)
    room = deadline_gaps(meet.best.problem)
    with ReplicaScheduler(meet.best.problem) as each:
        for i, (d, image_cost) in enumerate(zip(draws, costs_of)):
            _step_replicas(meet, each, d, image_cost, tokens_per_tile=tokens_per_tile, per_token=per_token,
                           owner=owner, room=room, replicas=replicas)
            if progress is not None:
                progress(i)


def _step_replicas(meet: _Meeting, each: ReplicaScheduler, d: Samples, image_cost: np.ndarray, *, tokens_per_tile: int,
                   per_token: float, owner: np.ndarray, room: np.ndarray, replicas: int) -> None:
    """One step of :func:`_run_replicas`: every mode on every replica, each mode's step the slowest
    replica's (:func:`data_parallel_step`), the replicas' wait and imbalance kept."""
    m = meet.microbatches
    n = owner.size // replicas
    tokens = d.tokens(tokens_per_tile)
    c = np.stack([np.bincount(d.image_sample, weights=image_cost, minlength=len(d)), tokens * per_token], axis=1)
    per_mode: dict[str, list[float]] = {mode: [] for mode in REPLICA_MODES}
    picks = []
    for r in range(replicas):
        steps_r, pick = meet.modes(c[r * n:(r + 1) * n])
        picks.append(pick)
        for mode, t in steps_r.items():
            per_mode[mode].append(t)
    t0 = time.perf_counter()
    sb = balance_step(image_cost, d.image_sample, tokens, owner, replicas=replicas, microbatches=m, bubble=room)
    meet.dp_took.append(time.perf_counter() - t0)
    per_mode["balanced_dp"] = each.run(sb.slot_load / meet.mean).step_time.tolist()
    steps = {mode: data_parallel_step(v) for mode, v in per_mode.items()}
    meet.keep(steps, picks[int(np.argmax(per_mode["choice"]))])
    for mode, values in per_mode.items():
        meet.wait[mode].append(steps[mode] - float(np.mean(values)))
    meet.before.append(sb.imbalance_before)
    meet.after.append(sb.imbalance_after)
