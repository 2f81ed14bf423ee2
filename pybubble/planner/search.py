"""The planner (Optimus §4.2-4.4): the encoder's parallel plan and microbatch partition that give
the shortest MLLM step, found with the bubble predictor, the cost model and the core's scheduler.

Search. For every encoder plan (PP_enc dividing PP_llm, TP_enc dividing TP_llm; DP_enc = m · DP_llm
with m encoder pipelines per LLM replica) the planner lays out microbatch partitions over the m
pipelines, prunes those that do not fit in memory, schedules the rest with the core and keeps the
best. Two bounds cut the work:

- a plan's bound: ``horizon + max(0, (M · W - F) / L)``, with M microbatches of W compute each,
  F the compute-free time of its L lanes: the work that fits nowhere in the step must run outside
  it on some lane. A plan whose bound is no better than the best step so far is skipped whole.
- a partition's bound: ``horizon + max over lanes (work on the lane - free time on the lane)``.
  A partition whose bound is no better than the best step so far is not scheduled.

Coarse. Beside the search, every plan is also scheduled under coarse-grained exploitation only
(Optimus §4.3's first step, the ``coarse`` baseline): the encoder's forward before the LLM's work and
its backward after it on each rank, that is the same greedy filler restricted to each rank's
leading and trailing bubbles (:func:`edge_windows`: the DP all-gather and PP warm-up; the PP
cool-down and DP reduce-scatter), the rest outside the step. The plan's best is never worse than
its coarse schedule.

Partitions: all of them when there are few (at most ``EXHAUSTIVE`` compositions of M into m
parts), otherwise a local search from the even partition that moves one microbatch at a time
between pipelines, trying the moves in order of their bound, until no move improves the step.
Plans are searched on a thread pool (the scheduler releases the GIL).

Re-fill (:mod:`~pybubble.planner.refill`): at the end, the best ``REFILL`` plans' best layouts, and
the best layout of the one-stage plan of the lowest bound, are scheduled again with the holes filler
(policy ``holes``) and, for plans of one encoder stage, shared out anew by a linear program; each
keeps the shortest. Polish (:mod:`~pybubble.planner.polish`): where the best is such a shaped layout
more than 2% over the least bound, single images are moved off the pipelines that end last or start
first, within a budget. Justification: where the best was more than 2% over the least bound before
the polish, its schedule is justified (:func:`~pybubble.schedule.scheduler.justified`: each phase's
kernels packed towards the far end of the step and back), kept when shorter (weak_a 1,381.83 ->
1,379.95 ms, weak_b 1,491.82 -> 1,489.11; one justification, about 20 ms there). Times are
microseconds.

The parts, each in its module: the plans and what a scheduled layout is
(:mod:`~pybubble.planner.candidate`), one plan's bounds, memory and scheduling
(:mod:`~pybubble.planner.space`), one plan's layouts searched (:mod:`~pybubble.planner.partitions`)
and the other warm-up depths (:mod:`~pybubble.planner.warmup`); this module runs them over every
plan. Their public names are importable from here too.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from ..config.checks import integer
from ..config.schema import Config
from ..costs.memory import GB
from ..costs.roofline import CostModel
from ..llm.step import LLMStep, even_split
from ..llm.timeline import Timeline
from ..schedule.scheduler import justified
from .bound import StepBound
from .candidate import Candidate, encoder_plans, encoder_problem, encoder_tp_ok, encoder_work
from .polish import POLISH_GAP, polish_runs, polished
from .refill import REFILL, refilled
from .partitions import EXHAUSTIVE, SearchStats, plan_layouts, best_partition, compositions
from .space import SHARE_STEPS, PlanSpace, edge_windows, without_prefetch
from .warmup import WarmupTried, tune_warmup, warmup_variants


@dataclass(kw_only=True, slots=True)
class PlanSearched:
    """One encoder plan as the search left it."""

    plan: EncoderPlan
    """The encoder plan."""
    bound: StepBound
    """The lower bound on the step of any schedule of the plan on the LLM step."""
    states_fit: bool
    """Whether the LLM and the encoders' model states fit in memory under the plan (when they do
    not, no layout of the plan fits and the bound does not count)."""
    best: Candidate | None = None
    """Its best candidate, or None when the bounds pruned it or nothing of it fits in memory."""
    partition: Candidate | None = None
    """With ``search(optimus=True)`` and :attr:`partition_known`: its best partition of whole
    microbatches, :func:`best_partition`'s (None: no partition fits in memory)."""
    partition_known: bool = False
    """Whether :attr:`partition` is the plan's :func:`best_partition` on the searched step: the
    optimus search ran the plan's partitions with no other plan's partition pruning any of them."""




