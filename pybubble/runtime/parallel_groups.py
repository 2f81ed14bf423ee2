"""The process groups the runtime runs on, by role, from what a trainer has.

The runtime needs three roles: ``pp`` (the pipeline whose bubbles it fills), ``dp`` (the ranks over
which the encoder's gradients are averaged) and ``tp`` (tensor parallelism, which it must know of to
predict the step). :func:`resolve_groups` takes one of

- a torchtitan ``ParallelDims`` (duck-typed: its degrees ``pp``, ``dp_replicate``, ``dp_shard``,
  ``cp``, ``tp`` and ``get_mesh(name)``; torchtitan is not imported): the pipeline is
  ``get_mesh("pp")``, tensor parallelism ``get_mesh("tp")``, data parallelism ``get_mesh("loss")``;
- a ``DeviceMesh`` with any dimension names and ``roles``, a mapping of the roles to its
  dimensions (``{"pp": "pp", "dp": ("dp_replicate", "dp_shard"), "tp": "tp"}``: a tuple is the
  product of those dimensions);
- a ``DeviceMesh`` with conventional names, read without ``roles``: ``"pp"``, ``"tp"``, and as
  data-parallel dimensions any of :data:`DATA_PARALLEL_DIMS` (``"dp"`` and torchtitan's
  ``"dp_replicate"``, ``"dp_shard"``, ``"fsdp"``, ``"batch"``, ``"cp"``);
- explicit groups ``pp_group``, ``dp_group``, ``tp_group``.

The data-parallel group is every rank that trains the same pipeline stage with other data: on
torchtitan's meshes ``dp_replicate x dp_shard x cp``, the ``loss`` mesh, which is also the group
torchtitan reduces the LLM's gradients over (FSDP2 shards over ``("dp_shard", "cp")`` and
replicates over ``dp_replicate``, the vision encoder included). Context-parallel ranks each hold a
part of the same samples' sequences, so the gradients that reach the encoder differ between them;
averaging over ``cp`` as well gives the gradient of the loss the LLM's gradients belong to (and
where they are equal, averaging changes nothing). torchtitan's ``batch`` mesh (``dp_replicate x
dp_shard``, the ranks that load different samples) leaves ``cp`` out and would let the
context-parallel ranks' encoders drift apart.

Nothing is guessed: a mesh with a dimension of more than one rank that is in no role (an unknown
name, or one of torchtitan's expert-parallel ``ep``/``efsdp``, which cut across tp) is refused
with a ``ValueError`` that names its dimensions and says how to pass ``roles``, and so are groups
whose sizes do not multiply to the world's (pp x dp x tp): the ranks left over would be replicas
whose encoder gradients are never averaged. :func:`runtime_group` is the group of the runtime's own
traffic over the resolved pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..placement.step_placement import splits_backward

ROLES = ("pp", "dp", "tp")
"""The roles of the process groups the runtime runs on."""

DATA_PARALLEL_DIMS = ("dp", "dp_replicate", "dp_shard", "fsdp", "batch", "cp")
"""Mesh dimension names read as data-parallel without ``roles``: ``"dp"`` and torchtitan's names
of the dimensions whose ranks train the same stage on other data (``fsdp`` is torchtitan's
``dp_shard x cp``, ``batch`` its ``dp_replicate x dp_shard``). A mesh's dimensions are disjoint
factors of it, so the data-parallel group is the product of those it has."""

TORCHTITAN_DEGREES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The degrees read from a torchtitan ``ParallelDims`` (their product is its world size)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelGroups:
    """The process groups of this rank by role, and where each came from."""

    pp: dist.ProcessGroup
    """The pipeline's ranks: the schedule's stages run over them, the encoder's microbatches are
    spread over them and its gradients summed over them."""
    dp: dist.ProcessGroup | None
    """The data-parallel replicas of this rank (every rank that runs the same stages on other
    data): the encoder's gradients are averaged over them, as FSDP2 and DDP average the LLM's.
    None: one replica."""
    tp: dist.ProcessGroup | None
    """The tensor-parallel group of this rank (the encoder is replicated over it). None: no tensor
    parallelism."""
    pp_source: str
    """Where ``pp`` came from (a mesh dimension, a ``ParallelDims`` mesh, a group argument)."""
    dp_source: str
    """Where ``dp`` came from, or why there is none."""
    tp_source: str
    """Where ``tp`` came from, or why there is none."""
    pipelines: tuple[tuple[int, ...], ...] | None
    """Every pipeline's global ranks (every pp group of the world, the same on every rank, for
    groups beside the pipeline's); None where the source does not lay them out (explicit groups,
    a mesh that covers part of the world)."""

    @property
    def tp_size(self) -> int:
        """The tensor-parallel degree (1 without tensor parallelism)."""
        return _size(self.tp)

    def describe(self) -> str:
        """One line: each role's size and source."""
        sizes = [_size(g) for g in (self.pp, self.dp, self.tp)]
        sources = (self.pp_source, self.dp_source, self.tp_source)
        return ", ".join(f"{role} {n} ({src})" for role, n, src in zip(ROLES, sizes, sources))

    def check_schedule(self, table: dict, name: str) -> None:
        """Refuses a schedule (``name``, its action ``table``) that splits backwards into I and W
        beside tensor parallelism: how the TP waits fall on I and W is not measured."""
        if self.tp_size > 1 and splits_backward(table):
            raise ValueError(f"schedule: {name} splits backwards into I and W, beside tp {self.tp_size} "
                             f"({self.tp_source}): tensor parallelism is predicted with whole backwards only "
                             "(Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B)")


