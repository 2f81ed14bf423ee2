"""What a rank saw in one step, as typed records: the filler's counters, the TP waits, and the
step's record that :class:`~pybubble.runtime.EncoderRuntime` keeps per step."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class FillerStats:
    """What one rank's filler did in a step."""

    filled: int = 0
    """Tasks run (launched, on CUDA) inside pipeline waits."""
    filled_s: float = 0.0
    """Their time: measured on the CPU; on CUDA their measured durations (the launch is not timed)."""
    deferred: int = 0
    """Tasks that did not fit a gap and waited for a later one."""
    forced: int = 0
    """Tasks run outside any gap because the LLM needed their result."""
    waits: int = 0
    """Waits of the pipeline the filler saw."""
    waited_s: float = 0.0
    """CPU: time spent blocked with no task running (in waits, and for inputs from other ranks in
    the front and the drain): the rank's idle time outside collectives."""
    held_s: float = 0.0
    """CPU: how long the LLM's ops were held up by tasks: from the arrival of what a wait waited
    for (pipeline and data-parallel waits) to the end of the task then running, summed."""
    held_max_s: float = 0.0
    """CPU: the longest such hold-up (at most one piece: no task starts once the input is there)."""
    overruns: int = 0
    """CPU: hold-ups longer than the estimate of the task that caused them (the piece ran longer
    than the filler expected when it started it)."""
    dp_waits: int = 0
    """Waits on data-parallel collectives (the LLM's gradient reduce-scatter or all-reduce, its
    parameters' all-gather) the filler saw."""
    dp_waited_s: float = 0.0
    """Time blocked in them with no task running."""
    dp_filled: int = 0
    """Tasks run inside them."""
    dp_filled_s: float = 0.0
    """Their time (the tasks' measured time)."""
    settled: int = 0
    """CPU: times the main thread waited for the idle worker's queue."""
    settled_s: float = 0.0
    """CPU: the time it waited (the worker ran the rest of its queue meanwhile)."""


@dataclass(slots=True)
class TPWaitStats:
    """What one rank saw of its TP collectives' waits in a step (CPU figures; on CUDA the gaps are
    not observed and only ``waits``, ``filled`` and ``filled_s`` count)."""

    waits: int = 0
    """TP collectives waited on."""
    gap_s: float = 0.0
    """Their gaps summed: from the consumer's arrival to the collective's completion."""
    waited_s: float = 0.0
    """The part of the gaps with no piece running (the LLM's time blocked in TP waits)."""
    filled: int = 0
    """Pieces run inside those waits."""
    filled_s: float = 0.0
    """The part of the gaps the pieces filled (per wait: the pieces' time, at most the gap)."""
    launched_s: list[float] = field(default_factory=list)
    """CPU, per wait: when its collective was launched on this rank (``time.perf_counter()``; NaN:
    launched before the TP waits were hooked)."""
    resumed_s: list[float] = field(default_factory=list)
    """CPU, per wait: when the consumer resumed (``time.perf_counter()``)."""
    in_flight_s: list[float] = field(default_factory=list)
    """CPU, per wait: the measured duration of the piece the idle worker was running when the
    consumer resumed (0: none), the most the consumer may be delayed by."""
    gaps_s: list[float] = field(default_factory=list)
    """Each wait's gap, in order."""
    pieces: list[tuple[float, float, float]] = field(default_factory=list)
    """Each piece launched at a wait: (measured duration, time it took, the gap of that wait); on
    the CPU the time is the worker thread's CPU time in it, filled in when the step has drained."""
    per_op: list[int] = field(default_factory=list)
    """Waits inside each of the rank's pipeline ops (in the order they run)."""


@dataclass(slots=True)
class WaitFigures:
    """One kind of wait in one step."""

    waited_s: float
    """The LLM's time blocked in such waits with no encoder task running."""
    filled_s: float
    """The encoder tasks' time inside them."""


@dataclass(slots=True)
class LayoutFigures:
    """The layout one step's samples ran in (this replica's)."""

    name: str
    """Which (``given``, or a name of :func:`~pybubble.schedule.balance.row_layouts`)."""
    given_tiles: list[int]
    """Tiles per slot as the samples were given."""
    slot_tiles: list[int]
    """Tiles per slot as laid out."""


