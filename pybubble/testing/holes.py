"""The holes filler (policy ``holes``) in plain Python: slow and obvious, a twin of the C++ core's
``csrc/pybubble/holes.cc``, which must give exactly the same schedule (the differential tests).

The greedy's rules (:mod:`~pybubble.testing.reference`) with every cursor replaced by the free
intervals left on its (lane, resource): a task goes into the earliest (forward) or latest (backward)
free interval that holds it, so a later microbatch uses the time an earlier one passed over. Pieces
shorter than :data:`SLIVER` are dropped. In one order:

1. Forward inside the step: microbatches by increasing ``(forward_needed, j)``, each whole (tasks in
   id order, each in the earliest free interval after its predecessors inside the step and 0,
   ending by forward_needed), else its longest suffix that fits (a probe: tasks backwards, each in
   the latest free interval from 0 ending by forward_needed and its successors' starts), placed as
   early as possible, else as the probe placed it. ``late``: by decreasing ``(forward_needed, j)``,
   each its longest suffix as the probe places it.
2. The other forward tasks: microbatches in decreasing order, tasks in decreasing id order, each in
   the latest free interval ending by forward_needed and its successors' starts, (-inf, 0) free.
   ``interleave``: whichever of them has its successors placed and the latest such end next (ties:
   the larger ``(j, id)``), so that the microbatches share the time before the step; a kernel whose
   successor placed last is a kernel on its lane takes that one's priority instead of its own end,
   so that a chain's run of kernels between two collectives stays together.
3. The assignment, as the greedy's.
4. Backward inside the step: microbatches by decreasing ``(grad_ready, j)``, each whole (tasks in
   decreasing id order, each in the latest free interval before its successors inside the step and
   the horizon, from grad_ready), else its longest prefix that fits (a probe: tasks forwards, each in
   the earliest free interval from grad_ready and its backward predecessors' ends, ending by the
   horizon) placed as late as possible, else as the probe placed it. ``early``: by increasing
   ``(grad_ready, j)``, each its longest prefix as the probe places it.
5. The other backward tasks: microbatches in increasing order, tasks in increasing id order, each in
   the earliest free interval after its predecessors and grad_ready, (horizon, inf) free.
   ``interleave``: whichever of them has its predecessors placed and the earliest such start next
   (ties: the smaller ``(j, id)``), so that one microbatch's kernels run while another's
   collectives do; a kernel after a kernel on its lane takes that one's priority, as in step 2.

With ``interleave``, steps 1 and 4 keep a microbatch's phase inside the step only whole (its probe
found every task a place): one that does not fit goes to steps 2 and 5 whole, where its chains'
runs of kernels take turns with the others'.

``pieces``: steps 1 and 4 by decreasing ``(forward_needed, j)`` and ``(grad_ready, j)``, each
microbatch's tasks placed as the probes place them, a task that does not fit left out with the tasks
that depend on it only (its successors in the forward, its predecessors in the backward), the others
going on: a piece whose chain does not fit leaves the microbatch's other pieces inside the step
(with whole microbatches the probe stops at the first task that does not fit, for every piece).

The policy runs five orders, (greedy's, greedy's), (late, greedy's), (late, early), (late, early,
interleaved) and (late, early, pieces), and keeps the shortest step (ties: the first); the fourth
only where some lane runs a kernel after a collective of its own, the fifth only where some
microbatch's phase has several chains (tasks with no predecessor of their phase: a microbatch split
over pipelines), since elsewhere they repeat the third (:func:`orders`).
"""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

from ..problem.problem import Problem
from ..schedule.scheduler import Schedule
from .reference import _Twin

SLIVER = 1e-9
"""Free pieces shorter than this (us) are dropped."""
ORDERS = ((False, False, False, False), (True, False, False, False), (True, True, False, False),
          (True, True, True, False), (True, True, False, True))
"""(forward late, backward early, interleave, pieces) of each order the policy tries, in the order
tried."""


def earliest(S: list[float], E: list[float], ready: float, d: float, limit: float) -> tuple[int, float] | None:
    """The first free interval that holds a task of length d starting at or after `ready` and ending
    by `limit`: (index, start), or None."""
    i = bisect.bisect_left(E, ready)
    while i < len(S):
        s = max(ready, S[i])
        if s + d > limit:
            return None
        if s + d <= E[i]:
            return i, s
        i += 1
    return None


def latest(S: list[float], E: list[float], late: float, d: float, floor: float) -> tuple[int, float] | None:
    """The last free interval that holds a task of length d ending by `late` and starting at or
    after `floor`: (index, start), or None."""
    i = bisect.bisect_right(S, late) - 1
    while i >= 0:
        s = min(late, E[i]) - d
        if s < floor:
            return None
        if s >= S[i]:
            return i, s
        i -= 1
    return None


