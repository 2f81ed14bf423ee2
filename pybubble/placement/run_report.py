"""A training run's report, ``pybubble.runtime_report/3``: what every rank's runtime saw, step by
step, gathered into one JSON document, and its reader.

Each rank turns its runtime's :class:`~pybubble.placement.records.StepRecord` list into its figures
(:func:`rank_figures`: plain data, with when each step ended and the rank's parameter checksum,
which only the trainer knows); rank 0 gathers them (``torch.distributed.all_gather_object``) and
:func:`run_report` makes the document; :func:`read_report` reads it back (one report, or a dict of
reports by mode), refusing a file of another format or without its fields, naming what is wrong.

Times are seconds. Step s takes from the last rank's end of step s - 1 (for step 0: the first
rank's start) to the last rank's end of step s, everything included (the runtime's planning and
barriers, the optimizer); the settled steps start at step 2 (step 0 profiles, step 1 runs the first
adapted plan). The fields: docs/formats.md, "pybubble.runtime_report/3".
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..config.documents import read_text
from .measured import MeasuredCosts
from .records import StepRecord, consumer_delays

REPORT_FORMAT = "pybubble.runtime_report/3"
"""The format key of a run's report."""

_TP_LISTS = ("gaps_s", "pieces", "launched_s", "resumed_s", "in_flight_s")
"""A rank's TP figures kept per wait (the others are summed over the settled steps)."""

REQUIRED = ("format", "mode", "steps", "step_times_s", "predicted_steps_s", "settled_steps", "median_step_s",
            "predicted_step_s", "param_checksum", "costs", "prediction_error")
"""The fields :func:`read_report` requires of a report."""


def settled_steps(steps: int) -> list[int]:
    """The steps a report's medians take: from step 2 (step 0 profiles, step 1 runs the first
    adapted plan), or the last one of a shorter run."""
    return list(range(min(2, steps - 1), steps))


def tp_figures(records: Sequence[StepRecord]) -> dict[str, Any]:
    """One rank's TP collectives over the settled steps: waits, the time waited and filled, the
    pieces launched in them as (measured duration, time taken, gap) triples, and per wait the
    collective's launch, the consumer's resumption and the measured duration of the piece then
    running (for the delays, measured across the TP group)."""
    settled = records[min(2, len(records) - 1):]
    out: dict[str, Any] = {k: sum(getattr(r.tp, k) for r in settled)
                           for k in ("waits", "gap_s", "waited_s", "filled", "filled_s")}
    for k in _TP_LISTS:
        out[k] = [g for r in settled for g in getattr(r.tp, k)]
    return out


def rank_figures(records: Sequence[StepRecord], costs: MeasuredCosts, *, ends: Sequence[float],
                 checksum: float = 0.0, host: str = "") -> dict[str, Any]:
    """One rank's figures for the report, from its runtime's ``records`` and last ``costs``:
    ``ends[s]``, when the trainer's step s ended on this rank (``time.perf_counter()``, after its
    optimizer); ``checksum``, the rank's share of the parameters' float64 sum (each parameter
    counted once over the ranks); ``host``, the machine (ranks of one host share one clock: the TP
    consumers' delays are measured across them)."""
    if len(ends) != len(records):
        raise ValueError(f"ends: {len(ends)} steps, the runtime recorded {len(records)}")
    def each(field: str) -> list[Any]:
        return [getattr(r, field) for r in records]
    return {"starts": each("start"), "ends": list(ends), "predicted": each("predicted_s"), "checksum": checksum,
            "filler": asdict(records[-1].filler), "filled": [r.filler.filled for r in records],
            "waits": [{k: None if w is None else asdict(w) for k, w in r.waits.items()} for r in records],
            "costs": asdict(costs), "overruns": [r.filler.overruns for r in records],
            "held_max_s": [r.filler.held_max_s for r in records], "tp_waits": tp_figures(records), "host": host,
            "encoder_s": each("encoder_s"), "llm_s": each("llm_s"), "tiles": each("tiles"), "chunks": each("chunks"),
            "spans": each("spans"), "imbalance": each("imbalance"), "dp_collectives_s": each("dp_collectives_s"),
            "dp_replicas_s": each("dp_replicas_s"), "traces": each("traces"),
            "data": [None if r.layout is None else {"run": r.layout.slot_tiles, "given": r.layout.given_tiles,
                                                   "layout": r.layout.name} for r in records]}


