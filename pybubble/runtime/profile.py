"""The runtime's first measurement, before its first step: the encoder's pieces timed on one
microbatch, the pipeline's point-to-point latency, both shared by every rank of the pipeline; and
the pieces the runtime runs, kernels merged where a task's own cost would not pay
(:func:`profile_pieces`)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..placement.measured import FIELDS, MeasuredCosts
from .boundary import TAG_BASE
from .segments import MicrobatchRun, Piece, merge_pieces

OWN_SHARE = 0.02
"""The automatic granularity: consecutive kernels merge into pieces of at least the per-task cost
(measured at the profile) over this share, so what a task costs of its own is at most about 2% of
it."""


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


def pass_s(pieces: Sequence[Piece], example: tuple[torch.Tensor, ...], now: Callable[[], float],
           repeats: int = 3) -> float:
    """The shortest of ``repeats`` whole passes of ``pieces`` on ``example`` (every forward, then
    every backward), timed with ``now``: the kernels' pass against the unsplit encoder's gives what
    a task costs of its own. Not derived from :func:`time_pieces`: a sum of per-piece minimums comes
    out short of a pass under load, and on CUDA its clock synchronizes after every piece, which the
    runtime's launches do not."""
    best = math.inf
    for _ in range(repeats):
        t = now()
        run = MicrobatchRun(pieces, example)
        for i in range(len(pieces)):
            run.forward_piece(i)
        run.output_grad = torch.ones_like(run.output())
        for i in range(len(pieces) - 1, -1, -1):
            run.backward_piece(i)
        best = min(best, now() - t)
    return best


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


def check_piece_s(piece_s: float | None, mode: str) -> float | None:
    """The granularity a runtime profiles for (:func:`profile_pieces`): the baselines (``megatron``,
    ``coarse``) run the encoder unsplit (``inf``: a trainer without pybubble runs the module whole);
    pybubble ``piece_s`` (None: automatic; ValueError unless None or a number >= 0)."""
    if piece_s is not None and (isinstance(piece_s, bool) or not isinstance(piece_s, (int, float))
                                or math.isnan(piece_s) or piece_s < 0):
        raise ValueError(f"piece_s: {piece_s!r} is not a number of seconds >= 0 (or None: automatic)")
    if mode in ("megatron", "coarse"):
        return math.inf
    return None if piece_s is None else float(piece_s)


def piece_groups(fwd_s: Sequence[float], bwd_s: Sequence[float], min_s: float) -> list[int]:
    """Consecutive pieces grouped so that each group's forward and backward take at least
    ``min_s`` (a shorter last group joins the one before): the groups' sizes, in order."""
    groups: list[int] = []
    size, total = 0, 0.0
    for f, b in zip(fwd_s, bwd_s):
        size, total = size + 1, total + (f + b)
        if total >= min_s:
            groups.append(size)
            size, total = 0, 0.0
    if size:
        if groups:
            groups[-1] += size
        else:
            groups.append(size)
    return groups


def _summed(costs: MeasuredCosts, groups: Sequence[int]) -> MeasuredCosts:
    """``costs`` with each group's pieces summed."""
    edges = [0, *itertools.accumulate(groups)]
    spans = list(zip(edges, edges[1:]))
    return dataclasses.replace(costs, piece_fwd_s=[sum(costs.piece_fwd_s[a:b]) for a, b in spans],
                               piece_bwd_s=[sum(costs.piece_bwd_s[a:b]) for a, b in spans])


def profile_pieces(kernels: Sequence[Piece], example: tuple[torch.Tensor, ...], now: Callable[[], float],
                   group: dist.ProcessGroup, stages: int, p2p_s: float,
                   piece_s: float | None) -> tuple[list[Piece], MeasuredCosts]:
    """The pieces the runtime runs and their costs (:func:`shared_profile`, the same on every rank):
    ``kernels`` (:func:`~pybubble.runtime.segments.split_into_pieces`) merged (:func:`merge_pieces`)
    into pieces of at least ``piece_s`` forward and backward (``inf``: the encoder unsplit; 0: one
    kernel each). ``None``: at least the per-task cost over :data:`OWN_SHARE`, that cost measured
    as a pass of the kernels' time beyond the unsplit encoder's (:func:`pass_s`), per kernel."""
    whole = merge_pieces(kernels, [len(kernels)])
    if piece_s == math.inf or len(kernels) == 1:
        return whole, shared_profile(group, stages, p2p_s, *time_pieces(whole, example, now))
    fwd, bwd = time_pieces(kernels, example, now)
    if piece_s is None:  # two more figures to share: a whole pass of the kernels, one of the unsplit encoder
        fwd, bwd = fwd + [pass_s(kernels, example, now)], bwd + [pass_s(whole, example, now)]
    costs = shared_profile(group, stages, p2p_s, fwd, bwd)
    if piece_s is None:
        (*kf, split), (*kb, unsplit) = costs.piece_fwd_s, costs.piece_bwd_s
        costs = dataclasses.replace(costs, piece_fwd_s=kf, piece_bwd_s=kb)
        piece_s = max(0.0, split - unsplit) / (len(kernels) - 1) / OWN_SHARE
    groups = piece_groups(costs.piece_fwd_s, costs.piece_bwd_s, piece_s)
    return merge_pieces(kernels, groups), _summed(costs, groups)





def share_samples(sample: np.ndarray, outside_s: float, group: dist.ProcessGroup, ranks: int) -> np.ndarray:
    """Every rank's sample of the last step, gathered over ``group`` (one row per rank), with this
    rank's ``outside`` set to ``outside_s`` (the trainer's own time between the two steps)."""
    sample = sample.copy()
    sample[FIELDS.index("outside")] = outside_s
    mine = torch.from_numpy(sample)
    every = [torch.zeros_like(mine) for _ in range(ranks)]
    dist.all_gather(every, mine, group=group)
    return torch.stack(every).numpy()


__all__ = ["OWN_SHARE", "check_piece_s", "p2p_latency", "pass_s", "piece_groups", "profile_pieces", "share_samples", "shared_profile",
           "time_pieces"]