def rest(a: float, b: float, s: float, e: float) -> tuple[list[float], list[float]]:
    """Free interval [a, b) less [s, e): the starts and ends of what is left (slivers dropped)."""
    ps, pe = [], []
    if s - a > SLIVER:
        ps.append(a)
        pe.append(s)
    if b - e > SLIVER:
        ps.append(e)
        pe.append(b)
    return ps, pe


def take(S: list[float], E: list[float], i: int, s: float, d: float) -> None:
    """Takes [s, s + d) out of free interval i (nothing when d is not > 0)."""
    if d > 0.0:
        S[i:i + 1], E[i:i + 1] = rest(S[i], E[i], s, s + d)


def merged(wins) -> tuple[list[float], list[float]]:
    """Sorted windows (start, end) as free intervals, those that touch merged."""
    S: list[float] = []
    E: list[float] = []
    for a, b in wins:
        if S and a <= E[-1]:
            E[-1] = max(E[-1], b)
        else:
            S.append(a)
            E.append(b)
    return S, E


def open_front(S: list[float], E: list[float]) -> None:
    """Adds (-inf, 0) to free intervals S, E (merged into a first interval that starts at 0)."""
    if S and S[0] <= 0.0:
        S[0] = -math.inf
    else:
        S.insert(0, -math.inf)
        E.insert(0, 0.0)


def open_back(S: list[float], E: list[float], horizon: float) -> None:
    """Adds (horizon, inf) to free intervals S, E (merged into a last interval that reaches it)."""
    if S and E[-1] >= horizon:
        E[-1] = math.inf
    else:
        S.append(horizon)
        E.append(math.inf)


class Free:
    """Per key, free intervals (two sorted lists); a trial copies a key's lists when it first
    changes them."""

    def __init__(self, lists: dict[int, tuple[list[float], list[float]]]):
        self.lists = lists
        self.own: set[int] = set(lists)

    def trial(self) -> Free:
        """A trial on these lists: they stay as they are until it is kept (used in their place)."""
        f = Free(dict(self.lists))
        f.own = set()
        return f

    def get(self, k: int) -> tuple[list[float], list[float]]:
        """Key k's lists, to read."""
        return self.lists[k]

    def take(self, k: int, fit: tuple[int, float], d: float) -> None:
        """Takes [fit[1], fit[1] + d) out of key k's free interval fit[0]."""
        take(*self.mut(k), fit[0], fit[1], d)

    def mut(self, k: int) -> tuple[list[float], list[float]]:
        """Key k's lists, to change (copied first when they are shared)."""
        if k not in self.own:
            S, E = self.lists[k]
            self.lists[k] = (list(S), list(E))
            self.own.add(k)
        return self.lists[k]


