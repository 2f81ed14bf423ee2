"""The encoder's gradients after a step: summed over the pipeline ranks that ran its microbatches,
reduced over the data-parallel replicas the way the trainer reduces the LLM's (the mean, as FSDP2
and DDP do by default, or the sum, as torchtitan does), on every pipeline rank or on the first
stage's rank only (``grads_to``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from ..measure import names
from ..placement.plan import RankPlan
from . import torch_seams


def dp_reduction(option: str, modules: Sequence[nn.Module], replicas: int) -> str:
    """How the encoder's gradients are reduced over ``replicas`` data-parallel replicas: ``option``
    (``mean`` or ``sum``) where it agrees with the stages' ``modules``, or, with ``auto``, as their
    FSDP2 modules (divide factor None: mean, 1.0: sum) or DDP (mean) reduce the LLM's. ValueError
    where they disagree, or where ``auto`` finds neither (it cannot tell)."""
    found = set()
    for module in modules:
        if isinstance(module, DistributedDataParallel):
            found.add("mean")
        for m in module.modules():
            if isinstance(m, FSDPModule):
                for factor in torch_seams.fsdp_divide_factors(m):
                    found.add("mean" if factor is None or factor == replicas else
                              "sum" if factor == 1.0 else f"a divide factor of {factor:g}")
    if replicas == 1:
        return "mean" if option == "auto" else option  # one replica: both leave the gradients as they are
    if len(found) > 1 or (found and not found <= {"mean", "sum"}):
        raise ValueError(f"dp_reduce: the stages' modules reduce the LLM's gradients over dp {replicas} in more than "
                         f"one way ({', '.join(sorted(found))}); the encoder's cannot follow them")
    detected = next(iter(found), None)
    if option == "auto":
        if detected is None:
            raise ValueError(f"dp_reduce: 'auto' cannot tell how the trainer reduces the LLM's gradients over dp "
                             f"{replicas} (no FSDP2 or DDP module in its stages): pass options.dp_reduce='mean' or "
                             "'sum'")
        return detected
    if detected is not None and detected != option:
        raise ValueError(f"dp_reduce: {option!r}, but the stages' modules take the {detected} of the LLM's gradients "
                         f"over dp {replicas}: the encoder would learn at another rate than the LLM; pass "
                         f"{detected!r} or 'auto'")
    return option


def gradient_route(options: Any, stages: Sequence[Any], replicas: int, first_stage: int,
                   pp_group: dist.ProcessGroup | None) -> tuple[str, int | None]:
    """How a runtime with ``options`` reduces the encoder's gradients over ``replicas``
    (:func:`dp_reduction` over its ``stages``' modules) and the global rank that holds them after a
    step (``grads_to == "first_stage"``: the rank of pp rank ``first_stage``; None: every rank)."""
    how = dp_reduction(options.dp_reduce, [st.submod for st in stages if getattr(st, "submod", None) is not None],
                       replicas)
    to = (dist.get_global_rank(pp_group, first_stage) if options.grads_to == "first_stage" and pp_group is not None
          else None)
    return how, to


def flat_grads(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """The gradients of ``params`` as one flat tensor (zeros where a parameter has none)."""
    return torch.cat([p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1) for p in params])


def set_grads(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Each of ``params`` given its slice of ``flat`` (as :func:`flat_grads` lays them out) as gradient."""
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def sync_grads(module: nn.Module, group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None = None,
               *, mean: bool = True, to: int | None = None) -> None:
    """Sums ``module``'s gradients over the ranks of ``group`` (one flat all-reduce, or a reduce to
    global rank ``to`` after which the other ranks hold none; None: no sum), then reduces them over
    ``dp_group`` (the data-parallel replicas: their mean with ``mean``, else their sum)."""
    params = list(module.parameters())
    flat = flat_grads(params)
    if group is not None:
        if to is None:
            dist.all_reduce(flat, group=group)
        else:
            dist.reduce(flat, dst=to, group=group)
    if to is not None and dist.get_rank() != to:
        for p in params:
            p.grad = None
        return
    if dp_group is not None:
        dist.all_reduce(flat, group=dp_group)
        if mean:
            flat /= dist.get_world_size(dp_group)
    set_grads(params, flat)


def share_grads(module: nn.Module, group: dist.ProcessGroup | None, src: int) -> None:
    """``module``'s gradients broadcast from global rank ``src`` over ``group`` (one flat broadcast)."""
    if group is None:
        return
    params = list(module.parameters())
    flat = flat_grads(params)
    dist.broadcast(flat, src=src, group=group)
    if dist.get_rank() != src:
        set_grads(params, flat)


def sync_step_grads(encoder: nn.Module, plan: RankPlan, rank: int, ranks: int, pp_group: dist.ProcessGroup | None,
                    dp_group: dist.ProcessGroup | None, *, mean: bool = True, to: int | None = None) -> bool:
    """The encoder's gradients summed over the pp ranks that ran its microbatches (on every one, or
    on global rank ``to``) and reduced over the replicas; False when this rank has none to sync."""
    spread = plan.mode != "megatron" and ranks > 1  # the encoder's microbatches ran on several pp ranks
    holds = plan.mode != "megatron" or rank == plan.first_stage  # megatron: on the first stage's rank only
    if not (spread or (holds and dp_group is not None)):
        return False
    with record_function(names.region("grad_sync")):
        sync_grads(encoder, pp_group if spread else None, dp_group if holds else None, mean=mean,
                   to=to if spread else None)
    return True


def timed_grad_sync(encoder: nn.Module, plan: RankPlan, rank: int, ranks: int, pp_group: dist.ProcessGroup | None,
                    dp_group: dist.ProcessGroup | None, now: Callable[[], float], *, mean: bool = True,
                    to: int | None = None) -> float | None:
    """:func:`sync_step_grads`, timed with ``now``; None when this rank had none to sync."""
    t = now()
    return now() - t if sync_step_grads(encoder, plan, rank, ranks, pp_group, dp_group, mean=mean, to=to) else None


__all__ = ["dp_reduction", "flat_grads", "gradient_route", "set_grads", "share_grads", "sync_grads", "sync_step_grads",
           "timed_grad_sync"]
