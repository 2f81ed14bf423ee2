"""The step of data-parallel replicas that wait for each other, predicted before it runs.

Each replica plans its own step (its own samples, or the work the moves left it), but the replicas
meet at every data-parallel collective (FSDP2's all-gathers and reduce-scatters, DDP's all-reduce)
and at the encoder's gradient sync: each stretch between two meetings takes as long as its slowest
replica. :class:`ReplicaLockstep` gathers every rank's plan marks and its last waits at the step's
start (that gather is the start's barrier) and predicts the step from them, the same on every rank
(:func:`~pybubble.placement.marks.lockstep_s`, the collectives' time measured by
:class:`~pybubble.placement.measured.CollectiveHistory`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function

from ..llm.tables import Table
from ..measure import names
from ..placement.marks import lockstep, step_marks_s
from ..placement.measured import CollectiveHistory, MeasuredCosts
from ..placement.plan import RankPlan
from ..placement.step_placement import Placement


class ReplicaLockstep:
    """The prediction of steps whose pipeline ranks have data-parallel replicas: ``table`` the
    schedule's action table, ``group`` a group of every rank that carries CPU tensors (None: the
    default group), ``keep`` the steps whose collectives' time the prediction follows."""

    def __init__(self, table: Table, group: dist.ProcessGroup | None, keep: int = 5):
        self.group = group
        self.most = max(sum(a is not None for a in row) for row in table.values())
        """The most ops a rank of the table runs: a gathered row's room."""
        self.collectives = CollectiveHistory(keep)
        """The data-parallel collectives' time where the replicas meet."""

    def start(self, plan: RankPlan, placement: Placement, costs: MeasuredCosts, rank: int,
              collectives_s: Callable[[int], list[float]], ran: bool) -> tuple[RankPlan, float, float]:
        """The step's start on every rank at once: ``plan`` (this rank's, ``rank`` in its pipeline,
        of ``placement`` with ``costs``) with the step predicted as the replicas run it, the
        collectives' time the prediction counts where this rank meets its replicas, and the time
        it has this rank wait for them beyond its own plan. ``collectives_s(ops)``: where and how
        long this rank waited on data-parallel collectives in the last step
        (:meth:`~pybubble.runtime.waits.DataParallelWaits.collectives_s`), measured when ``ran``
        (a step ran before). Every rank gathers every rank's marks and waits; the replicas of each
        pipeline rank are put in lockstep, the longest pipeline rank's step taken, then the
        encoder's gradient sync and the time outside the pipeline."""
        marks = step_marks_s(placement, rank, costs)
        n, waits_at = len(marks) - 2, 2 + self.most + 2
        # A rank's row: its pipeline rank, its ops n, its n + 2 marks, its n + 1 places' waits.
        row = np.full(waits_at + self.most + 1, np.nan)
        row[0], row[1] = rank, n
        row[2:4 + n] = marks
        row[waits_at:waits_at + n + 1] = collectives_s(n)
        every = [torch.zeros(len(row), dtype=torch.float64) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(every, torch.from_numpy(row), group=self.group)
        rows = torch.stack(every).numpy()
        compute, meet = 0.0, 0.0
        for position in np.unique(rows[:, 0]).astype(int):
            replicas = rows[rows[:, 0] == position]
            ops = int(replicas[0, 1])
            if ran:
                self.collectives.add(position, replicas[:, waits_at:waits_at + ops + 1])
            meets = self.collectives.meets_s(position, ops)
            rank_s, waits = lockstep(replicas[:, 2:4 + ops], meets)
            compute = max(compute, rank_s)
            self.collectives.expect(position, waits)
            if position == rank:
                meet = float(np.nansum(meets))
        predicted = compute + costs.grad_sync_s + costs.optimizer_s
        return dataclasses.replace(plan, predicted_step_s=predicted), meet, max(0.0, compute - marks[-1] - meet)


__all__ = ["ReplicaLockstep", "start_together"]


def start_together(lockstep: ReplicaLockstep | None, group: dist.ProcessGroup | None, plan: RankPlan,
                   placement: Placement, costs: MeasuredCosts, rank: int, collectives_s: Callable[[int], list[float]],
                   ran: bool) -> tuple[RankPlan, float, float]:
    """The step's start on every rank at once: with several replicas (``lockstep``)
    :meth:`ReplicaLockstep.start` (the plan predicted as they run it, the collectives' time and the
    waits for other replicas it counts), else the pipeline's barrier over ``group`` (0 s and 0 s)."""
    with record_function(names.region("sync")):
        if lockstep is not None:
            return lockstep.start(plan, placement, costs, rank, collectives_s, ran)
        dist.barrier(group=group)
    return plan, 0.0, 0.0
