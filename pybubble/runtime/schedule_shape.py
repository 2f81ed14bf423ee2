"""The schedule as the runtime sees it on this rank (:class:`PipelineShape`): its action table, this
rank's stages checked against it and against the pp group, and its microbatches per step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..placement.step_placement import splits_backward, stage_ranks
from .parallel_groups import ParallelGroups
from .pipelining import schedule_table


@dataclass(frozen=True)
class PipelineShape:
    """The schedule as the runtime sees it on this rank."""

    table: dict
    """The schedule's action table (its compute actions), which the plan simulates."""
    rank: int
    """This rank in the pipeline."""
    ranks: int
    """The pipeline's ranks."""
    stages: int
    """The pipeline's stages (of every rank)."""
    microbatches: int
    """The schedule's microbatches per step."""

    @classmethod
    def of(cls, stages: Sequence[Any], schedule: Any, groups: ParallelGroups, microbatches: int | None
           ) -> PipelineShape:
        """The shape of ``schedule`` over the pp group of ``groups``, once ``stages`` (this rank's)
        and ``microbatches`` (None: the table's) are found to be the ones it runs here."""
        rank, ranks, table = dist.get_rank(groups.pp), dist.get_world_size(groups.pp), schedule_table(schedule)
        count = check_stages(stages, table, rank, ranks, type(schedule).__name__)
        microbatches = check_microbatches(microbatches, table, ranks)
        groups.check_schedule(table, type(schedule).__name__)
        return cls(table=table, rank=rank, ranks=ranks, stages=count, microbatches=microbatches)


def check_stages(stages: Sequence[Any], table: dict, rank: int, ranks: int, schedule: str) -> int:
    """The pipeline's stage count, once ``stages`` (this rank's ``PipelineStage`` objects) are
    found to be built over the pp group and to be the stages ``table`` (that of the schedule class
    named ``schedule``) runs on ``rank``."""
    if len(table) != ranks:
        raise ValueError(f"schedule: its action table has {len(table)} ranks, the pp group {ranks}")
    owner = stage_ranks(table)
    for st in stages:
        if getattr(st, "group_size", ranks) != ranks:
            raise ValueError(f"stage: its group has {st.group_size} ranks, the pp group {ranks} "
                             "(build the PipelineStage with group= the pp group)")
        if getattr(st, "num_stages", len(owner)) != len(owner):
            raise ValueError(f"stage: {st.num_stages} stages, the schedule's table has {len(owner)}")
    if splits_backward(table) and any(isinstance(getattr(st, "submod", None), DistributedDataParallel)
                                      for st in stages):
        raise ValueError(f"stage: a DDP module beside {schedule}, which splits backwards into I and W: torch "
                         "computes W's gradients with autograd.grad, which DDP's all-reduce never sees "
                         "(pytorch/pytorch#144530), so the replicas' gradients would not be averaged "
                         "(docs/runtime.md, 'Zero-bubble schedules beside data parallelism'); shard it with FSDP2")
    mine = sorted(s for s, r in owner.items() if r == rank)
    given = sorted(getattr(st, "stage_index", s) for st, s in zip(stages, mine))
    if len(stages) != len(mine) or given != mine:
        raise ValueError(f"stage: stages {given} on rank {rank}, the schedule's table runs {mine} there")
    return len(owner)


def check_microbatches(microbatches: int | None, table: dict, ranks: int) -> int:
    """The schedule's microbatches per step: those of its action table (``microbatches``, when
    given, must be the same)."""
    in_table = 1 + max(a.microbatch for row in table.values() for a in row)
    if microbatches is None:
        microbatches = in_table
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < ranks:
        raise ValueError(f"microbatches: {microbatches!r} is not an integer >= {ranks} (the pp ranks)")
    if microbatches != in_table:
        raise ValueError(f"microbatches: {microbatches}, the schedule's table runs {in_table}")
    return microbatches


__all__ = ["PipelineShape", "check_microbatches", "check_stages"]