@dataclass(kw_only=True, slots=True)
class Search:
    """The result of :func:`search`."""

    step: LLMStep
    """The LLM step searched on."""
    best: Candidate
    """The shortest step found."""
    coarse: Candidate
    """The best plan under the coarse policy (encoder before and after the LLM), even partition."""
    top: list[Candidate] = field(default_factory=list)
    """The best candidate of each plan that the bounds did not prune, best first (the first
    ``keep`` of them are the best plans)."""
    stats: SearchStats = field(default_factory=SearchStats)
    """What the search did."""
    plans: list[PlanSearched] = field(default_factory=list)
    """Every encoder plan the config allows, in the order the search took them."""
    warmups: list[WarmupTried] = field(default_factory=list)
    """The warm-up depths tried after the search on the config's own (:func:`warmup_variants`)."""
    default_best: Candidate | None = None
    """The best candidate on the config's own LLM step (:attr:`best` unless a warm-up depth won)."""
    optimus: Candidate | None = None
    """With ``search(optimus=True)``: the best partition of whole microbatches on the config's own
    LLM step, the greedy filler in every bubble (Optimus as published, :func:`search`); else None."""

    @property
    def bound(self) -> StepBound | None:
        """The least lower bound of the plans whose model states fit, on the config's LLM step and
        on every warm-up depth tried: no schedule of any encoder plan in the bubbles of those steps
        is shorter (None when no plan's states fit)."""
        return _least_bound(self.plans, self.warmups)

    @property
    def config(self) -> Config:
        """The config searched."""
        return self.step.config

    @property
    def costs(self) -> CostModel:
        """The cost model used."""
        return self.step.costs

    @property
    def timeline(self) -> Timeline:
        """The LLM-only step."""
        return self.step.timeline

    @property
    def llm_memory_bytes(self) -> float:
        """The LLM's own memory on its busiest GPU (bytes)."""
        return float(self.step.memory.max())



def _plan_spaces(step: LLMStep) -> list[PlanSpace]:
    """Every encoder plan's space on `step`, the lowest plan bound first; among equal bounds the
    least encoder work (GPU time), which leaves the most room in the bubbles: a good incumbent early
    lets the bounds prune the rest. ValueError when no plan fits the LLM's stages or the LLM alone
    does not fit in memory."""
    config = step.config
    plans = encoder_plans(config)
    if not plans:
        raise ValueError("encoders: no encoder plan fits the LLM plan (too few layers for its stages?)")
    if step.memory.max() > config.memory_gb * GB:
        raise ValueError(f"memory_gb: the LLM alone needs {step.memory.max() / GB:.1f} GB on its busiest GPU, "
                         f"more than {config.memory_gb:g}")
    windows = {lps: step.encoder_windows(lps) for lps in {p.lanes_per_stage for p in plans}}
    edges = edge_windows(step.timeline)
    spaces = [PlanSpace(step, p, windows[p.lanes_per_stage], edges.repeated(p.lanes_per_stage)) for p in plans]
    spaces.sort(key=lambda s: (s.plan_bound(config.microbatches), s.gpu_work))
    return spaces


