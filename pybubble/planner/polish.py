"""The search's last step: the best plan's shaped layout polished by moving single images between its
encoder pipelines, each move scheduled by the holes filler (Times are microseconds).

The shaped layout (:func:`~pybubble.planner.refill.share_out`) comes from a linear program that
counts each lane's free time whole; the schedule does not fill it whole (a piece crawls through the
TP gaps where the LLM's collectives hold the link, one run of kernels per gap), so the lane that
ends last, or starts first, holds more than it can run inside the step. The polish moves work off
it, one image at a time, and keeps a move when the step gets shorter (the first such move):

- *back*: an image of the last microbatches (from the last) off the pipeline whose lanes end last,
  onto each of the three whose lanes end first;
- *front*: an image of the first microbatches (from the first) off the pipeline whose lanes start
  first, onto each of the three whose lanes start last.

The two phases take turns until neither shortens the step or the step is within :data:`POLISH_GAP`
of the search's lower bound; a phase ends after :data:`POLISH_FAILS` moves that did not shorten it.
Each move is scheduled with the one holes order that gave the layout's schedule
(:attr:`~pybubble.planner.candidate.Candidate.holes_order`), ``workers`` moves at a time; the
layout found is scheduled again with every order (the holes filler's own schedule) and replaces the
candidate when shorter. A move that does not fit in memory is not taken.

**Where and how long.** It runs where the best plan is a shaped layout more than :data:`POLISH_GAP`
over the search's lower bound (a plan within it is left as found, as a solver stops at its gap
tolerance), within :data:`POLISH_TASKS` task placements (each move's schedule places every task of
its problem once; counted as if the moves ran one by one, so the result is the same for any number
of workers), and only where that budget holds :data:`POLISH_MIN_MOVES` moves at least: on larger
problems a few moves cost more than they find. Of the Optimus settings it runs on weak_a and weak_b
(67,000-71,000 tasks): weak_a 1,387.32 -> 1,382.50 ms (2.34% -> 1.98% over its bound; 10 moves,
7 kept), weak_b 1,501.25 -> 1,500.30. On dual_2 and dual_3 the by-rank layout
(:func:`~pybubble.planner.refill.by_rank`, 123,000 tasks, 8 moves in the budget) is left as found:
it is not the program's (every lane holds the same work), and its moves bought dual_2 2.4 ms
(3,055.56 -> 3,053.14 ms, 1 kept of 10 scheduled; dual_3 none of 4) for 0.15 s of planning, 1.21x
the planner's time when issue 41 was filed. Their share-outs (220,000-260,000 tasks: 3-4 moves) were
past the budget.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from ..problem.problem import Problem
from ..schedule.scheduler import HOLES_ORDERS, Schedule, schedule_problem
from .candidate import Candidate
from .space import PlanSpace, layout_entry

POLISH_GAP = 0.02
"""The polish runs where the best step is more than this fraction over the search's lower bound,
and stops within it."""
POLISH_TASKS = 1_000_000
"""The polish's budget in task placements."""
POLISH_MIN_MOVES = 8
"""The polish runs only where :data:`POLISH_TASKS` holds this many moves of the problem's size."""
POLISH_FAILS = 2
"""Moves that did not shorten the step after which a phase ends."""

_Layout = list[int | tuple[int, ...]]


def polish_runs(cand: Candidate, bound: float) -> bool:
    """Whether the polish runs on `cand` against the lower bound `bound` (us): the program's shaped
    layout (not the by-rank one) more than :data:`POLISH_GAP` over it, with :data:`POLISH_MIN_MOVES`
    moves in the budget."""
    return (cand.shaped and not cand.by_rank and cand.layout is not None and cand.step_time > (1.0 + POLISH_GAP) * bound
            and POLISH_MIN_MOVES * cand.problem.num_tasks <= POLISH_TASKS)


def polished(cand: Candidate, space: PlanSpace, bound: float, workers: int = 2) -> Candidate:
    """`cand` (the search's best, on `space`'s plan and LLM step) polished (see the module docstring)
    against the lower bound `bound` (us), or `cand` where the polish does not run or finds nothing."""
    if not polish_runs(cand, bound):
        return cand
    target = (1.0 + POLISH_GAP) * bound
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        if cand.holes_order is None:
            order, schedule = _probed(cand.problem, pool)
        else:
            order, schedule = cand.holes_order, cand.schedule
        walk = _Walk(space, cand, schedule, order, pool, max(1, workers))
        walk.run(target)
        if walk.moved == 0:
            return cand
        order, schedule = _probed(walk.problem, pool)  # the holes filler's own schedule: its shortest order
    if schedule.step_time >= cand.step_time:
        return cand
    layout = walk.layout()
    return replace(cand, layout=layout, partition=space.layout_partition(layout), problem=walk.problem, schedule=schedule,
                   memory_bytes=space.layout_memory(layout), holes_order=order, moved=cand.moved + walk.moved,
                   polished_from=cand.step_time if cand.polished_from is None else cand.polished_from)