def resolve_groups(*, mesh: Any = None, parallel_dims: Any = None,
                   roles: Mapping[str, str | Sequence[str] | None] | None = None,
                   pp_group: dist.ProcessGroup | None = None, dp_group: dist.ProcessGroup | None = None,
                   tp_group: dist.ProcessGroup | None = None,
                   default_pp: dist.ProcessGroup | None = None) -> ParallelGroups:
    """This rank's :class:`ParallelGroups` from one source: ``parallel_dims`` (a torchtitan
    ``ParallelDims``), ``mesh`` (a ``DeviceMesh``, with ``roles`` or conventional dimension names),
    or the explicit ``pp_group``/``dp_group``/``tp_group``; with none, the pipeline is
    ``default_pp`` (the stage's own group; None: the world) and there is neither data nor tensor
    parallelism. ``default_pp`` is also the pipeline where ``parallel_dims`` has pp 1.

    Every rank calls it with the same source: averaging over several mesh dimensions creates one
    group per replica set over the whole world (public ``new_subgroups_by_enumeration``), which
    every rank enters. Raises ``ValueError`` for two sources, a mesh whose data-parallel
    dimensions cannot be identified, and groups that do not cover the world (pp x dp x tp)."""
    explicit = [k for k, g in (("pp_group", pp_group), ("dp_group", dp_group), ("tp_group", tp_group))
                if g is not None]
    given = ["parallel_dims"] * (parallel_dims is not None) + ["mesh"] * (mesh is not None) + explicit
    if (parallel_dims is not None) + (mesh is not None) + bool(explicit) > 1:
        raise ValueError(f"{given[0]}: give one of parallel_dims, mesh (with roles) or pp_group/dp_group/tp_group, "
                         f"not {' and '.join(given)}")
    if roles is not None and mesh is None:
        raise ValueError(f"roles: {roles!r} names dimensions of a mesh, and no mesh is given")
    if parallel_dims is not None:
        groups = _from_parallel_dims(parallel_dims, default_pp)
    elif mesh is not None:
        groups = _from_mesh(mesh, roles)
    else:
        groups = _from_groups(pp_group, dp_group, tp_group, default_pp)
    _check_world(groups, given[0] if given else "stage")
    return groups


def _size(group: dist.ProcessGroup | None) -> int:
    """The ranks of ``group`` (1 for None)."""
    return 1 if group is None else dist.get_world_size(group)


def _check_world(groups: ParallelGroups, field: str) -> None:
    """Refuses groups whose sizes do not multiply to the world's: the ranks left over would be
    replicas (or TP ranks) the runtime does not know of."""
    pp, dp, tp = _size(groups.pp), _size(groups.dp), _size(groups.tp)
    world = dist.get_world_size()
    if pp * dp * tp != world:
        raise ValueError(f"{field}: pp {pp} x dp {dp} x tp {tp} = {pp * dp * tp} ranks, the world has {world} "
                         f"({groups.describe()}); the other ranks' role is unknown, and replicas whose encoder "
                         "gradients are not averaged would drift apart: pass the data-parallel (and tensor-parallel) "
                         "groups, a mesh with roles, or torchtitan's ParallelDims")


# -- torchtitan's ParallelDims -------------------------------------------------------------------