class _PlanRuns:
    """The plans searched, one run per plan on the search's threads, and what they share: the best
    candidate of each plan so far with its rank in the search's order (the incumbent to beat), the
    coarse candidates, the stats and how many plans are done."""

    def __init__(self, spaces: list[PlanSpace], microbatches: int, keep: int, spread: bool,
                 progress: Callable[[int, int], None] | None, optimus: bool = False):
        self.spaces, self.microbatches, self.keep, self.spread, self.progress = spaces, microbatches, keep, spread, progress
        self.optimus = optimus
        self.stats = SearchStats(plans=len(spaces))
        self.lock = threading.Lock()
        self.results: list[tuple[float, int, Candidate]] = []  # (step, the plan's rank, candidate)
        self.wholes: list[tuple[float, int, Candidate]] = []  # each plan's best partition (optimus)
        self.coarse: list[Candidate] = []
        self.done = 0
        self.rank = {id(space): r for r, space in enumerate(spaces)}
        self.searched = {id(space): PlanSearched(plan=space.plan, bound=space.step_bound, states_fit=space.states_fit)
                         for space in spaces}

    def incumbent(self) -> tuple[float, int]:
        """The (step, rank) to beat: the `keep`-th best plan's so far ((inf, 0) until there are that many)."""
        with self.lock:
            if len(self.results) < self.keep:
                return (math.inf, 0)
            return sorted((step, r) for step, r, _ in self.results)[self.keep - 1]

    def whole_incumbent(self) -> tuple[float, int]:
        """The (step, rank) of the best partition of whole microbatches so far ((inf, 0) until one)."""
        with self.lock:
            return min(((step, r) for step, r, _ in self.wholes), default=(math.inf, 0))

    def run(self, space: PlanSpace) -> None:
        """Searches one plan (unless its bound cannot beat the incumbent) and its even partition
        under the coarse policy, and records the result; with `optimus`, its best partition too."""
        microbatches = self.microbatches
        even = even_split(microbatches, space.plan.pipelines)
        memory = space.memory(even)
        fits = memory <= space.memory_limit
        base = space.candidate(even, coarse=True, memory=memory)
        r = self.rank[id(space)]
        whole_incumbent = self.whole_incumbent if self.optimus else None
        best = whole = None
        alone = False
        pruned = (space.plan_bound(microbatches), r) >= (whole_incumbent or self.incumbent)()
        if not pruned:
            best, whole, alone = plan_layouts(space, microbatches, self.incumbent, self.stats, self.lock,
                                               spread=self.spread, rank=r, whole_incumbent=whole_incumbent)
        searched = self.searched[id(space)]
        searched.partition, searched.partition_known = (whole, True) if self.optimus and alone else (None, False)
        best = _or_coarse(space, best, base, fits, r, self.incumbent)
        whole = _or_coarse(space, whole, base, fits, r, self.whole_incumbent) if self.optimus else None
        with self.lock:
            self.coarse.append(base)
            self.searched[id(space)].best = best
            if whole is not None:
                self.wholes.append((whole.step_time, r, whole))
            if best is not None:
                self.results.append((best.step_time, r, best))
            elif pruned:
                self.stats.plans_pruned += 1
            elif not fits:
                self.stats.plans_out_of_memory += 1
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, len(self.spaces))

    def run_all(self, workers: int) -> None:
        """Every plan, on `workers` threads (the scheduler releases the GIL)."""
        if workers > 1:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(self.run, self.spaces))
        else:
            for space in self.spaces:
                self.run(space)

    def ranked(self, memory_gb: float) -> list[Candidate]:
        """The plans' best candidates, best first (ties: the plan's rank); ValueError when no plan
        fits in `memory_gb` GB per GPU."""
        if not self.results:
            leanest = min(s.memory(even_split(self.microbatches, s.plan.pipelines)) for s in self.spaces)
            raise ValueError(f"memory_gb: no encoder plan fits in {memory_gb:g} GB per GPU (the leanest "
                             f"even partition needs {leanest / GB:.1f} GB)")
        return [cand for _, _, cand in sorted(self.results, key=lambda x: x[:2])]


def _or_coarse(space: PlanSpace, best: Candidate | None, base: Candidate, fits: bool, rank: int,
               incumbent: Callable[[], tuple[float, int]]) -> Candidate | None:
    """`best`, or the plan's coarse schedule `base` in every bubble when it fits and is shorter (or
    beats `incumbent` where `best` is None): the greedy filler is a heuristic, keep the better."""
    if fits and (base.step_time, rank) < ((best.step_time, rank) if best is not None else incumbent()):
        return space.in_every_bubble(base)
    return best


