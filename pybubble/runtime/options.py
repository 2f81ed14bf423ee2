"""What a trainer chooses of the runtime, as one frozen tree of dataclasses (torchtitan's
``JobConfig`` style): :class:`RuntimeOptions` (the mode, the microbatches, how many steps the plan
follows) holds :class:`PieceOptions` (how the encoder is cut) and :class:`BalanceOptions` (how data
that varies per step is balanced). Each field is checked when the tree is built: a ``ValueError``
names the field and the value.

:class:`TrainerGroups` says where the trainer's process groups come from (one source: a torchtitan
``ParallelDims``, a ``DeviceMesh`` with or without ``roles``, or explicit groups) and which group
carries the runtime's own traffic. :func:`legacy_arguments` turns the keyword arguments
``EncoderRuntime`` took before (``mode=``, ``mesh=``, ``piece_s=`` ...) into these, with a
``DeprecationWarning`` that names the replacement.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from ..config.checks import integer, one_of
from ..placement.step_placement import PLACEMENTS
from .parallel_groups import ParallelGroups, resolve_groups


DP_REDUCTIONS = ("auto", "mean", "sum")
"""The values of :attr:`RuntimeOptions.dp_reduce`."""
GRADS_TO = ("every_rank", "first_stage")
"""The values of :attr:`RuntimeOptions.grads_to`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PieceOptions:
    """How the encoder is cut into the pieces the plan places."""

    min_s: float | None = None
    """pybubble mode: the encoder's kernels merged into pieces of at least this many seconds
    forward and backward (0: one kernel each; None: the size that pays, chosen at the profile; see
    docs/runtime.md, "How big a piece is"). The baselines run the encoder unsplit."""

    def __post_init__(self) -> None:
        v = self.min_s
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0):
            raise ValueError(f"pieces.min_s: {v!r} is not a number of seconds >= 0 (or None: automatic)")


@dataclass(frozen=True, kw_only=True, slots=True)
class BalanceOptions:
    """How data that varies per step is balanced (docs/runtime.md, "Data that varies per step")."""

    slots: bool = False
    """:meth:`~pybubble.runtime.EncoderRuntime.lay_out` chooses each step's layout of the samples
    over the LLM's slots, the one predicted shortest (False: the samples as given)."""
    replicas: bool = False
    """The step's encoder work moved between the data-parallel replicas (not in megatron mode)."""
    pack_chunks: bool = False
    """Each replica's tiles run as one stream of chunks (one pipeline rank, not megatron)."""

    def __post_init__(self) -> None:
        for name in ("slots", "replicas", "pack_chunks"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"balance.{name}: {getattr(self, name)!r} is not True or False")


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeOptions:
    """Everything a trainer chooses of :class:`~pybubble.runtime.EncoderRuntime`."""

    mode: str = "pybubble"
    """Where the encoder runs: ``megatron`` (inside the first stage's ops), ``coarse`` (spread over
    the pp ranks, forwards before the pipeline, backwards after it) or ``pybubble`` (its pieces in
    the pipeline's waits, where the core's schedule puts them)."""
    microbatches: int | None = None
    """The schedule's microbatches per step (None: read from its action table)."""
    keep: int = 5
    """Steps whose measured costs the plan follows (their medians)."""
    trace: bool = False
    """Each step's record keeps (what, start, end) of its tasks, ops and waits."""
    pieces: PieceOptions = field(default_factory=PieceOptions)
    """How the encoder is cut into pieces."""
    balance: BalanceOptions = field(default_factory=BalanceOptions)
    """How data that varies per step is balanced."""
    dp_reduce: str = "auto"
    """How the encoder's gradients are reduced over the data-parallel replicas: ``mean`` (as FSDP2
    and DDP do by default), ``sum`` (as torchtitan does: FSDP2's divide factor 1.0, the loss divided
    by the global token count) or ``auto``: as the stages' FSDP2 or DDP modules reduce the LLM's,
    refused where the runtime cannot tell (docs/runtime.md, "How the gradients are reduced")."""
    compute_dtype: Any = None
    """The dtype the encoder computes in, as FSDP2's mixed precision computes the LLM's: its
    floating parameters cast to it for each piece (the parameters and their gradients stay in their
    own dtype: the master weights) and its floating inputs cast to it (None: its parameters' dtype).
    Give the trainer's ``param_dtype`` (torchtitan's ``training.mixed_precision_param``)."""
    grads_to: str = "every_rank"
    """Where the encoder's gradients land when a step returns: ``every_rank`` of the pipeline, or
    ``first_stage``: the rank of the LLM's first stage holds them, the others none until
    :meth:`~pybubble.runtime.EncoderRuntime.share_grads` (a trainer that clips over the whole
    pipeline then counts them once)."""

    def __post_init__(self) -> None:
        one_of(self.mode, PLACEMENTS, "mode")
        one_of(self.dp_reduce, DP_REDUCTIONS, "dp_reduce")
        one_of(self.grads_to, GRADS_TO, "grads_to")
        if self.compute_dtype is not None and not (isinstance(self.compute_dtype, torch.dtype)
                                                   and self.compute_dtype.is_floating_point):
            raise ValueError(f"compute_dtype: {self.compute_dtype!r} is not a floating torch.dtype (or None: the "
                             "parameters' own)")
        if self.microbatches is not None:
            integer(self.microbatches, "microbatches", minimum=1)
        integer(self.keep, "keep", minimum=1)
        if not isinstance(self.trace, bool):
            raise ValueError(f"trace: {self.trace!r} is not True or False")
        for name, kind in (("pieces", PieceOptions), ("balance", BalanceOptions)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name}: {getattr(self, name)!r} is not a {kind.__name__}")