@dataclass(kw_only=True, slots=True)
class StepRecord:
    """One step of one rank."""

    predicted_s: float
    """The step its plan predicted."""
    start: float
    """``time.perf_counter()`` after the step's barrier."""
    plan_s: float
    """The planning's time."""
    sync_s: float
    """The encoder's gradient sum's time."""
    filler: FillerStats
    """The filler's counters."""
    tp: TPWaitStats
    """What the TP waits saw."""
    waits: dict[str, WaitFigures | None]
    """Per kind of wait (``pp``, ``dp``, ``tp``); None where the kind is not observed (``dp``
    without FSDP2/DDP on a stage, ``tp`` without tensor parallelism)."""
    dp_collectives_s: float = 0.0
    """With data-parallel replicas: the data-parallel collectives' own time the prediction counts
    for this rank, where its replicas meet (measured in the last steps)."""
    dp_replicas_s: float = 0.0
    """With data-parallel replicas: the time the prediction has this rank wait for other replicas
    (at those collectives and at the encoder's gradient sync: the longest replica of each stretch
    between them) beyond its own plan."""
    trace: list[tuple[str, float, float]] | None = None
    """When the runtime traces: (what, start, end) of the step's tasks, ops and waits."""
    tiles: list[int] | None = None
    """The tiles this rank's replica ran per LLM slot (its chains', moved-in ones included)."""
    chunks: list[int] | None = None
    """The chunks this rank's replica ran per LLM slot's deadline (its chains as they ran: packed
    ones with ``pack_chunks``)."""
    spans: list[list[int]] | None = None
    """Per chain, its chunks in spans as they ran (an image across several chunks: one span of
    them); None where every span was one chunk."""
    imbalance: tuple[float, float] | None = None
    """With encoder work balanced over the replicas: their most over mean tiles before and after
    the moves."""
    encoder_s: float = 0.0
    """The time of this rank's encoder tasks (CPU: measured; CUDA: their estimates)."""
    llm_s: float = 0.0
    """The own time of this rank's LLM ops."""
    layout: LayoutFigures | None = None
    """The layout of the step's samples over the slots that
    :meth:`~pybubble.runtime.EncoderRuntime.lay_out` chose (None: not asked)."""
    traces: int = 0
    """Encoder forwards traced in this process during the step (the pieces are traced once, when the
    runtime is built: 0 expected)."""

    def to_json(self) -> dict[str, Any]:
        """The record as plain data."""
        return asdict(self)


def _lag_figures(lags: list[float]) -> list[float]:
    """[50th percentile, 90th percentile, max] of ``lags`` ([] when there are none)."""
    if not lags:
        return []
    q = statistics.quantiles(lags, n=10, method="inclusive") if len(lags) > 1 else [lags[0]] * 9
    return [float(statistics.median(lags)), float(q[8]), float(max(lags))]


def consumer_delays(launched: Sequence[Sequence[float]], resumed: Sequence[Sequence[float]],
                    in_flight: Sequence[Sequence[float]]) -> list[dict[str, float]]:
    """The delays of the TP collectives' consumers on each rank of one TP group (CPU, one host: the
    ranks' ``time.perf_counter()`` is the same monotonic clock), from :class:`TPWaitStats`'
    ``launched_s``, ``resumed_s`` and ``in_flight_s`` of each rank (the i-th wait of every rank is
    the same collective).

    A collective completes no earlier than its last launch in the group; a wait's *lag* is from
    then to its consumer's resumption: the collective's own time, plus any delay. A rank's own time
    is the median lag of its waits with no piece in flight on its idle worker; a wait with a piece
    in flight is *delayed* by what its lag exceeds that, and an *overrun* when that is more than
    the piece's measured duration. The lags themselves are noisy on a shared host (the scheduler,
    gloo's threads): compare ``lag_s`` and ``lag_free_s``, the 50th and 90th percentiles and the
    largest lag of the waits with a piece in flight and of those without. Per rank: ``delays``,
    ``delay_s`` (their sum), ``delay_max_s``, ``overruns``, ``lag_s``, ``lag_free_s`` (empty: no
    such wait) and ``waits`` (the waits measured: launched while the hooks were active). Raises
    ``ValueError`` when the ranks' waits differ in number."""
    counts = {len(x) for x in (*launched, *resumed, *in_flight)}
    if len(counts) > 1 or not (len(launched) == len(resumed) == len(in_flight)):
        raise ValueError(f"consumer_delays: the ranks' waits differ in number ({sorted(counts)})")
    n = counts.pop() if counts else 0
    last = [max(r[i] for r in launched) for i in range(n)]  # NaN when any rank's launch is unknown
    out = []
    for res, flight in zip(resumed, in_flight):
        measured = [i for i in range(n) if not math.isnan(last[i])]
        lag = {i: res[i] - last[i] for i in measured}
        free = [lag[i] for i in measured if flight[i] <= 0.0]
        busy = [lag[i] for i in measured if flight[i] > 0.0]
        own = statistics.median(free or busy) if measured else 0.0
        excess = [(lag[i] - own, flight[i]) for i in measured if flight[i] > 0.0 and lag[i] > own]
        out.append({"waits": len(measured), "delays": len(excess), "delay_s": sum(e for e, _ in excess),
                    "delay_max_s": max((e for e, _ in excess), default=0.0),
                    "overruns": sum(e > d for e, d in excess), "lag_s": _lag_figures(busy),
                    "lag_free_s": _lag_figures(free)})
    return out


def tp_op_figures(stats: TPWaitStats) -> tuple[float, float, float]:
    """(collectives per pipeline op, median gap, mean gap; seconds) of one step: the median of the
    ops' counts; the median gap is the typical one (what a piece must fit), the mean makes count x
    mean the time the ops waited on TP collectives (the gaps are heavy-tailed on a loaded machine:
    the median leaves most of that time out). NaNs when no TP collective was waited on."""
    counts = [c for c in stats.per_op if c > 0]
    if not counts or not stats.gaps_s:
        return float("nan"), float("nan"), float("nan")
    return (float(statistics.median(counts)), float(statistics.median(stats.gaps_s)),
            float(statistics.fmean(stats.gaps_s)))


__all__ = ["FillerStats", "LayoutFigures", "StepRecord", "TPWaitStats", "WaitFigures", "consumer_delays", "tp_op_figures"]
