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


def reference_schedule(problem: Problem, policy: str = "greedy") -> Schedule:
    """The same schedule as :func:`pybubble.schedule_problem`, computed in plain Python."""
    greedy = check_policy(policy) == "greedy"
    a = problem.arrays()
    t_ = a.tasks
    horizon = float(a.horizon)
    num_lanes = a.num_lanes
    n = problem.num_tasks
    m = problem.num_microbatches
    dur = [float(x) for x in t_.duration]
    key = [2 * int(t_.lane[t]) + int(t_.resource[t]) for t in range(n)]
    phase = [int(x) for x in t_.phase]
    preds = t_.predecessors()
    succs: list[list[int]] = [[] for _ in range(n)]
    for t in range(n):
        for p in preds[t]:
            if phase[p] == phase[t]:
                succs[p].append(t)
    tasks = {(j, ph): [] for j in range(m) for ph in (0, 1)}
    for t in range(n):
        tasks[(int(t_.microbatch[t]), phase[t])].append(t)
    free = problem.free_windows()
    windows = {2 * lane + res: free[lane][RESOURCES[res]] for lane in range(num_lanes) for res in (0, 1)}
    fn = [float(x) for x in a.forward_needed]
    gr = [float(x) for x in a.grad_ready]
    start = [0.0] * n
    end = [0.0] * n
    inside = [False] * n  # placed inside the step

    # 1. Forward inside the step. A cursor per (lane, resource): (time it is free, first window).
    def forward_in_step(j, first, cursor):
        """Places j's forward tasks from position `first` on as early as possible; returns the
        new cursors, or None (nothing kept) if one cannot end by forward_needed[j]."""
        trial = dict(cursor)
        for t in tasks[(j, 0)][first:]:
            ready = max([trial[key[t]][0]] + [end[p] for p in preds[t] if inside[p]])
            wins = windows[key[t]]
            fit = _earliest_fit(wins, trial[key[t]][1], len(wins) - 1, ready, dur[t], fn[j])
            if fit is None:
                for q in tasks[(j, 0)]:
                    inside[q] = False
                return None
            placed, w = fit
            start[t], end[t], inside[t] = placed, placed + dur[t], True
            trial[key[t]] = (placed + dur[t], w)
        return trial

    def forward_suffix(j, cursor):
        """First position of the longest suffix of j's forward that fits: tasks backwards, each
        as late as possible, ending by forward_needed[j], after the lane's placed work."""
        ts = tasks[(j, 0)]
        probe: dict[int, float] = {}
        pstart: dict[int, float] = {}
        for i in reversed(range(len(ts))):
            t = ts[i]
            latest = min([fn[j], probe.get(key[t], math.inf)] + [pstart[q] for q in succs[t]])
            floor_time, floor_w = cursor[key[t]]
            wins = windows[key[t]]
            w = bisect.bisect_left([ws for ws, _ in wins], latest) - 1
            fit = _latest_fit(wins, w, floor_w, latest, dur[t], floor_time)
            if fit is None:
                return i + 1
            pstart[t] = probe[key[t]] = fit[0]
        return 0

    fwd_first = [len(tasks[(j, 0)]) for j in range(m)]  # positions >= this run inside the step
    if greedy:
        cursor = {k: (0.0, 0) for k in windows}
        for j in range(m):
            first = 0
            trial = forward_in_step(j, 0, cursor)
            if trial is None:
                first = forward_suffix(j, cursor)
                if first < len(tasks[(j, 0)]):
                    trial = forward_in_step(j, first, cursor)
            if trial is not None:
                cursor = trial
                fwd_first[j] = first

    # 2. Forward before 0.
    front = {k: 0.0 for k in windows}
    for j in reversed(range(m)):
        for t in reversed(tasks[(j, 0)][:fwd_first[j]]):
            latest = min([front[key[t]]] + [start[s] for s in succs[t]])
            start[t] = latest - dur[t]
            end[t] = start[t] + dur[t]
            front[key[t]] = start[t]

    # 3. Assignment by forward finish order.
    finish = [max([end[t] for t in tasks[(j, 0)]], default=-math.inf) for j in range(m)]
    order = sorted(range(m), key=lambda j: finish[j])
    assignment = [0] * m
    for k, j in enumerate(order):
        assignment[j] = k
    if any(finish[j] > fn[assignment[j]] for j in range(m)):
        assignment = list(range(m))

    # 4. Backward inside the step, in the windows less the forward tasks placed there.
    bwins = {}
    for k, wins in windows.items():
        busy = sorted((start[t], end[t]) for t in range(n) if inside[t] and key[t] == k and dur[t] > 0.0)
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
        bwins[k] = pieces

    def backward_in_step(j, last, cursor):
        """Places j's backward tasks before position `last` as late as possible; returns the new
        cursors, or None (nothing kept) if one cannot start at or after its grad_ready."""
        ready = gr[assignment[j]]
        trial = dict(cursor)
        for t in reversed(tasks[(j, 1)][:last]):
            latest = min([trial[key[t]][0]] + [start[s] for s in succs[t] if inside[s]])
            fit = _latest_fit(bwins[key[t]], trial[key[t]][1], 0, latest, dur[t], ready)
            if fit is None:
                for q in tasks[(j, 1)]:
                    inside[q] = False
                return None
            placed, w = fit
            start[t], end[t], inside[t] = placed, placed + dur[t], True
            trial[key[t]] = (placed, w)
        return trial

    def backward_prefix(j, cursor):
        """Length of the longest prefix of j's backward that fits: tasks forwards, each as early
        as possible from grad_ready, ending before the lane's placed work."""
        ts = tasks[(j, 1)]
        ready = gr[assignment[j]]
        probe: dict[int, float] = {}
        pend: dict[int, float] = {}
        for i, t in enumerate(ts):
            early = max([ready, probe.get(key[t], -math.inf)] + [pend[q] for q in preds[t] if q in pend])
            ceil_time, ceil_w = cursor[key[t]]
            wins = bwins[key[t]]
            w = bisect.bisect_right([we for _, we in wins], early)
            fit = _earliest_fit(wins, w, ceil_w, early, dur[t], ceil_time)
            if fit is None:
                return i
            pend[t] = probe[key[t]] = fit[0] + dur[t]
        return len(ts)

    bwd_last = [0] * m  # positions < this run inside the step
    if greedy:
        cursor = {k: (horizon, len(bwins[k]) - 1) for k in bwins}
        for j in sorted(range(m), key=lambda j: (gr[assignment[j]], j), reverse=True):
            last = len(tasks[(j, 1)])
            trial = backward_in_step(j, last, cursor)
            if trial is None:
                last = backward_prefix(j, cursor)
                if last > 0:
                    trial = backward_in_step(j, last, cursor)
            if trial is not None:
                cursor = trial
                bwd_last[j] = last

    # 5. Backward after the horizon.
    back = {k: horizon for k in windows}
    for j in range(m):
        for t in tasks[(j, 1)][bwd_last[j]:]:
            s = max([back[key[t]]] + [end[p] for p in preds[t]])
            start[t], end[t] = s, s + dur[t]
            back[key[t]] = s + dur[t]

    first_start = min([0.0] + start)
    last_end = max([horizon] + end)
    return Schedule(step_time=last_end - first_start, shift_front=-first_start,
                    shift_back=last_end - horizon,
                    start=np.array(start, np.float64), assignment=np.array(assignment, np.int64))
