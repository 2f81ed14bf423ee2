"""Which change to the greedy filler closes part of its gap to the CP-SAT schedule (issue 41), measured.

The shipped greedy (``csrc/pybubble/scheduler.cc``; its twin ``pybubble.testing.reference``) keeps one
cursor per (lane, resource) that only moves forward (forward phase) or backward (backward phase), so
the part of a window that one microbatch's chain passes over is lost to the next microbatch. This
script schedules the same problems with prototype fillers written here in Python and compares their
steps with the shipped greedy, the CP-SAT optimum (small instances only) and the bounds:

- ``holes``: the greedy's algorithm (same microbatch orders, the same whole-or-longest-part rule, the
  same assignment rule) with each cursor replaced by the list of free intervals left on its (lane,
  resource): every task goes to the earliest (forward) or latest (backward) free interval that holds
  it, so later microbatches reuse the holes earlier ones left. The parts outside the step go into the
  same free lists extended by (-inf, 0) and (horizon, inf).
- ``holes`` in other orders: ``fwd alap`` places the forwards from the latest forward_needed down,
  each its longest suffix that fits as late as possible (the mirror of the greedy's backward);
  ``bwd asap`` the backwards from the earliest grad_ready up, each its longest prefix that fits as
  early as possible (the mirror of the greedy's forward); ``both`` the two. ``out cursor``: the parts
  outside the step placed with the greedy's cursors (ablation). ``whole 1st``: a first pass places
  only the microbatches that fit whole, a second the longest parts of the others.
- ``justify``: a post-pass on any valid schedule (double justification): the forward tasks, latest
  end first, each moved as late as its successors, its deadline and the free time allow; the
  backward tasks, earliest start first, each moved as early as its predecessors, grad_ready and the
  free time allow; repeated while the step shrinks. Tasks outside the step move into free time inside
  it, and the rest close up towards the step.
- ``portfolio``: the best of the shipped greedy and ``holes`` in three orders (greedy's, fwd alap,
  both); ``+justify`` after it.
- ``holes, every assignment`` (at most 5 microbatches): ``holes`` (fwd alap, backward either way)
  under every assignment of encoder to LLM microbatches, instead of the forward finish order.

``--search`` re-runs the planner's search (``pybubble.planner.search.search``) with the planner's
filler (``pybubble.planner.space.schedule_problem``, patched in this process only) replaced by
``portfolio``, so that the layout is chosen under the better filler; and, cheaper, re-fills each
plan's best layout of the shipped search.

Since the shipped search re-fills its best plans with ``holes`` (policy ``holes`` in the core, the
same algorithm; ``pybubble.planner.search.REFILL``), its "greedy (shipped)" rows of the settings are
``holes`` where that was shorter; the figures in bench/results/filler_gap.txt predate it.

Every schedule is checked with :func:`pybubble.validate`; a schedule that does not validate is
reported as such and not counted. Bounds: the plan's (``Candidate.bound``, the planner's fluid bound;
for the settings the search's ``bound``), and a per-candidate one computed here (``lane bound``):
with the candidate's tasks fixed on their lanes, each lane's forward work (compute, and separately
communication) of the microbatches feeding the first k LLM microbatches fits in its free time before
the k-th forward_needed plus the growth before 0, and likewise its backward after grad_ready
(microbatch j feeding LLM microbatch j). It is a bound for that layout only, and ignores the
dependencies between lanes (an encoder stage waiting for the one before).

    python bench/filler_gap.py [--small] [--real] [--search] [--budget 30] [--max-tasks 1400] [--setting weak_b ...]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
import os
import sys
import time
from collections.abc import Callable

import numpy as np

import pybubble
from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner.search import search
from pybubble.problem.problem import Problem
from pybubble.schedule.scheduler import Schedule, schedule_problem
from pybubble.testing.holes import Free as _Free, Holes, earliest as _earliest, latest as _latest, merged as _merged
from pybubble.testing.holes import SLIVER, rest as _rest, take as _take
from pybubble.testing.reference import _Twin

# the small instances of bench/plan_gap.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_gap import SHAPES, candidates, instance

INF = math.inf

SETTINGS = ["weak_a", "weak_b", "weak_c", "weak_d", "dual_1", "dual_2", "dual_3", "a100_vit3b_gpt11b"]
"""The examples/optimus settings above 2% of their bound (docs/reproduction.md)."""


# ---------------------------------------------------------------------------------------------
# Free intervals of one (lane, resource): two sorted lists, starts and ends (pybubble.testing.holes's),
# and what the justify pass adds to them.

def _remove(S: list[float], E: list[float], s: float, e: float) -> None:
    """Takes [s, e) out of whatever free intervals it meets (a placed task's time, which may
    overlap a neighbour's by rounding)."""
    i = max(0, bisect.bisect_right(S, s) - 1)
    while i < len(S) and S[i] < e:
        if E[i] <= s:
            i += 1
            continue
        ps, pe = _rest(S[i], E[i], s, e)
        S[i:i + 1] = ps
        E[i:i + 1] = pe
        i += len(ps)


def _give(S: list[float], E: list[float], s: float, d: float) -> None:
    """Gives [s, s + d) back (it was taken), merging with touching free intervals."""
    if d <= 0.0:
        return
    e = s + d
    i = bisect.bisect_left(S, s)
    # merge with the interval before (ending at s) and after (starting at e)
    left = i > 0 and E[i - 1] >= s - SLIVER
    right = i < len(S) and S[i] <= e + SLIVER
    if left and right:
        E[i - 1] = E[i]
        del S[i], E[i]
    elif left:
        E[i - 1] = max(E[i - 1], e)
    elif right:
        S[i] = min(S[i], s)
    else:
        S.insert(i, s)
        E.insert(i, e)


# ---------------------------------------------------------------------------------------------
# Prototype 1: the greedy with free lists instead of cursors.

class _Holes(Holes):
    """The package's holes filler (:class:`pybubble.testing.holes.Holes`: the reference scheduler's
    algorithm, every cursor replaced by the free intervals left), with the options of this study."""

    def fwd_in_step(self, j: int, first: int, free: _Free) -> _Free | None:
        """j's forward tasks from position `first` on (:meth:`Holes._in_step`)."""
        return self._in_step(j, 0, self.tasks[(j, 0)][first:], free)

    def bwd_in_step(self, j: int, last: int, free: _Free) -> _Free | None:
        """j's backward tasks before position `last`, backwards (:meth:`Holes._in_step`)."""
        return self._in_step(j, 1, list(reversed(self.tasks[(j, 1)][:last])), free)

    def fwd_one(self, j: int, free: _Free, mode: str, partial: bool) -> tuple[_Free, int] | None:
        """Microbatch j's forward inside the step ("asap": whole as early as possible, else its
        longest suffix that fits; "alap": its longest suffix that fits, as late as possible; with
        `partial` False, whole only): (free lists, first position inside), or None."""
        n = len(self.tasks[(j, 0)])
        if mode == "asap":
            trial = self.fwd_in_step(j, 0, free)
            if trial is not None or not partial:
                return None if trial is None else (trial, 0)
        f, probe, pstart = self.fwd_suffix(j, free)
        if f == n or (f > 0 and not partial):
            return None
        trial = self.fwd_in_step(j, f, free) if mode == "asap" else None
        if trial is None:  # keep the probe's own placement of the suffix (valid: it fits)
            trial = probe
            for t in self.tasks[(j, 0)][f:]:
                self._place(t, pstart[t])
        return trial, f

    def bwd_one(self, j: int, free: _Free, mode: str, partial: bool) -> tuple[_Free, int] | None:
        """The mirror of :meth:`fwd_one` for j's backward: (free lists, count inside), or None."""
        n = len(self.tasks[(j, 1)])
        if mode == "alap":
            trial = self.bwd_in_step(j, n, free)
            if trial is not None or not partial:
                return None if trial is None else (trial, n)
        last, probe, pend = self.bwd_prefix(j, free)
        if last == 0 or (last < n and not partial):
            return None
        trial = self.bwd_in_step(j, last, free) if mode == "alap" else None
        if trial is None:
            trial = probe
            for t in self.tasks[(j, 1)][:last]:
                self._place(t, pend[t] - self.dur[t])
        return trial, last

    @staticmethod
    def _each(order, whole_first, done, one, free, reached):
        """`one(j, free, partial)` for each microbatch of `order` not `done` (whole ones first when
        `whole_first`); where it placed something, the free lists and ``reached[j]`` it gives."""
        for partial in ([False, True] if whole_first else [True]):
            for j in order:
                if not done(j):
                    got = one(j, free, partial)
                    if got is not None:
                        free, reached[j] = got
        return free

    def run(self, fwd: str = "asap", bwd: str = "alap", whole_first: bool = False,
            cursor_outside: bool = False, assignment=None) -> Schedule:
        """`fwd`: "asap" (the greedy's: microbatches by increasing forward_needed, each whole as
        early as possible, else its longest suffix that fits) or "alap" (by decreasing
        forward_needed, each its longest suffix that fits as late as possible). `bwd`: "alap" (the
        greedy's: by decreasing grad_ready, each whole as late as possible, else its longest
        prefix that fits) or "asap" (by increasing grad_ready, each its longest prefix that fits as
        early as possible). `whole_first`: a first pass places only the microbatches that fit
        whole, a second pass the longest parts of the others. `cursor_outside`: the tasks outside the
        step placed as the greedy places them (one cursor per lane and resource from 0 down and from
        the horizon up) instead of into the free lists. `assignment`: the LLM microbatch each encoder
        microbatch feeds, fixed (None: the greedy's rule, forward finish order after the forward)."""
        m = self.m
        free = _Free({k: _merged(w) for k, w in self.windows.items()})
        fwd_first = [len(self.tasks[(j, 0)]) for j in range(m)]
        if assignment is not None:
            self.assignment = [int(k) for k in assignment]
        order = sorted(range(m), key=lambda j: (self.fn[self.assignment[j]], j), reverse=fwd == "alap")
        free = self._each(order, whole_first, lambda j: fwd_first[j] == 0,
                          lambda j, f, partial: self.fwd_one(j, f, fwd, partial), free, fwd_first)
        # the forward not inside: latest first, each as late as its successors allow, into the
        # free lists with (-inf, 0) added
        for k in free.lists:
            S, E = free.mut(k)
            if S and S[0] <= 0.0:
                S[0] = -INF
            else:
                S.insert(0, -INF)
                E.insert(0, 0.0)
        front = {k: 0.0 for k in free.lists}
        for j in reversed(range(m)):
            for t in reversed(self.tasks[(j, 0)][:fwd_first[j]]):
                late = min([self.fn[self.assignment[j]]] + [self.start[s] for s in self.succs[t]])
                if cursor_outside:  # the greedy's rule: before the lane's earlier placed task
                    late = min(late, front[self.key[t]], 0.0)
                S, E = free.mut(self.key[t])
                i, s = _latest(S, E, late, self.dur[t], -INF)
                _take(S, E, i, s, self.dur[t])
                front[self.key[t]] = s
                self.start[t], self.end[t] = s, s + self.dur[t]
                self.inside[t] = s >= 0.0
        if assignment is None:
            self.assign()
        # backward
        for k in free.lists:  # drop (-inf, 0) again
            S, E = free.mut(k)
            if S and S[0] == -INF:
                if E[0] > 0.0:
                    S[0] = 0.0
                else:
                    del S[0], E[0]
        order = sorted(range(m), key=lambda j: (self.gr[self.assignment[j]], j), reverse=bwd == "alap")
        bwd_last = [0] * m
        free = self._each(order, whole_first, lambda j: bwd_last[j] == len(self.tasks[(j, 1)]),
                          lambda j, f, partial: self.bwd_one(j, f, bwd, partial), free, bwd_last)
        for k in free.lists:
            S, E = free.mut(k)
            if S and E[-1] >= self.horizon:
                E[-1] = INF
            else:
                S.append(self.horizon)
                E.append(INF)
        back = {k: self.horizon for k in free.lists}
        for j in range(m):
            ready = self.gr[self.assignment[j]]
            for t in self.tasks[(j, 1)][bwd_last[j]:]:
                early = max([ready] + [self.end[p] for p in self.preds[t]])
                if cursor_outside:
                    early = max(early, back[self.key[t]])
                S, E = free.mut(self.key[t])
                i, s = _earliest(S, E, early, self.dur[t], INF)
                _take(S, E, i, s, self.dur[t])
                self.start[t], self.end[t] = s, s + self.dur[t]
                back[self.key[t]] = s + self.dur[t]
        return self.schedule()


def holes(problem: Problem, fwd: str = "asap", bwd: str = "alap", whole_first: bool = False,
          cursor_outside: bool = False, assignment=None) -> Schedule:
    """Prototype 1 (see the module's notes; the options: :meth:`_Holes.run`'s)."""
    return _Holes(problem).run(fwd, bwd, whole_first, cursor_outside, assignment)


# ---------------------------------------------------------------------------------------------
# Prototype 2: double justification of a valid schedule.

def justify(problem: Problem, sched: Schedule, rounds: int = 4) -> Schedule:
    """Prototype 2 (see the module's notes): forward tasks pushed late, backward tasks pulled
    early, each into the free time its neighbours and deadlines allow; `rounds` at most."""
    tw = _Twin(problem)
    n = len(tw.dur)
    start = [float(x) for x in sched.start]
    assign = [int(x) for x in sched.assignment]
    dur, key = tw.dur, tw.key
    t_ = problem.arrays().tasks
    mb = [int(x) for x in t_.microbatch]
    phase = [int(x) for x in t_.phase]
    succs_all: list[list[int]] = [[] for _ in range(n)]
    for t in range(n):
        for p in tw.preds[t]:
            succs_all[p].append(t)
    # free lists over the whole line: windows, (-inf, 0), (horizon, inf), less every task
    free = {}
    for k, w in tw.windows.items():
        S, E = _merged([(-INF, 0.0)] + list(w) + [(tw.horizon, INF)])
        free[k] = (S, E)
    by_key: dict[int, list[int]] = {}
    for t in range(n):
        by_key.setdefault(key[t], []).append(t)
    for k, ts in by_key.items():
        S, E = free[k]
        for t in sorted(ts, key=lambda t: start[t]):
            if dur[t] > 0.0:
                _remove(S, E, start[t], start[t] + dur[t])

    def step_of() -> float:
        return max([tw.horizon] + [start[t] + dur[t] for t in range(n)]) - min([0.0] + start)

    best = step_of()
    fwd = [t for t in range(n) if phase[t] == 0]
    bwd = [t for t in range(n) if phase[t] == 1]
    for _ in range(rounds):
        for t in sorted(fwd, key=lambda t: (start[t] + dur[t], t), reverse=True):
            late = min([tw.fn[assign[mb[t]]]] + [start[s] for s in succs_all[t]])
            if late <= start[t] + dur[t]:
                continue
            S, E = free[key[t]]
            _give(S, E, start[t], dur[t])
            i, s = _latest(S, E, late, dur[t], -INF)
            _take(S, E, i, s, dur[t])
            start[t] = s
        for t in sorted(bwd, key=lambda t: (start[t], t)):
            early = max([tw.gr[assign[mb[t]]]] + [start[p] + dur[p] for p in tw.preds[t]])
            if early >= start[t]:
                continue
            S, E = free[key[t]]
            _give(S, E, start[t], dur[t])
            i, s = _earliest(S, E, early, dur[t], INF)
            _take(S, E, i, s, dur[t])
            start[t] = s
        now = step_of()
        if now >= best - 1e-6:
            best = min(best, now)
            break
        best = now
    first = min([0.0] + start)
    last = max([tw.horizon] + [start[t] + dur[t] for t in range(n)])
    return Schedule(step_time=last - first, shift_front=-first, shift_back=last - tw.horizon,
                    start=np.array(start, np.float64), assignment=np.array(assign, np.int64))


# ---------------------------------------------------------------------------------------------
# A bound of the candidate's own layout: each lane's compute, fluid, before the deadlines.

def lane_bound(problem: Problem) -> tuple[float, float, float]:
    """(step, front, back) of the fluid bound with the tasks fixed on their lanes (see the module's
    notes), over each lane's compute and its communication, microbatch j feeding LLM microbatch j."""
    a = problem.arrays()
    t = a.tasks
    H = float(a.horizon)
    F, B = np.asarray(a.forward_needed), np.asarray(a.grad_ready)
    m = len(F)
    front = back = 0.0
    for res, W in ((0, a.compute_free), (1, a.link_free)):
        for lane in range(a.num_lanes):
            ws, we = W.start[W.offset[lane]:W.offset[lane + 1]], W.end[W.offset[lane]:W.offset[lane + 1]]
            sel = (t.lane == lane) & (t.resource == res)
            f_sel, b_sel = sel & (t.phase == 0), sel & (t.phase == 1)
            fw = np.bincount(t.microbatch[f_sel], weights=t.duration[f_sel], minlength=m)
            bw = np.bincount(t.microbatch[b_sel], weights=t.duration[b_sel], minlength=m)
            need = 0.0
            for k in np.argsort(F, kind="stable"):
                need += fw[k]
                front = max(front, need - float(np.clip(np.minimum(we, F[k]) - ws, 0.0, None).sum()))
            need = 0.0
            for k in np.argsort(-B, kind="stable"):
                need += bw[k]
                back = max(back, need - float(np.clip(we - np.maximum(ws, B[k]), 0.0, None).sum()))
    return H + front + back, front, back


# ---------------------------------------------------------------------------------------------

def best_assignment(problem: Problem, greedy: Schedule) -> Schedule:
    """``holes`` (forward "alap", backward either way) under every assignment of the encoder
    microbatches to the LLM's, the shortest valid one (small problems only: m! x 2 runs)."""
    best = greedy
    for perm in itertools.permutations(range(problem.num_microbatches)):
        for bwd in ("alap", "asap"):
            s = holes(problem, "alap", bwd, assignment=perm)
            if s.step_time < best.step_time - 1e-6 and not pybubble.validate(problem, s):
                best = s
    return best


FILLERS: dict[str, Callable[[Problem, Schedule], Schedule]] = {
    "holes": lambda p, g: holes(p),
    "holes, fwd alap": lambda p, g: holes(p, "alap", "alap"),
    "holes, bwd asap": lambda p, g: holes(p, "asap", "asap"),
    "holes, both": lambda p, g: holes(p, "alap", "asap"),
    "holes, out cursor": lambda p, g: holes(p, cursor_outside=True),
    "holes, whole 1st": lambda p, g: holes(p, whole_first=True),
    "justify": lambda p, g: justify(p, g),
    "holes+justify": lambda p, g: justify(p, holes(p)),
    "portfolio": lambda p, g: portfolio(p, g),
    "portfolio+justify": lambda p, g: justify(p, portfolio(p, g)),
}
"""The prototypes compared (each takes the problem and the shipped greedy's schedule)."""



ROWS: list[tuple] = []
"""One summary row per problem compared: (name, greedy, {filler: step or None when invalid}, CP-SAT,
plan bound, lane bound)."""


def compare(name: str, problem: Problem, greedy: Schedule, plan_bound: float, exact=None) -> None:
    """One line per filler on `problem` (and, with at most 5 microbatches, ``holes`` under every
    assignment)."""
    lb, lf, lbk = lane_bound(problem)
    bad = pybubble.validate(problem, greedy)
    head = (f"  {name}: {problem.num_tasks} tasks; plan bound {plan_bound / 1e3:.2f} ms, lane bound {lb / 1e3:.2f} ms "
            f"(front {lf / 1e3:.2f} back {lbk / 1e3:.2f})")
    if exact is not None:
        head += (f"; CP-SAT {exact.step_time / 1e3:.2f} ms "
                 f"({'optimal' if exact.optimal else f'not proved, >= {exact.bound / 1e3:.2f}'})")
    print(head, flush=True)
    print(f"    {'greedy (shipped)':<22} {greedy.step_time / 1e3:10.2f} ms  front {greedy.shift_front / 1e3:8.2f}  back "
          f"{greedy.shift_back / 1e3:8.2f}  {greedy.step_time / plan_bound - 1:+7.2%} over plan bound"
          + (f", {greedy.step_time / exact.step_time - 1:+7.2%} over CP-SAT" if exact is not None else "")
          + ("" if not bad else f"  INVALID ({len(bad)}: {bad[0]})"), flush=True)
    fillers = dict(FILLERS)
    if problem.num_microbatches <= 5:
        fillers["holes, every assignment"] = best_assignment
    steps: dict[str, float | None] = {}
    for fname, fill in fillers.items():
        t0 = time.process_time()
        s = fill(problem, greedy)
        cpu = time.process_time() - t0
        bad = pybubble.validate(problem, s)
        steps[fname] = None if bad else s.step_time
        line = (f"    {fname:<22} {s.step_time / 1e3:10.2f} ms  front {s.shift_front / 1e3:8.2f}  back {s.shift_back / 1e3:8.2f}"
                f"  {s.step_time / plan_bound - 1:+7.2%} over plan bound, {s.step_time / greedy.step_time - 1:+7.2%} vs greedy"
                + (f", {s.step_time / exact.step_time - 1:+7.2%} over CP-SAT" if exact is not None else "")
                + f"  [{cpu:.1f} s CPU]")
        line += "  valid" if not bad else f"  INVALID ({len(bad)} violations, e.g. {bad[0]})"
        print(line, flush=True)
    ROWS.append((name, greedy.step_time, steps, None if exact is None else exact.step_time, plan_bound, lb))


def summary(title: str) -> None:
    """The rows so far as one table (ms; the shortest valid prototype; % of greedy), then cleared."""
    print(f"\n-- summary: {title} (ms)")
    print(f"  {'instance':<44} {'greedy':>9} {'holes':>9} {'portfolio':>9} {'pf+just.':>9} {'best':>9} {'best is':<24} "
          f"{'CP-SAT':>9} {'plan bnd':>9} {'lane bnd':>9}")
    for name, g, steps, ex, pb, lb in ROWS:
        valid = {k: v for k, v in steps.items() if v is not None}
        bk = min(valid, key=valid.get) if valid else "-"
        def f(x):
            return f"{x / 1e3:9.2f}" if x is not None else f"{'-':>9}"
        print(f"  {name[:44]:<44} {f(g)} {f(steps.get('holes'))} {f(steps.get('portfolio'))} "
              f"{f(steps.get('portfolio+justify'))} {f(valid.get(bk))} {bk:<24} {f(ex)} {f(pb)} {f(lb)}")
    ROWS.clear()


def small(budget: float, max_tasks: int) -> None:
    from pybubble.testing.exact import optimum
    print("== small instances (bench/plan_gap.py's shapes; every plan's best, pybubble's and the optimus row)")
    for shape in SHAPES:
        step = LLMStep.of(load_config(instance(shape)))
        found = search(step, warmup=False, optimus=True, workers=1)
        print(f"{shape}: {SHAPES[shape]}; LLM alone {step.timeline.step_time / 1e3:.2f} ms", flush=True)
        for name, cand in candidates(found, True):
            exact = None
            if cand.problem.num_tasks <= max_tasks and budget > 0:
                exact = optimum(cand.problem, scale=1.0, round_times=True, max_deterministic_time=budget, workers=1)
            layout = f"spread {cand.spread}" if any(cand.spread) else f"partition {cand.partition}"
            compare(f"{shape} {name} ({cand.plan.pp_enc}x{cand.plan.tp_enc}, {layout})", cand.problem, cand.schedule,
                    cand.bound.step_time, exact)
    summary("small instances; CP-SAT with 1 worker")


def real(settings: list[str], examples: str) -> None:
    print("== the settings' best candidates (pybubble.planner.search.search(LLMStep.of(cfg)).best)")
    for s in settings:
        step = LLMStep.of(load_config(os.path.join(examples, f"{s}.yaml")))
        found = search(step, workers=1)
        b = found.best
        layout = f"spread {b.spread}" if any(b.spread) else f"partition {b.partition}"
        print(f"{s}: LLM alone {step.timeline.step_time / 1e3:.2f} ms, search bound {found.bound.step_time / 1e3:.2f} ms; "
              f"best plan PP_enc {b.plan.pp_enc} TP_enc {b.plan.tp_enc}, {layout}", flush=True)
        compare(f"{s} best", b.problem, b.schedule, found.bound.step_time)
    summary("the settings' best candidates; plan bound = the search's bound")


def portfolio(problem: Problem, greedy: Schedule | None = None) -> Schedule:
    """The shortest valid schedule of the shipped greedy and ``holes`` in three orders: the greedy's
    (forward "asap", backward "alap"), forward "alap", and forward "alap" with backward "asap" (a
    filler that runs a few orders and keeps the best)."""
    best = greedy if greedy is not None else schedule_problem(problem)
    for fwd, bwd in (("asap", "alap"), ("alap", "alap"), ("alap", "asap")):
        s = holes(problem, fwd, bwd)
        if s.step_time < best.step_time - 1e-6 and not pybubble.validate(problem, s):
            best = s
    return best


def searched(settings: list[str], examples: str) -> None:
    """The planner's search with the filler replaced by :func:`portfolio` (every candidate it
    schedules), against the shipped search."""
    from pybubble.planner import space

    print("== the search re-run with the filler replaced by `portfolio` (every candidate it schedules)")
    shipped = space.schedule_problem

    def patched(problem: Problem, policy: str = "greedy", *, fixed_assignment: bool = False) -> Schedule:
        g = shipped(problem, policy, fixed_assignment=fixed_assignment)
        return portfolio(problem, g) if policy == "greedy" and not fixed_assignment else g

    rows = []
    for s in settings:
        step = LLMStep.of(load_config(os.path.join(examples, f"{s}.yaml")))
        t0 = time.process_time()
        base = search(step, workers=1)
        t1 = time.process_time()
        space.schedule_problem = patched
        try:
            found = search(step, workers=1)
        finally:
            space.schedule_problem = shipped
        t2 = time.process_time()
        bound = base.bound.step_time
        for name, f, cpu in (("shipped search", base, t1 - t0), ("portfolio search", found, t2 - t1)):
            b = f.best
            layout = f"spread {b.spread}" if any(b.spread) else f"partition {b.partition}"
            bad = pybubble.validate(b.problem, b.schedule)
            print(f"  {s:<18} {name:<17} {b.step_time / 1e3:9.2f} ms {b.step_time / bound - 1:+7.2%} over the bound "
                  f"{bound / 1e3:.2f} ms; PP_enc {b.plan.pp_enc} TP_enc {b.plan.tp_enc} {layout}, {b.problem.num_tasks} "
                  f"tasks, lane bound {lane_bound(b.problem)[0] / 1e3:.2f} ms; {'valid' if not bad else 'INVALID'} "
                  f"[{cpu:.0f} s CPU]", flush=True)
        # cheaper: the shipped search, then each plan's best layout re-filled
        refill = min(((portfolio(pl.best.problem, pl.best.schedule), pl) for pl in base.plans if pl.best is not None),
                     key=lambda x: x[0].step_time)
        print(f"  {s:<18} {'re-fill plan bests':<17} {refill[0].step_time / 1e3:9.2f} ms "
              f"{refill[0].step_time / bound - 1:+7.2%} over the bound; PP_enc {refill[1].plan.pp_enc} TP_enc "
              f"{refill[1].plan.tp_enc}", flush=True)
        b = found.best
        j = justify(b.problem, b.schedule)
        bad = pybubble.validate(b.problem, j)
        print(f"  {s:<18} {'+ justify':<17} {j.step_time / 1e3:9.2f} ms {j.step_time / bound - 1:+7.2%} over the bound; "
              f"{j.step_time / base.best.step_time - 1:+.2%} against the shipped search; {'valid' if not bad else 'INVALID'}",
              flush=True)
        rows.append((s, bound, base.best.step_time, refill[0].step_time, found.best.step_time,
                     j.step_time if not bad else None, lane_bound(found.best.problem)[0], t2 - t1))
    print("\n-- summary: the search (ms; % over the search's bound)")
    print(f"  {'setting':<18} {'bound':>9} {'shipped':>17} {'re-fill bests':>17} {'pf search':>17} {'+ justify':>17} "
          f"{'its lane bnd':>12} {'CPU s':>6}")
    for s, bound, *steps, lb, cpu in rows:
        cells = " ".join(f"{x / 1e3:9.2f} {x / bound - 1:+6.2%}" if x is not None else f"{'-':>17}" for x in steps)
        print(f"  {s:<18} {bound / 1e3:9.2f} {cells} {lb / 1e3:12.2f} {cpu:6.0f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="the small instances of bench/plan_gap.py")
    p.add_argument("--real", action="store_true", help="the settings' best candidates")
    p.add_argument("--search", action="store_true", help="the settings' search re-run with the prototype filler")
    p.add_argument("--setting", action="append", help="these settings only (default: the 8 above 2%%)")
    p.add_argument("--budget", type=float, default=30.0, help="CP-SAT's budget per small candidate (deterministic units; 0: none)")
    p.add_argument("--max-tasks", type=int, default=1400, help="CP-SAT on small candidates of at most this many tasks")
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    if a.small:
        small(a.budget, a.max_tasks)
    if a.real:
        real(a.setting or SETTINGS, os.path.join(here, "..", "examples", "optimus"))
    if a.search:
        searched(a.setting or SETTINGS, os.path.join(here, "..", "examples", "optimus"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