def settled_waits(every: Sequence[Mapping[str, Any]], settled: Sequence[int]) -> list[dict]:
    """Per rank, per kind of wait: seconds waited and seconds filled, summed over the settled
    steps (None: a kind not observed)."""
    out = []
    for e in every:
        kinds = {}
        for kind in ("pp", "dp", "tp"):
            seen = [e["waits"][s][kind] for s in settled if e["waits"][s][kind] is not None]
            kinds[kind] = None if not seen else {f: sum(w[f] for w in seen) for f in ("waited_s", "filled_s")}
        out.append(kinds)
    return out


def _percentiles(values: Sequence[float]) -> list[float]:
    return [float(v) for v in np.percentile(values, [10, 50, 90, 100])] if values else []


def tp_report(every: Sequence[Mapping[str, Any]], tp: int, one_clock: bool) -> dict[str, Any]:
    """The TP waits of the settled steps: per rank, the TP collectives' gaps, the seconds blocked in
    them with no piece running and the seconds the encoder filled, and (``one_clock``: CPU ranks of
    one host) the consumers' delays and overruns against each TP group's last launch; the share of
    the gaps filled; over all ranks, the distribution (10/50/90th percentile, max) of the pieces'
    durations against the gaps they went into. ``tp``: the TP degree (the mesh's innermost)."""
    per_rank = [{k: v for k, v in e["tp_waits"].items() if k not in _TP_LISTS} for e in every]
    if tp > 1 and one_clock:
        for g in range(0, len(every), tp):
            group = every[g:g + tp]
            delays = consumer_delays(*([e["tp_waits"][k] for e in group] for k in _TP_LISTS[2:]))
            for r, d in zip(per_rank[g:g + tp], delays):
                r.update({k: v for k, v in d.items() if k != "waits"})
    pieces = [p for e in every for p in e["tp_waits"]["pieces"]]
    gaps = sum(r["gap_s"] for r in per_rank)
    return {"per_rank": per_rank, "filled_fraction": sum(r["filled_s"] for r in per_rank) / gaps if gaps else 0.0,
            "gap_s": _percentiles([g for e in every for g in e["tp_waits"]["gaps_s"]]),
            "piece_s": _percentiles([p[1] for p in pieces]), "piece_measured_s": _percentiles([p[0] for p in pieces]),
            "filled_gap_s": _percentiles([p[2] for p in pieces])}


def data_report(every: Sequence[Mapping[str, Any]], settled: Sequence[int], chunk_tiles: int) -> dict[str, Any]:
    """Data that varies per step: per rank over the settled steps the encoder's and the LLM's
    seconds and the idle time by kind (waited, not filled); per step the tiles each replica ran per
    slot and its chunks per slot's deadline (packed chains: slots whose tiles earlier chains ran
    have 0) and its chains' spans (None: one chunk each), the slots' most over mean tiles as given
    and as laid out (rank 0's replica), the layout chosen, the replicas' most over mean tiles before and after the moves; the tiles of a chunk."""
    waits = settled_waits(every, settled)
    rows = [r for r in every[0]["data"] if r is not None]

    def spread(tiles: list[int]) -> float:
        return max(tiles) / statistics.mean(tiles) if sum(tiles) else 1.0

    return {"per_rank": [{"encoder_s": sum(e["encoder_s"][s] for s in settled),
                          "llm_s": sum(e["llm_s"][s] for s in settled),
                          "idle_s": {k: None if w[k] is None else w[k]["waited_s"] for k in ("pp", "dp", "tp")}}
                         for e, w in zip(every, waits)],
            "tiles": [e["tiles"] for e in every], "chunks": [e["chunks"] for e in every],
            "spans": [e.get("spans") for e in every],
            "slot_imbalance_given": [spread(r["given"]) for r in rows],
            "slot_imbalance_run": [spread(r["run"]) for r in rows], "layout": [r["layout"] for r in rows],
            "replica_imbalance": every[0]["imbalance"], "chunk_tiles": chunk_tiles}


