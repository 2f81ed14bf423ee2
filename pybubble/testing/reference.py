"""The bubble scheduler in plain Python: slow and obvious, a twin of the C++ core's algorithm.

Used only by the differential tests (the core must return exactly the same schedule) and by the
benchmark that measures the core's speed-up. Nothing else imports it.

The algorithm (see docs/scheduler.md):

1. Forward, greedy only: for each encoder microbatch j in increasing order, try to place its forward
   tasks inside the step, in increasing id order, each as early as possible: after its
   predecessors, after the previous task on its lane and resource, in the first window that holds
   it whole, ending by forward_needed[j]. If one task cannot, undo microbatch j and move only the
   longest suffix of its tasks that fits (found by a probe that places the tasks backwards, each
   as late as possible), placed again as early as possible.
2. Forward tasks not placed go before 0: microbatches in decreasing order, tasks in decreasing id
   order, each as late as possible before its successors and the lane's earlier placed task.
3. Assignment: the k-th microbatch to finish its forward feeds LLM microbatch k, if every
   forward_needed holds that way; otherwise the identity.
4. Backward, greedy only: windows less the forward tasks placed in them; microbatches by decreasing
   grad_ready of the LLM microbatch they feed (ties: decreasing j), tasks in decreasing id order,
   each as late as possible, starting at or after grad_ready; if a microbatch does not fit, move
   only the longest prefix of its tasks that fits (a probe placing them forwards, each as early as
   possible), placed again as late as possible.
5. Backward tasks not placed go after the horizon: microbatches in increasing order, tasks in
   increasing id order, each as early as possible.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ..costs.kernels import RESOURCES
from ..problem.problem import Problem
from ..schedule.scheduler import Schedule, check_policy


def _earliest_fit(wins, w, last, ready, d, limit):
    """The first window from index w to `last` that holds a task of length d starting at or after
    `ready` and ending by `limit`: (start, window index), or None."""
    while w <= last:
        s = max(ready, wins[w][0])
        if s + d > limit:
            return None
        if s + d <= wins[w][1]:
            return s, w
        w += 1
    return None


def _latest_fit(wins, w, first, latest, d, floor):
    """The last window from index w down to `first` that holds a task of length d ending by
    `latest` and starting at or after `floor`: (start, window index), or None."""
    while w >= first:
        s = min(latest, wins[w][1]) - d
        if s < floor:
            return None
        if s >= wins[w][0]:
            return s, w
        w -= 1
    return None


class _Twin:
    """One problem as the reference scheduler places it: per task its duration, (lane, resource)
    key, predecessors and successors of its phase, start, end and whether it runs inside the step;
    per encoder microbatch and phase its tasks in id order; per key its free windows."""

    def __init__(self, problem: Problem):
        a = problem.arrays()
        t_ = a.tasks
        self.horizon = float(a.horizon)
        n, m = problem.num_tasks, problem.num_microbatches
        self.m = m
        self.dur = [float(x) for x in t_.duration]
        self.key = [2 * int(t_.lane[t]) + int(t_.resource[t]) for t in range(n)]
        phase = [int(x) for x in t_.phase]
        self.preds = t_.predecessors()
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for t in range(n):
            for p in self.preds[t]:
                if phase[p] == phase[t]:
                    self.succs[p].append(t)
        self.tasks: dict[tuple[int, int], list[int]] = {(j, ph): [] for j in range(m) for ph in (0, 1)}
        for t in range(n):
            self.tasks[(int(t_.microbatch[t]), phase[t])].append(t)
        free = problem.free_windows()
        self.windows = {2 * lane + res: free[lane][RESOURCES[res]] for lane in range(a.num_lanes) for res in (0, 1)}
        self.bwins: dict[int, list[tuple[float, float]]] = {}  # the windows less the forward placed in them
        self.fn = [float(x) for x in a.forward_needed]
        self.gr = [float(x) for x in a.grad_ready]
        self.assignment = list(range(m))
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.inside = [False] * n  # placed inside the step

    def _place(self, t, placed):
        """Task t inside the step from `placed`."""
        self.start[t], self.end[t], self.inside[t] = placed, placed + self.dur[t], True

    def _drop(self, j, phase):
        """Takes microbatch j's tasks of `phase` out of the step (a failed trial); None."""
        for q in self.tasks[(j, phase)]:
            self.inside[q] = False

    def greedy(self, order, cursor, phase):
        """Step 1 (`phase` 0) or 4 (1): each microbatch of `order` placed whole, else its longest
        part that fits (a suffix of the forward, a prefix of the backward), else none of it; per
        microbatch, the first position of its tasks inside the step (forward) or the count of
        them (backward)."""
        in_step, probe = (self.forward_in_step, self.forward_suffix) if phase == 0 else \
            (self.backward_in_step, self.backward_prefix)
        sizes = [len(self.tasks[(j, phase)]) for j in range(self.m)]
        none_inside = list(sizes) if phase == 0 else [0] * self.m
        kept = list(none_inside)
        for j in order:
            pos = 0 if phase == 0 else sizes[j]  # the whole microbatch
            trial = in_step(j, pos, cursor)
            if trial is None:
                pos = probe(j, cursor)
                if pos != none_inside[j]:
                    trial = in_step(j, pos, cursor)
            if trial is not None:
                cursor = trial
                kept[j] = pos
        return kept

    # 1. Forward inside the step. A cursor per (lane, resource): (time it is free, first window).
    def forward_in_step(self, j, first, cursor):
        """Places j's forward tasks from position `first` on as early as possible; returns the
        new cursors, or None (nothing kept) if one cannot end by forward_needed[j]."""
        key, dur = self.key, self.dur
        trial = dict(cursor)
        for t in self.tasks[(j, 0)][first:]:
            ready = max([trial[key[t]][0]] + [self.end[p] for p in self.preds[t] if self.inside[p]])
            wins = self.windows[key[t]]
            fit = _earliest_fit(wins, trial[key[t]][1], len(wins) - 1, ready, dur[t], self.fn[j])
            if fit is None:
                return self._drop(j, 0)
            self._place(t, fit[0])
            trial[key[t]] = (fit[0] + dur[t], fit[1])
        return trial

    def forward_suffix(self, j, cursor):
        """First position of the longest suffix of j's forward that fits: tasks backwards, each
        as late as possible, ending by forward_needed[j], after the lane's placed work."""
        key = self.key
        ts = self.tasks[(j, 0)]
        probe: dict[int, float] = {}
        pstart: dict[int, float] = {}
        for i in reversed(range(len(ts))):
            t = ts[i]
            latest = min([self.fn[j], probe.get(key[t], math.inf)] + [pstart[q] for q in self.succs[t]])
            floor_time, floor_w = cursor[key[t]]
            wins = self.windows[key[t]]
            w = bisect.bisect_left([ws for ws, _ in wins], latest) - 1
            fit = _latest_fit(wins, w, floor_w, latest, self.dur[t], floor_time)
            if fit is None:
                return i + 1
            pstart[t] = probe[key[t]] = fit[0]
        return 0

    # 2. Forward before 0.
    def forward_before_zero(self, fwd_first):
        """The forward tasks not inside the step, microbatches in decreasing order, tasks in
        decreasing id order, each as late as possible before its successors and the lane's
        earlier placed task."""
        key, dur, start, end = self.key, self.dur, self.start, self.end
        front = {k: 0.0 for k in self.windows}
        for j in reversed(range(self.m)):
            for t in reversed(self.tasks[(j, 0)][:fwd_first[j]]):
                latest = min([front[key[t]]] + [start[s] for s in self.succs[t]])
                start[t] = latest - dur[t]
                end[t] = start[t] + dur[t]
                front[key[t]] = start[t]

    # 3. Assignment by forward finish order.
    def assign(self):
        """The k-th microbatch to finish its forward feeds LLM microbatch k, if every
        forward_needed holds that way; otherwise the identity."""
        m = self.m
        finish = [max([self.end[t] for t in self.tasks[(j, 0)]], default=-math.inf) for j in range(m)]
        order = sorted(range(m), key=lambda j: finish[j])
        assignment = [0] * m
        for k, j in enumerate(order):
            assignment[j] = k
        if any(finish[j] > self.fn[assignment[j]] for j in range(m)):
            assignment = list(range(m))
        self.assignment = assignment

    # 4. Backward inside the step, in the windows less the forward tasks placed there.
    def backward_windows(self):
        """Per (lane, resource), its windows less the forward tasks placed inside them."""
        n = len(self.dur)
        for k, wins in self.windows.items():
            busy = sorted((self.start[t], self.end[t]) for t in range(n)
                          if self.inside[t] and self.key[t] == k and self.dur[t] > 0.0)
            pieces = []
            for ws, we in wins:
                cur = ws
                for bs, be in busy:
                    if be <= ws or bs >= we:
                        continue
                    if bs > cur:
                        pieces.append((cur, bs))
                    cur = max(cur, be)
                if cur < we:
                    pieces.append((cur, we))
            self.bwins[k] = pieces

    def backward_in_step(self, j, last, cursor):
        """Places j's backward tasks before position `last` as late as possible; returns the new
        cursors, or None (nothing kept) if one cannot start at or after its grad_ready."""
        key, dur = self.key, self.dur
        ready = self.gr[self.assignment[j]]
        trial = dict(cursor)
        for t in reversed(self.tasks[(j, 1)][:last]):
            latest = min([trial[key[t]][0]] + [self.start[s] for s in self.succs[t] if self.inside[s]])
            fit = _latest_fit(self.bwins[key[t]], trial[key[t]][1], 0, latest, dur[t], ready)
            if fit is None:
                return self._drop(j, 1)
            self._place(t, fit[0])
            trial[key[t]] = (fit[0], fit[1])
        return trial

    def backward_prefix(self, j, cursor):
        """Length of the longest prefix of j's backward that fits: tasks forwards, each as early
        as possible from grad_ready, ending before the lane's placed work."""
        key = self.key
        ts = self.tasks[(j, 1)]
        ready = self.gr[self.assignment[j]]
        probe: dict[int, float] = {}
        pend: dict[int, float] = {}
        for i, t in enumerate(ts):
            early = max([ready, probe.get(key[t], -math.inf)] + [pend[q] for q in self.preds[t] if q in pend])
            ceil_time, ceil_w = cursor[key[t]]
            wins = self.bwins[key[t]]
            w = bisect.bisect_right([we for _, we in wins], early)
            fit = _earliest_fit(wins, w, ceil_w, early, self.dur[t], ceil_time)
            if fit is None:
                return i
            pend[t] = probe[key[t]] = fit[0] + self.dur[t]
        return len(ts)

    # 5. Backward after the horizon.
    def backward_after_horizon(self, bwd_last):
        """The backward tasks not inside the step, microbatches in increasing order, tasks in
        increasing id order, each as early as possible."""
        key, dur, start, end = self.key, self.dur, self.start, self.end
        back = {k: self.horizon for k in self.windows}
        for j in range(self.m):
            for t in self.tasks[(j, 1)][bwd_last[j]:]:
                s = max([back[key[t]]] + [end[p] for p in self.preds[t]])
                start[t], end[t] = s, s + dur[t]
                back[key[t]] = s + dur[t]

    def schedule(self):
        """The placed tasks as a schedule."""
        first_start = min([0.0] + self.start)
        last_end = max([self.horizon] + self.end)
        return Schedule(step_time=last_end - first_start, shift_front=-first_start,
                        shift_back=last_end - self.horizon,
                        start=np.array(self.start, np.float64), assignment=np.array(self.assignment, np.int64))