@dataclass(frozen=True, kw_only=True)
class TrainerGroups:
    """Where the runtime finds the trainer's process groups: exactly one source of ``parallel_dims``
    (a torchtitan ``ParallelDims``), ``mesh`` (a ``DeviceMesh``, with ``roles`` naming its
    dimensions when they are not pp/dp/tp or torchtitan's names) or the explicit ``pp``/``dp``/``tp``
    groups; none: the pipeline is the stage's own group (see
    :func:`~pybubble.runtime.parallel_groups.resolve_groups`)."""

    mesh: Any = None
    """A ``DeviceMesh``."""
    roles: Mapping[str, str | Sequence[str] | None] | None = None
    """The mesh's dimension of each role (``{"pp": "stage", "dp": ("replica", "shard")}``)."""
    parallel_dims: Any = None
    """A torchtitan ``ParallelDims`` (duck-typed; torchtitan is not imported)."""
    pp: dist.ProcessGroup | None = None
    """The pipeline's group."""
    dp: dist.ProcessGroup | None = None
    """The data-parallel replicas' group."""
    tp: dist.ProcessGroup | None = None
    """The tensor-parallel group."""
    traffic: dist.ProcessGroup | None = None
    """Where the runtime's own traffic goes (None: the pp group when it carries CPU tensors, else one
    gloo group per pipeline)."""

    @classmethod
    def of(cls, groups: Any) -> TrainerGroups:
        """``groups`` as given to the runtime: a :class:`TrainerGroups`, a ``DeviceMesh``, a torchtitan
        ``ParallelDims`` (anything with ``get_mesh``), or None."""
        if groups is None:
            return cls()
        if isinstance(groups, TrainerGroups):
            return groups
        if hasattr(groups, "get_mesh"):
            return cls(parallel_dims=groups)
        if hasattr(groups, "mesh_dim_names"):
            return cls(mesh=groups)
        raise ValueError(f"groups: {type(groups).__name__} is not a DeviceMesh, a torchtitan ParallelDims or a "
                         "TrainerGroups")

    def resolve(self, default_pp: dist.ProcessGroup | None) -> ParallelGroups:
        """This rank's groups by role (``default_pp``: the stage's own group, the pipeline without a
        source)."""
        return resolve_groups(mesh=self.mesh, parallel_dims=self.parallel_dims, roles=self.roles, pp_group=self.pp,
                              dp_group=self.dp, tp_group=self.tp, default_pp=default_pp)


LEGACY = {"mode": "options", "microbatches": "options", "keep": "options", "piece_s": "options.pieces.min_s",
          "balance_replicas": "options.balance.replicas", "pack_chunks": "options.balance.pack_chunks",
          "mesh": "groups", "parallel_dims": "groups", "roles": "groups=TrainerGroups(mesh=..., roles=...)",
          "pp_group": "groups=TrainerGroups(pp=...)", "dp_group": "groups=TrainerGroups(dp=...)",
          "tp_group": "groups=TrainerGroups(tp=...)", "group": "groups=TrainerGroups(traffic=...)"}
"""``EncoderRuntime``'s keyword arguments before :class:`RuntimeOptions` and :class:`TrainerGroups`,
each with what replaces it."""


def legacy_arguments(options: RuntimeOptions | None, groups: Any,
                     legacy: Mapping[str, Any]) -> tuple[RuntimeOptions, TrainerGroups]:
    """The options and groups of a runtime built with the old keyword arguments ``legacy`` (each
    warned of, naming its replacement) beside the new ``options`` and ``groups``. An unknown
    argument is a ``TypeError``, as Python's own; an old one beside the new one it moved into, a
    ``ValueError`` naming both."""
    unknown = sorted(set(legacy) - set(LEGACY))
    if unknown:
        raise TypeError(f"EncoderRuntime() got an unexpected keyword argument {unknown[0]!r}")
    for name in legacy:
        warnings.warn(f"EncoderRuntime({name}=...) is deprecated: pass {LEGACY[name]}", DeprecationWarning,
                      stacklevel=3)
    opts = _legacy_options(options, legacy)
    found = TrainerGroups.of(groups)
    moved = {k: legacy[k] for k in ("mesh", "roles", "parallel_dims") if k in legacy}
    moved |= {new: legacy[old] for old, new in (("pp_group", "pp"), ("dp_group", "dp"), ("tp_group", "tp"),
                                                ("group", "traffic")) if old in legacy}
    if moved and groups is not None and set(moved) != {"traffic"}:
        raise ValueError(f"{next(iter(legacy))}: given beside groups; pass one of them")
    return opts, replace(found, **moved)


def _legacy_options(options: RuntimeOptions | None, legacy: Mapping[str, Any]) -> RuntimeOptions:
    """``options`` (default ones) with the old option arguments of ``legacy``."""
    top = {k: legacy[k] for k in ("mode", "microbatches", "keep") if k in legacy}
    balance = {new: legacy[old] for old, new in (("balance_replicas", "replicas"), ("pack_chunks", "pack_chunks"))
               if old in legacy}
    if not (top or balance or "piece_s" in legacy):
        return RuntimeOptions() if options is None else options
    if options is not None:
        raise ValueError(f"{next(iter(legacy))}: given beside options; pass one of them")
    return RuntimeOptions(**top, pieces=PieceOptions(min_s=legacy.get("piece_s")),
                          balance=BalanceOptions(**{k: bool(v) for k, v in balance.items()}))


__all__ = ["BalanceOptions", "LEGACY", "PieceOptions", "RuntimeOptions", "TrainerGroups", "legacy_arguments"]