def _from_parallel_dims(parallel_dims: Any, default_pp: dist.ProcessGroup | None) -> ParallelGroups:
    """The groups of torchtitan's meshes by role: ``get_mesh("pp")``, ``get_mesh("loss")``
    (``dp_replicate x dp_shard x cp``), ``get_mesh("tp")``; a role of degree 1 has none (torchtitan's
    ``get_mesh`` refuses those)."""
    if not callable(getattr(parallel_dims, "get_mesh", None)):
        raise ValueError(f"parallel_dims: {type(parallel_dims).__name__} has no get_mesh(name) (a torchtitan "
                         f"ParallelDims has it, and the degrees {', '.join(TORCHTITAN_DEGREES)})")
    degrees = {}
    for name in TORCHTITAN_DEGREES:
        value = getattr(parallel_dims, name, None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"parallel_dims: {name} is {value!r}, not a degree >= 1 (a torchtitan ParallelDims "
                             f"has {', '.join(TORCHTITAN_DEGREES)})")
        degrees[name] = value
    world = dist.get_world_size()
    if math.prod(degrees.values()) != world:
        raise ValueError(f"parallel_dims: {' x '.join(f'{k} {v}' for k, v in degrees.items())} = "
                         f"{math.prod(degrees.values())} ranks, the world has {world}")
    dp_degree = degrees["dp_replicate"] * degrees["dp_shard"] * degrees["cp"]
    pp = _titan_group(parallel_dims, "pp", degrees["pp"])
    dp = _titan_group(parallel_dims, "loss", dp_degree)
    tp = _titan_group(parallel_dims, "tp", degrees["tp"])
    if pp is None:
        pp_source = f"{'the stage' if default_pp is not None else 'the world'}'s group (parallel_dims: pp 1)"
        pp = default_pp if default_pp is not None else dist.group.WORLD
    else:
        pp_source = "parallel_dims.get_mesh('pp')"
    return ParallelGroups(
        pp=pp, dp=dp, tp=tp, pp_source=pp_source,
        dp_source=("parallel_dims.get_mesh('loss'): dp_replicate x dp_shard x cp" if dp is not None
                   else "parallel_dims: dp_replicate x dp_shard x cp = 1"),
        tp_source="parallel_dims.get_mesh('tp')" if tp is not None else "parallel_dims: tp 1",
        pipelines=_titan_pipelines(parallel_dims, degrees["pp"]) if degrees["pp"] > 1 else None)


def _titan_group(parallel_dims: Any, name: str, degree: int) -> dist.ProcessGroup | None:
    """The group of ``parallel_dims.get_mesh(name)`` (None for degree 1), checked against ``degree``."""
    if degree == 1:
        return None
    try:
        mesh = parallel_dims.get_mesh(name)
    except (KeyError, ValueError) as e:
        raise ValueError(f"parallel_dims: get_mesh({name!r}) failed ({e}); pybubble reads torchtitan's meshes "
                         "'pp', 'loss' and 'tp' (August 2026): with another ParallelDims pass mesh= with roles=") from None
    group = mesh.get_group()
    if dist.get_world_size(group) != degree:
        raise ValueError(f"parallel_dims: get_mesh({name!r}) has {dist.get_world_size(group)} ranks, its degree is {degree}")
    return group


def _titan_pipelines(parallel_dims: Any, pp: int) -> tuple[tuple[int, ...], ...] | None:
    """Every pipeline's ranks as torchtitan lays out its meshes: the world's ranks unflattened with
    "pp" outermost, so that a pipeline's ranks are ``world / pp`` apart; None when this rank's
    ``get_mesh("pp")`` does not follow that layout."""
    stride = dist.get_world_size() // pp
    pipelines = tuple(tuple(i + k * stride for k in range(pp)) for i in range(stride))
    mine = tuple(parallel_dims.get_mesh("pp").mesh.flatten().tolist())
    return pipelines if mine == pipelines[dist.get_rank() % stride] else None


# -- a DeviceMesh --------------------------------------------------------------------------------

