"""The trainer's process groups the runtime works on (temporary: the mesh reading of before)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from .placement import splits_backward


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelGroups:
    """The resolved groups."""

    pp: dist.ProcessGroup
    """The pipeline."""
    dp: dist.ProcessGroup | None = None
    """The data-parallel replicas (None: none)."""
    tp: dist.ProcessGroup | None = None
    """Tensor parallelism (None: none)."""
    mesh: Any = None
    """The mesh they came from (None: explicit groups)."""
    pp_dim: str | None = None

    @property
    def tp_size(self) -> int:
        return 1 if self.tp is None else dist.get_world_size(self.tp)

    def check_schedule(self, table: dict, name: str) -> None:
        """Refuses a schedule that splits backwards beside tensor parallelism."""
        if self.tp_size > 1 and splits_backward(table):
            raise ValueError(f"schedule: {name} splits backwards into I and W, beside the mesh's tp {self.tp_size}: "
                             "tensor parallelism is predicted with whole backwards only (Schedule1F1B, "
                             "ScheduleGPipe, ScheduleInterleaved1F1B)")


def resolve_groups(*, mesh: Any = None, parallel_dims: Any = None, roles: dict | None = None,
                   pp_group=None, dp_group=None, tp_group=None, default_pp=None) -> ParallelGroups:
    if mesh is not None:
        if pp_group is not None or dp_group is not None:
            raise ValueError("mesh: give a mesh or pp_group/dp_group, not both")
        names = tuple(mesh.mesh_dim_names or ())
        if "pp" not in names:
            raise ValueError(f"mesh: no 'pp' dimension (its dimensions: {names})")
        pp_group = mesh["pp"].get_group()
        dp_group = mesh["dp"].get_group() if "dp" in names else None
        tp_group = mesh["tp"].get_group() if "tp" in names else None
    pp = pp_group if pp_group is not None else default_pp or dist.group.WORLD
    dp = dp_group if dp_group is not None and dist.get_world_size(dp_group) > 1 else None
    return ParallelGroups(pp=pp, dp=dp, tp=tp_group, mesh=mesh, pp_dim="pp" if mesh is not None else None)


def _cpu_capable(group: dist.ProcessGroup) -> bool:
    """Whether ``group`` carries CPU tensors (gloo, alone or beside NCCL as ``cpu:gloo,cuda:nccl``)."""
    return "gloo" in str(dist.get_backend(group))


def runtime_group(groups: ParallelGroups, ranks: int) -> dist.ProcessGroup:
    """The group of the runtime's own traffic: the pp group when it carries CPU tensors; else one
    gloo group per pipeline of the mesh (or of the world), this rank's."""
    if _cpu_capable(groups.pp):
        return groups.pp
    mesh = groups.mesh
    if mesh is not None:
        names = tuple(mesh.mesh_dim_names)
        pipelines = mesh.mesh.movedim(names.index(groups.pp_dim), -1).reshape(-1, ranks).tolist()
    elif ranks == dist.get_world_size():
        pipelines = [list(range(ranks))]
    else:
        raise ValueError(f"group: the pp group's backend is {dist.get_backend(groups.pp)!r}, which does not "
                         "carry CPU tensors; pass a gloo group over its ranks (or the mesh)")
    me = dist.get_rank()
    mine = None
    for ranks_ in pipelines:  # every rank creates every pipeline's group, in the same order
        g = dist.new_group(ranks_, backend="gloo")
        if me in ranks_:
            mine = g
    return mine