class Holes(_Twin):
    """One problem as the holes filler places it in one order (:meth:`run`)."""

    def _in_step(self, j: int, ph: int, order: list[int], free: Free) -> Free | None:
        """j's tasks of phase `ph` in `order`, each in its free list: forward in the earliest
        interval after its predecessors ending by forward_needed, backward in the latest before its
        successors starting at or after grad_ready; the new free lists, or None (none placed)."""
        trial = free.trial()
        for t in order:
            if ph == 0:
                ready = max([0.0] + [self.end[p] for p in self.preds[t] if self.inside[p]])
                fit = earliest(*trial.get(self.key[t]), ready, self.dur[t], self.fn[self.assignment[j]])
            else:
                late = min([self.horizon] + [self.start[s] for s in self.succs[t] if self.inside[s]])
                fit = latest(*trial.get(self.key[t]), late, self.dur[t], self.gr[self.assignment[j]])
            if fit is None:
                self._drop(j, ph)
                return None
            trial.take(self.key[t], fit, self.dur[t])
            self._place(t, fit[1])
        return trial

    def fwd_suffix(self, j: int, free: Free) -> tuple[int, Free, dict[int, float]]:
        """The probe of j's longest forward suffix that fits: (first position, free lists with it
        placed, starts)."""
        trial = free.trial()
        ts = self.tasks[(j, 0)]
        pstart: dict[int, float] = {}
        for i in reversed(range(len(ts))):
            t = ts[i]
            late = min([self.fn[self.assignment[j]]] + [pstart[q] for q in self.succs[t]])
            fit = latest(*trial.get(self.key[t]), late, self.dur[t], 0.0)
            if fit is None:
                return i + 1, trial, pstart
            trial.take(self.key[t], fit, self.dur[t])
            pstart[t] = fit[1]
        return 0, trial, pstart

    def bwd_prefix(self, j: int, free: Free) -> tuple[int, Free, dict[int, float]]:
        """The probe of j's longest backward prefix that fits: (count, free lists with it placed,
        ends)."""
        trial = free.trial()
        ts = self.tasks[(j, 1)]
        ready = self.gr[self.assignment[j]]
        pend: dict[int, float] = {}
        for i, t in enumerate(ts):
            early = max([ready] + [pend[q] for q in self.preds[t] if q in pend])
            fit = earliest(*trial.get(self.key[t]), early, self.dur[t], self.horizon)
            if fit is None:
                return i, trial, pend
            trial.take(self.key[t], fit, self.dur[t])
            pend[t] = fit[1] + self.dur[t]
        return len(ts), trial, pend

    def fwd_pieces(self, j: int, free: Free) -> None:
        """Step 1 by pieces for microbatch j: the tasks backwards, each in the latest free interval
        from 0 ending by forward_needed and its successors' starts, left out when it does not fit or
        a successor was; those that fit placed so."""
        out: set[int] = set()
        for t in reversed(self.tasks[(j, 0)]):
            fit = None
            if not any(q in out for q in self.succs[t]):
                late = min([self.fn[self.assignment[j]]] + [self.start[q] for q in self.succs[t]])
                fit = latest(*free.get(self.key[t]), late, self.dur[t], 0.0)
            if fit is None:
                out.add(t)
                continue
            free.take(self.key[t], fit, self.dur[t])
            self._place(t, fit[1])

    def bwd_pieces(self, j: int, free: Free) -> None:
        """Step 4 by pieces for microbatch j: the tasks forwards, each in the earliest free interval
        from grad_ready and its backward predecessors' ends ending by the horizon, left out when it
        does not fit or a backward predecessor was; those that fit placed so."""
        out: set[int] = set()
        ready = self.gr[self.assignment[j]]
        for t in self.tasks[(j, 1)]:
            preds = [q for q in self.preds[t] if q in self.phase1]
            fit = None
            if not any(q in out for q in preds):
                early = max([ready] + [self.end[q] for q in preds])
                fit = earliest(*free.get(self.key[t]), early, self.dur[t], self.horizon)
            if fit is None:
                out.add(t)
                continue
            free.take(self.key[t], fit, self.dur[t])
            self._place(t, fit[1])

    def fwd_one(self, j: int, free: Free, late: bool, whole: bool = False) -> Free | None:
        """Step 1 for microbatch j: the free lists with what is inside, or None (nothing is).
        `whole`: all of it inside or none."""
        n = len(self.tasks[(j, 0)])
        if not late:
            trial = self._in_step(j, 0, self.tasks[(j, 0)], free)
            if trial is not None:
                return trial
        f, probe, pstart = self.fwd_suffix(j, free)
        if f == n or (whole and f > 0):
            return None
        trial = None if late else self._in_step(j, 0, self.tasks[(j, 0)][f:], free)
        if trial is None:  # the probe's own placement: it fits
            trial = probe
            for t in self.tasks[(j, 0)][f:]:
                self._place(t, pstart[t])
        return trial

    def bwd_one(self, j: int, free: Free, early: bool, whole: bool = False) -> Free | None:
        """Step 4 for microbatch j: the free lists with what is inside, or None (nothing is).
        `whole`: all of it inside or none."""
        ts = self.tasks[(j, 1)]
        if not early:
            trial = self._in_step(j, 1, list(reversed(ts)), free)
            if trial is not None:
                return trial
        last, probe, pend = self.bwd_prefix(j, free)
        if last == 0 or (whole and last < len(ts)):
            return None
        trial = None if early else self._in_step(j, 1, list(reversed(ts[:last])), free)
        if trial is None:
            trial = probe
            for t in ts[:last]:
                self._place(t, pend[t] - self.dur[t])
        return trial

    def run(self, fwd_late: bool, bwd_early: bool, interleave: bool = False, pieces: bool = False) -> Schedule:
        """Steps 1-5 in one order (see the module docstring)."""
        m = self.m
        free = Free({k: merged(w) for k, w in self.windows.items()})
        self.phase1 = {t for j in range(m) for t in self.tasks[(j, 1)]}
        for j in sorted(range(m), key=lambda j: (self.fn[j], j), reverse=fwd_late or pieces):
            if pieces:
                self.fwd_pieces(j, free)
            elif self.tasks[(j, 0)] and (got := self.fwd_one(j, free, fwd_late, interleave)) is not None:
                free = got
        for S, E in (free.mut(k) for k in list(free.lists)):
            open_front(S, E)
        self.front([(j, t) for j in range(m) for t in self.tasks[(j, 0)] if not self.inside[t]], free, interleave)
        for S, E in (free.mut(k) for k in list(free.lists)):
            if S and S[0] == -math.inf:
                if E[0] > 0.0:
                    S[0] = 0.0
                else:
                    del S[0], E[0]
        self.assign()
        for j in sorted(range(m), key=lambda j: (self.gr[self.assignment[j]], j), reverse=pieces or not bwd_early):
            if pieces:
                self.bwd_pieces(j, free)
            elif self.tasks[(j, 1)] and (got := self.bwd_one(j, free, bwd_early, interleave)) is not None:
                free = got
        for S, E in (free.mut(k) for k in list(free.lists)):
            open_back(S, E, self.horizon)
        self.back([(j, t) for j in range(m) for t in self.tasks[(j, 1)] if not self.inside[t]], free, interleave)
        return self.schedule()

    def front(self, rest: list[tuple[int, int]], free: Free, interleave: bool) -> None:
        """Step 2 on `rest`, the (microbatch, task) pairs not inside the step."""
        def late(j: int, t: int) -> float:
            return min([self.fn[self.assignment[j]]] + [self.start[s] for s in self.succs[t]])

        def put(t: int, lt: float) -> None:
            S, E = free.mut(self.key[t])
            i, s = latest(S, E, lt, self.dur[t], -math.inf)
            take(S, E, i, s, self.dur[t])
            self.start[t], self.end[t], self.inside[t] = s, s + self.dur[t], s >= 0.0

        if not interleave:
            for j, t in reversed(rest):
                put(t, late(j, t))
            return
        self._interleaved(rest, self.succs, self.preds, late, put, latest_first=True)

    def back(self, rest: list[tuple[int, int]], free: Free, interleave: bool) -> None:
        """Step 5 on `rest`, the (microbatch, task) pairs not inside the step."""
        def early(j: int, t: int) -> float:
            return max([self.gr[self.assignment[j]]] + [self.end[p] for p in self.preds[t]])

        def put(t: int, et: float) -> None:
            S, E = free.mut(self.key[t])
            i, s = earliest(S, E, et, self.dur[t], math.inf)
            take(S, E, i, s, self.dur[t])
            self.start[t], self.end[t] = s, s + self.dur[t]

        if not interleave:
            for j, t in rest:
                put(t, early(j, t))
            return
        self._interleaved(rest, self.preds, self.succs, early, put, latest_first=False)

    def _interleaved(self, rest, waits_on, frees, key, put, latest_first: bool) -> None:
        """`rest`'s tasks, each once those of `waits_on[t]` among them are placed, the one with the
        earliest ``key(j, t)`` next (`latest_first`: the latest), ties by ``(j, id)`` the same way,
        placed by ``put(t, key)``; placing t frees those of ``frees[t]``."""
        sign = -1 if latest_first else 1
        left = {t: 0 for _, t in rest}
        for t in left:
            left[t] = sum(1 for q in waits_on[t] if q in left)
        heap = [(sign * key(j, t), sign * j, sign * t, key(j, t)) for j, t in rest if left[t] == 0]
        heapq.heapify(heap)
        while heap:
            prio, j, t, bound = heapq.heappop(heap)
            j, t = sign * j, sign * t
            put(t, bound)
            for q in frees[t]:
                if q in left:
                    left[q] -= 1
                    if left[q] == 0:
                        run = self.key[t] % 2 == 0 and self.key[q] == self.key[t]  # a kernel after a kernel on its lane
                        heapq.heappush(heap, (prio if run else sign * key(j, q), sign * j, sign * q, key(j, q)))