def _from_mesh(mesh: Any, roles: Mapping[str, str | Sequence[str] | None] | None) -> ParallelGroups:
    """The groups of ``mesh``'s dimensions by role (``roles``, or the conventional names)."""
    if not hasattr(mesh, "mesh_dim_names"):
        raise ValueError(f"mesh: a {type(mesh).__name__}, not a DeviceMesh"
                         + (" (a ParallelDims goes to parallel_dims=)" if hasattr(mesh, "get_mesh") else ""))
    names = tuple(mesh.mesh_dim_names or ())
    if len(names) != mesh.ndim:
        raise ValueError(f"mesh: its dimensions have no names (shape {tuple(mesh.shape)}); name them "
                         "(init_device_mesh(..., mesh_dim_names=...)) and pass roles")
    dims = _read_roles(names, roles) if roles is not None else _conventional_roles(names)
    sizes = dict(zip(names, mesh.shape))
    how = f"roles={_roles_text(dims)}" if roles is not None else "its names"
    if not dims["pp"]:
        raise ValueError(f"mesh: no 'pp' dimension (its dimensions: {names}); name the pipeline's dimension with "
                         "roles={'pp': ..., 'dp': ..., 'tp': ...}")
    unknown = tuple(n for n in names if sizes[n] > 1 and not any(n in d for d in dims.values()))
    if unknown:
        example = {"pp": dims["pp"][0], "dp": dims["dp"] + unknown, "tp": (dims["tp"] or (None,))[0]}
        raise ValueError(f"mesh: dimensions {names} of sizes {tuple(mesh.shape)}: {unknown} "
                         f"{'is' if len(unknown) == 1 else 'are'} in no role ({how}), so the data-parallel "
                         "replicas cannot be identified and the encoder's gradients would not be averaged over "
                         f"them; pass roles naming the mesh's dimensions, e.g. roles={example!r} if they are "
                         "data-parallel (a tuple: the product of those dimensions)")
    world = dist.get_world_size()
    whole = mesh.mesh.numel() == world  # a mesh over the whole world: its tensor holds every rank
    pp, = dims["pp"]
    dp_dims = tuple(n for n in dims["dp"] if sizes[n] > 1)
    tp_dims = tuple(n for n in dims["tp"] if sizes[n] > 1)
    if len(dp_dims) > 1 and not whole:
        raise ValueError(f"mesh: it covers {mesh.mesh.numel()} of the world's {world} ranks; averaging over its "
                         f"dimensions {dp_dims} needs the whole mesh (pass the root mesh, or dp_group=)")
    return ParallelGroups(
        pp=mesh.get_group(pp), dp=_mesh_group(mesh, names, dp_dims), tp=_mesh_group(mesh, names, tp_dims),
        pp_source=f"mesh dimension {pp!r}", dp_source=_dims_source("dp", dp_dims, dims["dp"], how),
        tp_source=_dims_source("tp", tp_dims, dims["tp"], how),
        pipelines=rank_sets(mesh.mesh, names, (pp,)) if whole else None)