def run_report(every: Sequence[Mapping[str, Any]], run: Mapping[str, Any], *, tp: int = 1, one_clock: bool = True,
               chunk_tiles: int | None = None) -> dict[str, Any]:
    """The run's report from every rank's :func:`rank_figures` (rank order): ``run``, what the
    trainer says of the run (``mode``, ``schedule``, ``pp``, ``dp`` ... as it names them), comes
    first; ``tp``, the TP degree; ``one_clock``, whether the ranks share one clock (CPU ranks of one
    host: the TP consumers' delays are measured); ``chunk_tiles``, with data that varies per step,
    the tiles of one chunk (the report then has its ``data`` section)."""
    steps = len(every[0]["ends"])
    ends = [max(e["ends"][s] for e in every) for s in range(steps)]
    step_times = [ends[0] - min(e["starts"][0] for e in every)] + [ends[s] - ends[s - 1] for s in range(1, steps)]
    settled = settled_steps(steps)
    # the replicas wait for each other: the step is its slowest replica's
    predicted = [max(e["predicted"][s] for e in every) for s in range(steps)]
    return {
        "format": REPORT_FORMAT, **run, "tp": tp,
        "tp_waits": tp_report(every, tp, one_clock and len({e["host"] for e in every}) == 1),
        "steps": steps, "step_times_s": step_times, "predicted_steps_s": predicted, "settled_steps": settled,
        "median_step_s": statistics.median(step_times[s] for s in settled),
        "predicted_step_s": statistics.median(predicted[s] for s in settled),
        "param_checksum": sum(e["checksum"] for e in every), "costs": every[0]["costs"],
        "filler": [e["filler"] for e in every], "filled_per_step": [e["filled"] for e in every],
        "waits": settled_waits(every, settled),
        # per rank, over the settled steps: LLM ops held up by a task longer than its estimate,
        # and the longest hold-up (at most one piece)
        "overruns": [sum(e["overruns"][s] for s in settled) for e in every],
        "held_max_s": [max(e["held_max_s"][s] for s in settled) for e in every],
        "prediction_error": statistics.median(abs(predicted[s] - step_times[s]) / step_times[s] for s in settled),
        # per rank, over the settled steps: what the prediction counts for the data-parallel replicas
        # (0 with one): the collectives' own time where they meet, the waits for the other replicas
        "predicted_dp_s": [{"collectives_s": sum(e["dp_collectives_s"][s] for s in settled),
                            "replicas_s": sum(e["dp_replicas_s"][s] for s in settled)} for e in every],
        "data": None if chunk_tiles is None else data_report(every, settled, chunk_tiles),
        "traces": [e.get("traces") for e in every],  # per rank, per step: encoder traces made (0 expected)
    }


@dataclass(frozen=True)
class RunReport:
    """One mode's report as read back (:func:`read_report`): its main figures typed, the whole
    document in :attr:`doc`."""

    doc: dict[str, Any]
    """The report as written."""

    @classmethod
    def of(cls, doc: Any, where: str = "report") -> RunReport:
        """``doc`` checked: a ``pybubble.runtime_report/3`` with every :data:`REQUIRED` field."""
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        if doc.get("format") != REPORT_FORMAT:
            raise ValueError(f"{where}: format: {doc.get('format')!r} is not {REPORT_FORMAT!r}")
        missing = [k for k in REQUIRED if k not in doc]
        if missing:
            raise ValueError(f"{where}: {missing[0]}: missing")
        if len(doc["step_times_s"]) != doc["steps"] or len(doc["predicted_steps_s"]) != doc["steps"]:
            raise ValueError(f"{where}: step_times_s: {len(doc['step_times_s'])} steps, steps says {doc['steps']}")
        return cls(doc)

    @property
    def mode(self) -> str:
        """megatron, coarse or pybubble."""
        return self.doc["mode"]

    def settled_s(self) -> list[float]:
        """The settled steps' times (what the medians take), in step order."""
        return [self.doc["step_times_s"][s] for s in self.doc["settled_steps"]]

    def costs(self) -> MeasuredCosts:
        """The costs the last plan took."""
        return MeasuredCosts(**self.doc["costs"])


def read_report(path: str | os.PathLike[str]) -> dict[str, RunReport]:
    """The reports of a run's file by mode: one report (``{mode: report}``) or a dict of them by mode
    (a run of several modes). ``ValueError`` naming the file and what is wrong."""
    try:
        doc = json.loads(read_text(path))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if isinstance(doc, dict) and "format" in doc:
        report = RunReport.of(doc, str(path))
        return {report.mode: report}
    if not isinstance(doc, dict) or not doc:
        raise ValueError(f"{path}: expected a report or a dict of reports by mode")
    return {mode: RunReport.of(r, f"{path}: {mode}") for mode, r in doc.items()}


__all__ = ["REPORT_FORMAT", "REQUIRED", "RunReport", "data_report", "rank_figures", "read_report", "run_report",
           "settled_steps", "settled_waits", "tp_figures", "tp_report"]
