"""The runtime's first measurement, before its first step: the encoder's pieces timed on one
microbatch, the pipeline's point-to-point latency, both shared by every rank of the pipeline."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from .boundary import TAG_BASE
from .placement import MeasuredCosts
from .segments import MicrobatchRun, Piece


def time_pieces(pieces: Sequence[Piece], example: tuple[torch.Tensor, ...], now: Callable[[], float],
                repeats: int = 3) -> tuple[list[float], list[float]]:
    """Each piece's forward and backward on ``example`` (the shortest of ``repeats``), timed with
    ``now`` (on CUDA a clock that synchronizes the device)."""
    n = len(pieces)
    fwd, bwd = [[] for _ in range(n)], [[] for _ in range(n)]
    for _ in range(repeats):
        run = MicrobatchRun(pieces, example)
        for i in range(n):
            t = now()
            run.forward_piece(i)
            fwd[i].append(now() - t)
        run.output_grad = torch.ones_like(run.output())
        for i in range(n - 1, -1, -1):
            t = now()
            run.backward_piece(i)
            bwd[i].append(now() - t)
    return [min(x) for x in fwd], [min(x) for x in bwd]


def p2p_latency(group: dist.ProcessGroup, rank: int, ranks: int, shape: Sequence[int], dtype: torch.dtype,
                rounds: int = 6) -> float:
    """The one-way latency of an encoder output between ranks 0 and 1 of ``group`` (a ping-pong,
    the first round a warm-up); 0 on the other ranks and with one rank."""
    if ranks < 2 or rank >= 2:
        return 0.0
    buf = torch.zeros(tuple(shape), dtype=dtype)
    total = 0.0
    for rep in range(rounds):
        t = time.perf_counter()
        if rank == 0:
            dist.send(buf, group=group, group_dst=1, tag=TAG_BASE - 1)
            dist.recv(buf, group=group, group_src=1, tag=TAG_BASE - 1)
        else:
            dist.recv(buf, group=group, group_src=0, tag=TAG_BASE - 1)
            dist.send(buf, group=group, group_dst=0, tag=TAG_BASE - 1)
        if rep:
            total += (time.perf_counter() - t) / 2
    return total / (rounds - 1)


def shared_profile(group: dist.ProcessGroup, stages: int, p2p_s: float, piece_fwd_s: Sequence[float],
                   piece_bwd_s: Sequence[float]) -> MeasuredCosts:
    """Every rank's figures gathered over ``group``: the largest p2p latency, the pieces' mean
    durations; the ``stages`` LLM stages' costs come from the first step."""
    n = len(piece_fwd_s)
    mine = torch.tensor([p2p_s, *piece_fwd_s, *piece_bwd_s], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    a = torch.stack(every).numpy()
    return MeasuredCosts(stage_fwd_s=[1e-6] * stages, stage_bwd_s=[1e-6] * stages,  # from the first step
                         p2p_s=float(a[:, 0].max()), piece_fwd_s=a[:, 1:1 + n].mean(axis=0).tolist(),
                         piece_bwd_s=a[:, 1 + n:].mean(axis=0).tolist())


__all__ = ["p2p_latency", "shared_profile", "time_pieces"]
