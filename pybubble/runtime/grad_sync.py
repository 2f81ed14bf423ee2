"""The encoder's gradients after a step: summed over the pipeline ranks that ran its microbatches,
averaged over the data-parallel replicas (as FSDP2 and DDP average the LLM's)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from ..measure import names
from ..placement.plan import RankPlan


def sync_grads(module: nn.Module, group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None = None) -> None:
    """Sums ``module``'s gradients over the ranks of ``group`` (one flat all-reduce; None: no
    sum), then averages them over ``dp_group`` (the data-parallel replicas, as FSDP2 and DDP
    average the LLM's gradients)."""
    params = list(module.parameters())
    flat = torch.cat([p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1) for p in params])
    if group is not None:
        dist.all_reduce(flat, group=group)
    if dp_group is not None:
        dist.all_reduce(flat, group=dp_group)
        flat /= dist.get_world_size(dp_group)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def sync_step_grads(encoder: nn.Module, plan: RankPlan, rank: int, ranks: int, pp_group: dist.ProcessGroup | None,
                    dp_group: dist.ProcessGroup | None) -> bool:
    """The encoder's gradients summed over the pp ranks that ran its microbatches and averaged over
    the replicas; False when this rank has none to sync."""
    spread = plan.mode != "megatron" and ranks > 1  # the encoder's microbatches ran on several pp ranks
    holds = plan.mode != "megatron" or rank == plan.first_stage  # megatron: on the first stage's rank only
    if not (spread or (holds and dp_group is not None)):
        return False
    with record_function(names.region("grad_sync")):
        sync_grads(encoder, pp_group if spread else None, dp_group if holds else None)
    return True



def timed_grad_sync(encoder: nn.Module, plan: RankPlan, rank: int, ranks: int, pp_group: dist.ProcessGroup | None,
                    dp_group: dist.ProcessGroup | None, now: Callable[[], float]) -> float | None:
    """:func:`sync_step_grads`, timed with ``now``; None when this rank had none to sync."""
    t = now()
    return now() - t if sync_step_grads(encoder, plan, rank, ranks, pp_group, dp_group) else None


__all__ = ["sync_grads", "sync_step_grads", "timed_grad_sync"]