def _conventional_roles(names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The roles of a mesh's dimensions by their names: "pp", "tp", :data:`DATA_PARALLEL_DIMS`."""
    return {"pp": tuple(n for n in names if n == "pp"), "dp": tuple(n for n in names if n in DATA_PARALLEL_DIMS),
            "tp": tuple(n for n in names if n == "tp")}


def _read_roles(names: tuple[str, ...], roles: Any) -> dict[str, tuple[str, ...]]:
    """``roles`` checked against the mesh's dimension ``names``: each role a dimension name, a tuple
    of them (dp only) or None; every name a dimension, none in two roles."""
    if not isinstance(roles, Mapping):
        raise ValueError(f"roles: {roles!r} is not a mapping of roles ({', '.join(ROLES)}) to the mesh's dimensions")
    dims: dict[str, tuple[str, ...]] = {role: () for role in ROLES}
    for role, value in roles.items():
        if role not in ROLES:
            raise ValueError(f"roles: {role!r} is not a role ({', '.join(ROLES)})")
        chosen = () if value is None else (value,) if isinstance(value, str) else \
            tuple(value) if isinstance(value, (tuple, list)) else None
        if chosen is None or not all(isinstance(n, str) for n in chosen):
            raise ValueError(f"roles: {role} is {value!r}, not a dimension name, a tuple of them or None")
        if role != "dp" and len(chosen) > 1:
            raise ValueError(f"roles: {role} is {value!r}: one dimension (only dp may be a product of several)")
        for n in chosen:
            if n not in names:
                raise ValueError(f"roles: {role} names {n!r}, not a dimension of the mesh (its dimensions: {names})")
            taken = [r for r, d in dims.items() if n in d]
            if taken or chosen.count(n) > 1:
                raise ValueError(f"roles: {n!r} is in {role} and in {(taken or [role])[0]}: a dimension has one role")
        dims[role] = chosen
    return dims


def _roles_text(dims: dict[str, tuple[str, ...]]) -> str:
    return "{" + ", ".join(f"{r!r}: {d!r}" for r, d in dims.items()) + "}"


def _dims_source(role: str, used: tuple[str, ...], named: tuple[str, ...], how: str) -> str:
    """Where a role's group came from: the dimensions ``used`` (of size > 1) of those ``named``."""
    if len(used) == 1:
        return f"mesh dimension {used[0]!r}"
    if used:
        return f"mesh dimensions {used}, their product"
    if named:
        return f"mesh dimensions {named} of size 1"
    return f"no {role} dimension in the mesh, by {how}"


def _mesh_group(mesh: Any, names: tuple[str, ...], dims: tuple[str, ...]) -> dist.ProcessGroup | None:
    """This rank's group over the product of ``mesh``'s dimensions ``dims`` (None for none): one
    dimension's own group, or a new group per set of ranks that differ only in ``dims``, created
    through the public ``new_subgroups_by_enumeration`` on every rank in the same order (the mesh's
    tensor holds every rank: the caller checked that it covers the world)."""
    if not dims:
        return None
    if len(dims) == 1:
        return mesh.get_group(dims[0])
    mine, _ = dist.new_subgroups_by_enumeration(list(rank_sets(mesh.mesh, names, dims)),
                                                group_desc="pybubble_" + "_".join(dims))
    return mine


def rank_sets(ranks: torch.Tensor, names: Sequence[str], dims: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """The sets of ranks of a mesh's tensor ``ranks`` (dimensions ``names``) that differ only in
    ``dims``: one set per index of the other dimensions, its ranks in the order of ``dims``."""
    order = [i for i, n in enumerate(names) if n not in dims] + [names.index(n) for n in dims]
    size = math.prod(ranks.shape[names.index(n)] for n in dims)
    return tuple(tuple(row) for row in ranks.permute(order).reshape(-1, size).tolist())


# -- explicit groups -----------------------------------------------------------------------------

def _from_groups(pp_group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None,
                 tp_group: dist.ProcessGroup | None, default_pp: dist.ProcessGroup | None) -> ParallelGroups:
    """The groups as given; the pipeline without ``pp_group`` is ``default_pp`` (None: the world)."""
    if pp_group is not None:
        pp, pp_source = pp_group, "pp_group"
    elif default_pp is not None:
        pp, pp_source = default_pp, "the stage's group"
    else:
        pp, pp_source = dist.group.WORLD, "the world (no pp_group, no stage group)"
    dp = dp_group if _size(dp_group) > 1 else None
    tp = tp_group if _size(tp_group) > 1 else None
    return ParallelGroups(pp=pp, dp=dp, tp=tp, pp_source=pp_source,
                          dp_source="dp_group" if dp is not None else
                          "dp_group of 1 rank" if dp_group is not None else "no dp_group",
                          tp_source="tp_group" if tp is not None else
                          "tp_group of 1 rank" if tp_group is not None else "no tp_group",
                          pipelines=None)


# -- the runtime's own group ---------------------------------------------------------------------

def _cpu_capable(group: dist.ProcessGroup) -> bool:
    """Whether ``group`` carries CPU tensors (gloo, alone or beside NCCL as ``cpu:gloo,cuda:nccl``)."""
    return "gloo" in str(dist.get_backend(group))


def runtime_group(groups: ParallelGroups, ranks: int) -> dist.ProcessGroup:
    """The group of the runtime's own traffic (``ranks``: the pipeline's): the pp group when it
    carries CPU tensors; else one gloo group per pipeline (``groups.pipelines``, or the world when
    it is one pipeline), this rank's. Every rank creates every pipeline's group, in the same order."""
    if _cpu_capable(groups.pp):
        return groups.pp
    if groups.pipelines is not None:
        pipelines = groups.pipelines
    elif ranks == dist.get_world_size():
        pipelines = (tuple(range(ranks)),)
    else:
        raise ValueError(f"group: the pp group's backend is {dist.get_backend(groups.pp)!r}, which does not "
                         "carry CPU tensors; pass a gloo group over its ranks (or the whole mesh, or parallel_dims)")
    mine, _ = dist.new_subgroups_by_enumeration([list(p) for p in pipelines], backend="gloo")
    return mine


def world_group() -> dist.ProcessGroup | None:
    """A group of every rank that carries CPU tensors: the default group when it does (None), else
    a gloo group over the world (every rank creates it, in the same order)."""
    return None if _cpu_capable(None) else dist.new_group(backend="gloo")


def agree_on_data(problem: str | None, group: dist.ProcessGroup | None) -> None:
    """Every rank's verdict on its step's data (``problem``: what is wrong with it, None when
    nothing is), gathered over ``group`` (all ranks take part) before the step: a ValueError on
    every rank when any rank refused (none starts a step another refused)."""
    flags = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(flags, torch.tensor([int(problem is not None)]), group=group)
    if not any(int(f) for f in flags):  # the usual case: one small gather, no pickling
        return
    every: list = [None] * len(flags)
    dist.all_gather_object(every, problem, group=group)
    if problem is not None:
        raise ValueError(problem)
    rank, why = next((r, p) for r, p in enumerate(every) if p is not None)
    raise ValueError(f"batch: rank {rank} refused its step's data ({why}); no rank runs the step")