def reference_schedule(problem: Problem, policy: str = "greedy") -> Schedule:
    """The same schedule as :func:`pybubble.schedule_problem` with policy ``greedy`` or ``coarse``,
    computed in plain Python (``holes``: :func:`pybubble.testing.holes.reference_holes`)."""
    if check_policy(policy) == "holes":
        raise ValueError("policy: 'holes' has its own reference, pybubble.testing.holes.reference_holes")
    greedy = policy == "greedy"
    twin = _Twin(problem)
    m = twin.m
    fwd_first = [len(twin.tasks[(j, 0)]) for j in range(m)]  # positions >= this run inside the step
    if greedy:
        fwd_first = twin.greedy(range(m), {k: (0.0, 0) for k in twin.windows}, 0)
    twin.forward_before_zero(fwd_first)
    twin.assign()
    twin.backward_windows()
    bwd_last = [0] * m  # positions < this run inside the step
    if greedy:
        cursor = {k: (twin.horizon, len(twin.bwins[k]) - 1) for k in twin.bwins}
        order = sorted(range(m), key=lambda j: (twin.gr[twin.assignment[j]], j), reverse=True)
        bwd_last = twin.greedy(order, cursor, 1)
    twin.backward_after_horizon(bwd_last)
    return twin.schedule()
