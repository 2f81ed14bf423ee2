"""The data-parallel waits of a pipeline stage, observed as they happen.

A stage's module sharded with FSDP2 (``fully_shard``) or wrapped in DDP over the mesh's "dp"
dimension communicates outside the pipeline's point-to-point traffic: FSDP2 all-gathers the
parameters before a forward or backward and reduce-scatters the gradients (in the schedule's
``perform_reduce_grad``, after the last backward); DDP all-reduces the gradients inside the last
microbatch's backward. :func:`observe_data_parallel` routes those collectives through torch's own
extension points — FSDP2's ``set_custom_all_gather``/``set_custom_reduce_scatter``, DDP's
``register_comm_hook`` — so that each is issued asynchronously and its wait goes to the caller's
``wait(works)`` (the runtime hands it to the filler, which runs encoder tasks while it is
pending). The collectives themselves are torch's (``all_gather_single``, ``reduce_scatter_single``,
``all_reduce``, the groups FSDP2 and DDP chose); nothing of FSDP2's or DDP's logic is copied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from . import torch_seams

AllGather, ReduceScatter = torch_seams.fsdp_comm_classes()

Wait = Callable[[Sequence[dist.Work]], None]
"""Blocks until the works completed (and may fill the time)."""


class _Allocating:
    """Buffers as FSDP2's default collectives allocate them (a plain ``torch.empty``)."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer of ``size`` for the collective."""
        return torch.empty(size, dtype=dtype, device=device)


class ObservedAllGather(_Allocating, AllGather):
    """FSDP2's parameter all-gather, issued asynchronously; a blocking call's wait goes to
    ``wait`` (an asynchronous one's work is returned to FSDP2, which waits on it later)."""

    def __init__(self, wait: Wait):
        self.wait = wait

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=True)
        if async_op:
            return work
        self.wait([work])
        return None


class ObservedReduceScatter(_Allocating, ReduceScatter):
    """FSDP2's gradient reduce-scatter, issued asynchronously; its wait goes to ``wait``."""

    def __init__(self, wait: Wait):
        self.wait = wait

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work | None:
        work = dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group, async_op=True)
        if async_op:
            return work
        self.wait([work])
        return None


def _observed_allreduce(wait: Wait):
    """A DDP communication hook: torch's default (the bucket averaged over the group), issued
    asynchronously and waited through ``wait`` before DDP gets the result."""

    def hook(group, bucket):  # no annotations: DDP checks them as objects, this module has postponed ones
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size(group))
        work = dist.all_reduce(buffer, group=group, async_op=True)
        wait([work])
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(buffer)
        return done

    return hook


def observe_data_parallel(module: nn.Module, wait: Wait, dp_group: dist.ProcessGroup | None = None) -> str | None:
    """Routes the data-parallel collectives of ``module`` (a pipeline stage's module) through
    ``wait``: every FSDP2 module in it (``fully_shard``) gets the observed all-gather and
    reduce-scatter; a DDP module gets the observed all-reduce as its communication hook (over
    ``dp_group``, default: DDP's own process group). Returns ``"fsdp"``, ``"ddp"`` or None (no data
    parallelism to observe). Raises ``ValueError`` when the DDP module already has a hook (DDP
    takes one)."""
    if isinstance(module, DistributedDataParallel):
        group = dp_group if dp_group is not None else module.process_group
        try:
            module.register_comm_hook(group, _observed_allreduce(wait))
        except RuntimeError as e:
            raise ValueError(f"stage: its DDP module already has a communication hook ({e})") from None
        return "ddp"
    sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for m in sharded:
        m.set_custom_all_gather(ObservedAllGather(wait))
        m.set_custom_reduce_scatter(ObservedReduceScatter(wait))
    return "fsdp" if sharded else None
