"""A training run's report (``pybubble.runtime_report/3``, :mod:`pybubble.placement.run_report`)
gathered from every rank's runtime: one call after the last step."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

import torch.distributed as dist

from ..placement.run_report import rank_figures, run_report
from .encoder_runtime import EncoderRuntime


def gather_figures(runtime: EncoderRuntime, *, ends: Sequence[float], checksum: float = 0.0,
                   group: dist.ProcessGroup | None = None) -> list[dict[str, Any]]:
    """Every rank's figures (:func:`~pybubble.placement.run_report.rank_figures` of its runtime's
    records), gathered over ``group`` (default: the world) on every rank. ``ends[s]``: when this
    rank's step s ended (after its optimizer); ``checksum``: its share of the parameters' float64
    sum (each parameter counted on one rank)."""
    mine = rank_figures(runtime.records, runtime.costs, ends=ends, checksum=checksum, host=socket.gethostname())
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return every


def report_of(runtime: EncoderRuntime, every: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> dict[str, Any]:
    """The report of a run whose ranks' figures are ``every`` (:func:`gather_figures`), ``run`` what the
    trainer says of it (its mode, schedule, degrees ... first in the report); with a ``data`` section
    when its samples were laid out (:meth:`~pybubble.runtime.EncoderRuntime.lay_out`)."""
    varying = any(r.layout is not None for r in runtime.records)
    return run_report(every, run, tp=runtime.groups.tp_size, one_clock=runtime.device.type == "cpu",
                      chunk_tiles=runtime.chunk_tiles if varying else None)


def gather_report(runtime: EncoderRuntime, run: Mapping[str, Any], *, ends: Sequence[float], checksum: float = 0.0,
                  group: dist.ProcessGroup | None = None) -> dict[str, Any] | None:
    """The run's report on rank 0 of ``group`` (None on the others): every rank calls it once, after
    its last step (:func:`gather_figures`, :func:`report_of`)."""
    every = gather_figures(runtime, ends=ends, checksum=checksum, group=group)
    return report_of(runtime, every, run) if dist.get_rank(group) == 0 else None


__all__ = ["gather_figures", "gather_report", "report_of"]
