"""The costs a runtime's plans follow, measured as its steps run: the profile before the first step
(the pieces' durations and the p2p latency), then every rank's figures of each step, shared and
kept (:class:`~pybubble.placement.measured.CostHistory`), the medians the next plan takes."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function

from ..measure import names
from ..placement.measured import CostHistory, MeasuredCosts
from .profile import p2p_latency, profile_pieces, share_samples
from .segments import Piece


class StepCosts:
    """One runtime's measured costs. ``group`` and ``ranks``: where the figures are shared (the
    pipeline's, or every rank's with several replicas: they plan from the same costs); ``keep``:
    the steps the medians follow; ``device``: on CUDA the CPU's clock does not time the GPU's work,
    so the costs stay those of the profiling step."""

    def __init__(self, group: dist.ProcessGroup | None, ranks: int, keep: int, device: torch.device):
        self.group, self.ranks, self.keep, self.device = group, ranks, keep, device
        self.history: CostHistory | None = None
        """The measured costs of the last steps (None before the profile)."""
        self.costs: MeasuredCosts | None = None
        """The costs the next plan takes (None before the profile)."""
        self.last_sample: np.ndarray | None = None
        """This rank's figures of the last step (None before one ran)."""
        self.returned: float | None = None
        """When the last step returned to the trainer (``time.perf_counter()``)."""

    def now(self) -> float:
        """``time.perf_counter()`` once the device's queued work is done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def profile(self, kernels: Sequence[Piece], example: tuple[torch.Tensor, ...], traffic: dist.ProcessGroup,
                rank: int, pp_ranks: int, stages: int, output: tuple[Sequence[int], torch.dtype],
                piece_s: float | None) -> list[Piece]:
        """Before the first step: the p2p latency over ``traffic`` and the pieces with their
        durations (:func:`~pybubble.runtime.profile.profile_pieces`); returns the pieces."""
        p2p = p2p_latency(traffic, rank, pp_ranks, *output)
        pieces, initial = profile_pieces(kernels, example, self.now, self.group, stages, p2p, piece_s)
        self.history = CostHistory(initial, keep=self.keep, ranks=self.ranks)
        self.costs = self.history.initial
        return pieces

    def share(self, entry: float, steps: int) -> None:
        """Every rank's figures of the last step (with the trainer's time since it returned, up to
        ``entry``) into the history, and the costs the next plan takes (``steps``: steps run)."""
        if self.last_sample is None:
            return
        with record_function(names.region("sync")):
            every = share_samples(self.last_sample, entry - self.returned, self.group, self.ranks)
        if self.device.type == "cpu" or steps == 1:
            with record_function(names.region("plan")):
                self.history.add(every)
                self.costs = self.history.costs()


__all__ = ["StepCosts"]