def search(step: LLMStep, *, workers: int = 2, progress: Callable[[int, int], None] | None = None,
           keep: int = 1, warmup: bool = True, spread: bool = True, optimus: bool = False,
           refill: bool = True, polish: bool = True, justify: bool = True) -> Search:
    """Finds the encoder plan and partition with the shortest step on the LLM step `step` (see the
    module docstring).

    `workers`: threads (the machine's cores are a good choice). `progress(done, total)` is called
    after each plan. `keep`: the bounds prune against the `keep`-th best plan so far, so that the
    best `keep` plans are all exact in :attr:`Search.top`. `warmup`: then try the best plan on other
    warm-up depths of the LLM's schedule (:func:`warmup_variants`); its best there replaces it in
    :attr:`Search.top` when shorter. `spread`: try the layouts that spread microbatches over every
    pipeline (False: partitions of whole microbatches only, and no shaped layout). `refill`: re-fill
    the best plans at the end (:mod:`~pybubble.planner.refill`; False: the greedy's schedules of the
    search's layouts). `polish`: then polish the best shaped layout (:mod:`~pybubble.planner.polish`;
    with `refill` and `spread` only). `justify`: then justify the best where it was more than 2% over
    the bound before the polish (with `refill` only; False: the holes filler's schedule as it is).
    `optimus`: also find
    :attr:`Search.optimus`, the best partition of whole microbatches on the config's schedule (the
    plans' partitions pruned against the best partition so far, not the best layout: the same step as
    ``search(step, spread=False, warmup=False, refill=False)``, the layouts the two share scheduled once); pybubble's
    plan is never longer than it. ValueError when no plan fits the LLM's stages or memory.
    """
    keep = integer(keep, "keep", minimum=1)
    t0 = time.perf_counter()
    config = step.config
    spaces = _plan_spaces(step)
    runs = _PlanRuns(spaces, config.microbatches, keep, spread, progress, optimus)
    runs.run_all(workers)
    top = runs.ranked(config.memory_gb)
    whole = min(runs.wholes, key=lambda x: x[:2], default=None)
    default_best = top[0]
    tried: list[WarmupTried] = []
    if warmup:
        tried, tuned = tune_warmup(step, spaces, default_best, runs.stats, spread)
        if tuned is not default_best:
            top[0] = tuned
    if refill:
        head = top[:REFILL]
        olds = _to_refill(top, default_best, list(runs.searched.values()) if spread else [])
        now = {id(old): new for old, new in zip(olds, refilled(olds, lambda c: _space_of(c, spaces, step), workers,
                                                               shape=spread))}
        for searched in runs.searched.values():  # each plan's best as the search leaves it
            searched.best = now.get(id(searched.best), searched.best)
        default_best = now.get(id(default_best), default_best)
        head = [now.get(id(c), c) for c in head]
        if default_best.step_time <= head[0].step_time:  # the warm-up no longer wins
            head[0] = default_best
        top = sorted(head + [now.get(id(c), c) for c in top[REFILL:]], key=lambda c: c.step_time)
    searched = [runs.searched[id(space)] for space in spaces]
    now = _tighten(searched, spaces, tried, step, top)
    if refill and spread and polish:
        now[id(top[0])] = _polish(now.get(id(top[0]), top[0]), searched, tried, spaces, step, workers)
    if refill and justify:
        now[id(top[0])] = _justify(now.get(id(top[0]), top[0]), searched, tried)
    top, default_best = [now.get(id(c), c) for c in top], now.get(id(default_best), default_best)
    runs.stats.seconds = time.perf_counter() - t0
    fitting = [c for c in runs.coarse if c.memory_bytes <= config.memory_gb * GB] or runs.coarse
    return Search(step=step, best=top[0], coarse=min(fitting, key=lambda c: (c.step_time, c.plan.pp_enc, c.plan.tp_enc)),
                  top=top, stats=runs.stats, plans=searched, warmups=tried,
                  default_best=default_best, optimus=None if whole is None else whole[2])


def _to_refill(top: list[Candidate], default_best: Candidate, searched: list[PlanSearched]) -> list[Candidate]:
    """The candidates the re-fill takes: of the best ``REFILL`` plans those that could still beat the
    best, the best plan on the config's schedule when a warm-up depth beat it, and the best of the
    one-stage plan of the lowest bound among `searched` (none when empty), whose shaped layout may
    win where its whole microbatches did not."""
    olds = [c for c in top[:REFILL] if c is top[0] or c.bound is None or c.bound.step_time < top[0].step_time]
    olds += [default_best] if top[0] is not default_best else []
    lowest = min((p for p in searched if p.plan.pp_enc == 1 and p.states_fit and p.best is not None
                  and p.bound.step_time < top[0].step_time), key=lambda p: p.bound.step_time, default=None)
    if lowest is not None and all(c.plan != lowest.plan for c in olds):
        olds.append(lowest.best)
    return olds