def _probed(problem: Problem, pool: ThreadPoolExecutor) -> tuple[int, Schedule]:
    """``schedule_problem(problem, "holes")`` with its orders run apart on `pool`, and the order that
    gives it (the shortest; ties: the first)."""
    probes = list(pool.map(lambda o: schedule_problem(problem, "holes", orders=[o]), range(HOLES_ORDERS)))
    order = int(np.argmin([s.step_time for s in probes]))
    return order, probes[order]


class _Walk:
    """The polish's state: the share (microbatches x pipelines, images), its problem and its
    schedule under the holes order `order`, the task placements spent and the moves kept."""

    def __init__(self, space: PlanSpace, cand: Candidate, schedule: Schedule, order: int,
                 pool: ThreadPoolExecutor, workers: int):
        self.space, self.order, self.pool, self.workers = space, [order], pool, workers
        n, m = space.work.images[0], space.plan.pipelines
        self.share = np.array([np.eye(m, dtype=np.int64)[p] * n if isinstance(p, int) else np.array(p, np.int64)
                               for p in cand.layout])
        self.problem, self.schedule = cand.problem, schedule
        self.lanes = np.array([space.plan.lane(i, 0) for i in range(m)])
        self.spent, self.moved = 0, 0
        space.bubbles  # made once here, not by the threads

    def layout(self, share: np.ndarray | None = None) -> _Layout:
        """`share` (the walk's own by default) as a layout: the pipeline of a whole microbatch, else
        the images per pipeline."""
        rows = self.share if share is None else share
        return [layout_entry(r) for r in rows]

    def run(self, target: float) -> None:
        """Both phases in turn until neither keeps a move, the step is at `target` or below, or the
        budget is spent."""
        while self.schedule.step_time > target:
            kept = [self._phase(back, target) for back in (True, False)]  # both phases run
            if not any(kept):
                return

    def _phase(self, back: bool, target: float) -> bool:
        """One phase (`back`, else front); whether it kept a move."""
        fails, kept = 0, False
        while self.schedule.step_time > target:
            moves, found = self._moves(back), None
            for at in range(0, len(moves), self.workers):
                batch = moves[at:at + self.workers]
                for share, (problem, schedule) in zip(batch, self.pool.map(self._try, batch)):
                    if problem is not None:  # as the moves would run one by one: the budget, the fails
                        if self.spent + problem.num_tasks > POLISH_TASKS:
                            return kept
                        self.spent += problem.num_tasks
                    if schedule is not None and schedule.step_time < self.schedule.step_time:
                        found = (share, problem, schedule)
                        break
                    fails += 1
                    if fails == POLISH_FAILS:
                        return kept
                if found is not None:
                    break
            if found is None:
                return kept
            self.share, self.problem, self.schedule = found
            self.moved, kept = self.moved + 1, True
        return kept

    def _moves(self, back: bool) -> list[np.ndarray]:
        """The shares one image away from the walk's, in the order they are tried."""
        tasks = self.problem.arrays().tasks
        edge = np.full(self.problem.num_lanes, -np.inf)  # per lane, its last end (back) or its first start, negated
        np.maximum.at(edge, tasks.lane, self.schedule.start + tasks.duration if back else -self.schedule.start)
        key = edge[self.lanes]
        giver = int(np.argmax(key))
        takers = [int(r) for r in np.argsort(key, kind="stable") if r != giver][:3]
        out = []
        for j in (range(len(self.share) - 1, -1, -1) if back else range(len(self.share))):
            if self.share[j, giver] == 0:
                continue
            for r in takers:
                nxt = self.share.copy()
                nxt[j, giver] -= 1
                nxt[j, r] += 1
                out.append(nxt)
        return out

    def _try(self, share: np.ndarray) -> tuple[Problem | None, Schedule | None]:
        """`share`'s problem and its schedule under the walk's order; (None, None) where it does not
        fit in memory."""
        layout = self.layout(share)
        if self.space.layout_memory(layout) > self.space.memory_limit:
            return None, None
        problem = self.space.bubbles.with_tasks(self.space.work.layout_tasks(layout))
        return problem, schedule_problem(problem, "holes", orders=self.order)


__all__ = ["POLISH_FAILS", "POLISH_GAP", "POLISH_MIN_MOVES", "POLISH_TASKS", "polish_runs", "polished"]