def orders(problem: Problem) -> tuple[tuple[bool, bool, bool, bool], ...]:
    """The orders the policy runs on `problem`: :data:`ORDERS`, less the interleaved one unless some
    lane runs a compute task right after a communication task of the same lane and phase, and less
    the one by pieces unless some microbatch's phase has several tasks with no predecessor of that
    phase."""
    t = problem.arrays().tasks
    preds = t.predecessors()
    collective = any(t.resource[p] == 1 and t.lane[p] == t.lane[q] and t.phase[p] == t.phase[q]
                     for q in np.nonzero(t.resource == 0)[0] for p in preds[q])
    roots = [(int(t.microbatch[q]), int(t.phase[q])) for q in range(len(t.duration))
             if not any(t.phase[p] == t.phase[q] for p in preds[q])]
    pieces = len(set(roots)) < len(roots)
    return tuple(o for o in ORDERS if (collective or not o[2]) and (pieces or not o[3]))


def reference_holes(problem: Problem) -> Schedule:
    """The same schedule as ``pybubble.schedule_problem(problem, "holes")``, in plain Python."""
    best = None
    for order in orders(problem):
        sched = Holes(problem).run(*order)
        if best is None or sched.step_time < best.step_time:
            best = sched
    return best


__all__ = ["ORDERS", "SLIVER", "Free", "Holes", "earliest", "latest", "merged", "open_back", "open_front", "orders",
           "reference_holes", "rest", "take"]