def _least_bound(plans: list[PlanSearched], warmups: list[WarmupTried]) -> StepBound | None:
    """The least bound of `plans` whose model states fit and of `warmups` (:attr:`Search.bound`)."""
    fitting = [p.bound for p in plans if p.states_fit] + [w.bound for w in warmups if w.bound]
    return min(fitting, key=lambda b: b.step_time) if fitting else None


def _space_of(c: Candidate, spaces: list[PlanSpace], step: LLMStep) -> PlanSpace:
    """`c`'s plan on `c`'s LLM step (`spaces`: every plan's on `step`)."""
    space = next(s for s in spaces if s.plan == c.plan)
    return space if c.step is None or c.step is step else PlanSpace(c.step, c.plan, like=space)


def _polish(best: Candidate, searched: list[PlanSearched], tried: list[WarmupTried], spaces: list[PlanSpace],
            step: LLMStep, workers: int) -> Candidate:
    """`best` polished (:func:`~pybubble.planner.polish.polished`) against the least bound (the
    search's :attr:`Search.bound`); its plan's best follows it."""
    least = _least_bound(searched, tried)
    if least is None or not polish_runs(best, least.step_time):
        return best
    got = polished(best, _space_of(best, spaces, step), least.step_time, workers)
    for p in searched:
        if p.best is best:
            p.best = got
    return got


def _justify(best: Candidate, searched: list[PlanSearched], tried: list[WarmupTried]) -> Candidate:
    """`best`'s schedule justified (:func:`~pybubble.schedule.scheduler.justified`) where it was more
    than :data:`~pybubble.planner.polish.POLISH_GAP` over the least bound (the search's
    :attr:`Search.bound`) before the polish, and the justified one is shorter; its plan's best
    follows it."""
    least = _least_bound(searched, tried)
    was = best.polished_from if best.polished_from is not None else best.step_time
    if least is not None and was <= (1.0 + POLISH_GAP) * least.step_time:
        return best
    schedule = justified(best.problem, best.schedule)
    if schedule.step_time >= best.step_time:
        return best
    got = replace(best, schedule=schedule, justified_from=best.step_time)
    for p in searched:
        if p.best is best:
            p.best = got
    return got


def _tighten(searched: list[PlanSearched], spaces: list[PlanSpace], tried: list[WarmupTried], step: LLMStep,
             top: list[Candidate]) -> dict[int, Candidate]:
    """The least bounds (each plan's that fits, each warm-up depth's plans') tightened by whole
    images (:meth:`PlanSpace.whole_image_bound`), lowest first, while below the best step (`top[0]`)
    and the least tightened so far: the least of all bounds is then a tightened one, for a few
    plans' piece costs. Sets the plans' and the warm-ups' bounds; returns each candidate of `top`
    and of the plans whose plan was tightened on its LLM step, with that bound, by its old id."""
    entries = [(p.bound, step, space) for p, space in zip(searched, spaces) if p.states_fit]
    entries += [(b, w.step, s) for w in tried for s, b in w.plan_bounds]
    least, tight = top[0].step_time, {}
    for bound, on, space in sorted(entries, key=lambda e: e[0].step_time):
        if bound.step_time >= least:
            break
        got = space.whole_image_bound() if on is step else space.whole_image_bound((on, bound))
        tight[(id(on), space.plan.pp_enc, space.plan.tp_enc)] = got
        least = min(least, got.step_time)
    for p in searched:
        p.bound = tight.get((id(step), p.plan.pp_enc, p.plan.tp_enc), p.bound)
    for w in tried:
        if w.plan_bounds:
            w.bound = min((tight.get((id(w.step), s.plan.pp_enc, s.plan.tp_enc), b) for s, b in w.plan_bounds),
                          key=lambda b: b.step_time)
    now = {}
    for c in top + [p.best for p in searched if p.best is not None]:
        got = tight.get((id(c.step if c.step is not None else step), c.plan.pp_enc, c.plan.tp_enc))
        if got is not None:
            now[id(c)] = replace(c, bound=got)
    for p in searched:
        p.best = now.get(id(p.best), p.best)
    return now

__all__ = ["EXHAUSTIVE", "REFILL", "SHARE_STEPS", "Candidate", "PlanSearched", "Search", "SearchStats", "WarmupTried",
           "best_partition", "warmup_variants", "without_prefetch", "compositions", "edge_windows", "encoder_plans",
           "encoder_problem", "encoder_tp_ok", "encoder_work", "search"]
