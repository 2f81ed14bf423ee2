"""Measured bubbles: idle time per rank read from ``torch.profiler`` Chrome traces of a pipeline
run (one file per rank, or a folder of them), beside a prediction when given.

No torch here: the traces are JSON (plain or gzipped), read as a stream by
:class:`pybubble.measure.trace_reader.Trace`, whatever their size, keeping only the events used below
(:class:`RankTrace`: about 25 bytes each). A rank's trace gives

- its window: the last ``ProfilerStep#`` annotation when there is one, else the span of its
  timeline's events (on the CPU, the main thread's ops and annotations);
- busy time: the union of its compute events: on the CPU (gloo) the ``cpu_op`` events of its
  main thread (the thread with the most of them), its pipeline ops and pybubble's
  ``pybubble:schedule`` span of the whole schedule, and its annotations of work (pybubble's
  ``plan`` and ``setup``, the optimizer's, FSDP's: any annotation that is not a region such as
  ``pybubble:wait``/``front``/``drain``/``grad_sync``/``sync``, ``ProfilerStep#``, gloo's
  collectives and transfers), less the waits inside them (pybubble's ``pybubble:wait``,
  ``dp_wait`` and ``tp_wait``, the host's ``_c10d_functional::wait_tensor``) but for the tasks
  run in those waits (``pybubble:task:*``); on CUDA (NCCL) its GPU kernels except NCCL's;
- idle time: the window less busy time (gaps under ``min_gap_us`` are host glue), split by
  kind: ``collective`` where a collective runs (gloo's ``gloo:all_reduce``/``barrier``/...
  annotations, the gap after a blocking ``c10d::`` collective op, pybubble's ``pybubble:sync``
  and ``pybubble:grad_sync`` regions, NCCL collective kernels), else by the rank's pipeline ops
  (``PP:<stage><F|B|I|W><mb>`` annotations, as torch.distributed.pipelining's runtime and
  pybubble's adapter write them, or GPipe's ``Forward i``/``Backward i``): ``warmup`` before its
  first backward, ``cooldown`` after its last forward, ``steady`` between; without op annotations
  everything not collective is ``steady``;
- idle time split a second way, by what the rank waits for (:func:`idle_by_parallelism`): ``pp``
  the pipeline, ``dp`` a data-parallel collective, ``tp`` a tensor-parallel one, ``other`` the
  runtime's own synchronisation and idle in no wait;
- with the traces of all ranks (one clock on one machine): idle time while one of this rank's
  receives and a peer's send are both posted, i.e. the data can be moving (``transferring``: an
  upper bound of the transfer), and the rest (``waiting``: the peer has not sent yet). gloo's and
  NCCL's own spans run from posting to completion, so one rank's trace alone does not separate
  the two (both None).
"""

from __future__ import annotations

import math
import os
import re
from array import array
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config.checks import integer, shown
from ..config.schema import load_config
from ..llm.step import LLMStep
from ..viz.figures import pyplot, save_figure
from . import intervals as iv
from . import names
from .intervals import Spans
from .trace_reader import Trace, file_rank

IDLE_KINDS = ("warmup", "steady", "cooldown", "collective")
"""Kinds of measured idle time, by the pipeline's phase."""
PARALLEL_KINDS = ("pp", "dp", "tp", "other")
"""Kinds of measured idle time, by what the rank waits for (:func:`idle_by_parallelism`)."""
PREDICTED_KINDS = {"pp_warmup": "warmup", "pp_steady": "steady", "pp_cooldown": "cooldown",
                   "dp_allgather": "collective", "dp_reducescatter": "collective", "tp": "collective"}
"""The simulator's bubble kinds (:data:`pybubble.llm.timeline.BUBBLE_KINDS`) as measured kinds."""
MEASURE_FORMAT = "pybubble.measure/1"
"""The format key of a measurement's document."""
EVENT_CATEGORIES = ("cpu_op", "user_annotation", "kernel", "gpu_user_annotation")
"""The categories of complete ("X") events measure keeps (with those of any category named as a
step, a sync region, a send or a receive): CUDA launches, Python frames, flow arrows and the like
are dropped as the trace is read."""
_CPU_OP, _NOTE, _KERNEL, _GPU_NOTE, _OTHER = range(5)
_CATEGORY = {c: i for i, c in enumerate(EVENT_CATEGORIES)}
_COLLECTIVE = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|barrier|broadcast|all_?to_?all)", re.I)
_TRANSFER = re.compile(r"^(gloo:(send|recv)|nccl:(send|recv))|SendRecv|nccl.*(Send|Recv)", re.I)
_OP = re.compile(rf"{names.OP.pattern}|^(Forward|Backward) \d+$")
_REGION = re.compile(rf"{names.REGION.pattern}|^(ProfilerStep#|gloo:|nccl:)")
_BLOCKING = re.compile(r"^_c10d_functional::wait_tensor$")
"""Host ops that block until a functional collective (DTensor's tensor parallelism) completes:
idle, not busy."""
_SYNC_OP = re.compile(r"^c10d::(allreduce|allgather|barrier|reduce_scatter|broadcast|alltoall)", re.I)
_STEP = re.compile(r"^ProfilerStep#")
_NCCL = re.compile(r"^nccl", re.I)
MIN_GAP_US = 100.0
"""Gaps between busy events shorter than this are the host's own glue (Python, dispatch) between
its ops, not idle time."""
_SEND = re.compile(r"^(gloo|nccl):send|nccl.*Send", re.I)
_RECV = re.compile(r"^(gloo|nccl):recv|nccl.*Recv", re.I)
_ANY_CATEGORY = (_STEP, names.SYNC, _SEND, _RECV)
_OP_KINDS = "FBIW"


@dataclass(slots=True)
class RankBubbles:
    """One rank's measured step, microseconds."""

    rank: int
    """The pipeline rank."""
    device: str
    """``cpu`` (busy = the main thread's ops) or ``cuda`` (busy = GPU kernels)."""
    span: float
    """The step's window."""
    busy: float
    """Busy time in the window."""
    idle: float
    """Idle time in the window (the window less busy time)."""
    idle_by_kind: dict[str, float] = field(default_factory=dict)
    """Idle time per kind of :data:`IDLE_KINDS`."""
    idle_by_parallelism: dict[str, float] = field(default_factory=dict)
    """Idle time per kind of :data:`PARALLEL_KINDS`."""
    waiting: float | None = None
    """Idle time with no transfer of this rank under way (None: the trace shows no transfers)."""
    transferring: float | None = None
    """Idle time while one of this rank's receives and a peer's send are both posted (an upper
    bound of the transfer; None: the trace shows no transfers)."""
    phases_known: bool = True
    """False when the trace has no pipeline op annotations (warm-up and cool-down not separable)."""


@dataclass(slots=True, eq=False)
class RankTrace:
    """The events of one rank's trace that measure uses (complete events of
    :data:`EVENT_CATEGORIES`, and steps, sync regions, sends and receives of any category), as
    columns in file order: about 25 bytes an event, whatever the event held in the file."""

    names: list[str]
    """The events' distinct names."""
    name: np.ndarray
    """int32: each event's index in :attr:`names`."""
    category: np.ndarray
    """int8: each event's index in :data:`EVENT_CATEGORIES` (4: another category)."""
    thread: np.ndarray
    """int32: each event's (pid, tid), numbered in order of first appearance."""
    start: np.ndarray
    """float64: each event's start (us)."""
    end: np.ndarray
    """float64: each event's end (us)."""
    rank: int | None = None
    """The rank of ``distributedInfo``, when the trace has one."""
    world_size: int | None = None
    """The world size of ``distributedInfo``, when the trace has one."""

    @classmethod
    def of_events(cls, events: Iterable[Any], where: str = "trace") -> "RankTrace":
        """The events measure uses of `events` (a trace's ``traceEvents``; entries it does not use
        are skipped); ``ValueError`` naming `where` and the event for a time that is not a finite
        number, or a pid or tid that is not a scalar."""
        names: list[str] = []
        seen: dict[Any, tuple[int, bool]] = {}  # name -> (index, kept in any category)
        threads: dict[Any, int] = {}
        name_col, cat_col, thread_col = array("i"), array("b"), array("i")
        start_col, end_col = array("d"), array("d")
        for i, e in enumerate(events):
            if type(e) is not dict or e.get("ph") != "X" or "ts" not in e or "dur" not in e:
                continue
            name = e.get("name", "")
            if type(name) is not str:
                name = shown(name)
            known = seen.get(name)
            if known is None:
                known = seen[name] = (len(names), any(p.search(name) for p in _ANY_CATEGORY))
                names.append(name)
            category = _CATEGORY.get(e.get("cat"), _OTHER) if isinstance(e.get("cat"), str) else _OTHER
            if category == _OTHER and not known[1]:
                continue
            ts, dur = e["ts"], e["dur"]
            if type(ts) is not float or type(dur) is not float or not (math.isfinite(ts) and math.isfinite(dur)):
                ts, dur = _time(ts, f"{where}: traceEvents[{i}].ts"), _time(dur, f"{where}: traceEvents[{i}].dur")
            try:
                thread = threads.setdefault((e.get("pid"), e.get("tid")), len(threads))
            except TypeError:
                raise ValueError(f"{where}: traceEvents[{i}]: pid {shown(e.get('pid'))} and tid "
                                 f"{shown(e.get('tid'))} are not numbers or names") from None
            name_col.append(known[0])
            cat_col.append(category)
            thread_col.append(thread)
            start_col.append(ts)
            end_col.append(ts + dur)
        col = lambda a, dtype: np.frombuffer(a, dtype) if len(a) else np.zeros(0, dtype)  # noqa: E731
        return cls(names=names, name=col(name_col, np.int32), category=col(cat_col, np.int8),
                   thread=col(thread_col, np.int32), start=col(start_col, np.float64), end=col(end_col, np.float64))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> "RankTrace":
        """The trace file at `path` (JSON or gzipped JSON, any size: :class:`Trace`), with its
        ``distributedInfo``'s rank and world size; ``ValueError`` naming the file when it is not a
        trace or holds no complete events."""
        trace = Trace(path)
        out = cls.of_events(trace.events(), str(path))
        if not len(out.start) and not out.names:
            raise ValueError(f"{path}: no trace events (no complete 'X' events in traceEvents)")
        info = trace.fields.get("distributedInfo")
        if isinstance(info, dict):
            if type(info.get("rank")) is int:
                out.rank = integer(info["rank"], f"{path}: distributedInfo.rank", minimum=0)
            if info.get("world_size") is not None:
                out.world_size = integer(info["world_size"], f"{path}: distributedInfo.world_size", minimum=1)
        return out

    def named(self, pattern: re.Pattern[str]) -> np.ndarray:
        """bool per event: whether its name matches `pattern` (``search``)."""
        hits = np.fromiter((pattern.search(n) is not None for n in self.names), bool, len(self.names))
        return hits[self.name]

    def spans(self, mask: np.ndarray) -> Spans:
        """The intervals of the events of `mask`."""
        return self.start[mask], self.end[mask]


def _time(value: Any, where: str) -> float:
    """An event's ts or dur as a finite float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {shown(value)} is not a number")
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v):
        raise ValueError(f"{where}: {shown(value)} is not a finite number")
    return v


def _after(gaps: Spans, ends: np.ndarray, min_gap_us: float) -> Spans:
    """For each of `ends`, from it to the end of each gap that ends after it and starts within
    `min_gap_us` of it (the wait after a blocking collective's op returns)."""
    first = np.searchsorted(gaps[1], ends, side="right")
    stop = np.searchsorted(gaps[0], ends + min_gap_us, side="right")
    counts = np.maximum(stop - first, 0)
    index = np.repeat(first, counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(ends, counts), gaps[1][index]


def _main_thread(threads: np.ndarray) -> int:
    """The thread with the most of `threads`' entries (the first of them to appear on a tie)."""
    counts = np.bincount(threads)
    tied = np.flatnonzero(counts == counts.max())
    return int(tied[np.argmin([np.argmax(threads == t) for t in tied])])


def transfer_posts(trace: RankTrace) -> tuple[Spans, Spans]:
    """A rank's posted sends and receives (gloo annotations, NCCL send/recv kernels), as unions."""
    return iv.union(trace.spans(trace.named(_SEND))), iv.union(trace.spans(trace.named(_RECV)))


def rank_bubbles(trace: RankTrace, rank: int, peer_sends: Spans | None = None,
                 min_gap_us: float = MIN_GAP_US) -> RankBubbles:
    """One rank's busy and idle time from its trace (see the module's note); ``peer_sends``: the
    other ranks' posted sends (:func:`transfer_posts`), to separate transferring from waiting;
    gaps shorter than ``min_gap_us`` count as busy."""
    if not min_gap_us >= 0:
        raise ValueError(f"min_gap_us: {min_gap_us} is not >= 0")
    t = trace
    device, timeline, notes, op_mask, blocking, busy = _activity(t, rank)
    steps = np.flatnonzero(t.named(_STEP))
    if len(steps):
        last = steps[np.argmax(t.start[steps])]
        lo, hi = float(t.start[last]), float(t.end[last])
    else:
        lo, hi = float(t.start[timeline].min()), float(t.end[timeline].max())
    busy = iv.clip(busy, lo, hi)
    gaps = iv.gaps(busy, lo, hi, min_gap_us)
    # A blocking collective waits after its c10d op returns: the gap after it is the collective's.
    after_sync = _after(gaps, t.end[timeline & t.named(_SYNC_OP)], min_gap_us)
    named_collective = (t.category != _OTHER) & t.named(_COLLECTIVE) & ~t.named(_TRANSFER)
    collective = iv.union(iv.joined(t.spans(named_collective | t.named(names.SYNC)), after_sync))
    by_kind, phases_known = _idle_by_phase(t, op_mask, iv.subtract(gaps, collective), lo, hi)
    by_kind["collective"] = iv.length(iv.overlap(gaps, collective))
    waiting = transferring = None
    if peer_sends is not None:
        _sends, recvs = transfer_posts(t)
        transferring = iv.length(iv.overlap(gaps, iv.overlap(recvs, peer_sends)))
        waiting = iv.length(gaps) - transferring
    by_parallelism = idle_by_parallelism(t, gaps, notes, blocking, collective)
    return RankBubbles(rank=rank, device=device, span=hi - lo, busy=iv.length(busy), idle=iv.length(gaps),
                       idle_by_kind=by_kind, idle_by_parallelism=by_parallelism, waiting=waiting,
                       transferring=transferring, phases_known=phases_known)


def _activity(t: RankTrace, rank: int) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Spans]:
    """What the rank's trace shows it doing: its device, its timeline's events, its annotations,
    its pipeline ops' annotations and its host ops blocked in a functional collective (masks over
    the events), and its busy time."""
    cat = t.category
    kernels = cat == _KERNEL
    is_op = t.named(_OP)
    if kernels.any():  # CUDA: the GPU's kernels but NCCL's
        notes = cat == _GPU_NOTE
        busy = t.spans(kernels & ~t.named(_NCCL))
        return "cuda", kernels | notes, notes, notes & is_op, np.zeros(len(cat), bool), iv.union(busy)
    ops = cat == _CPU_OP
    if not ops.any():
        raise ValueError(f"rank {rank}: no cpu_op or kernel events")
    timeline = t.thread == _main_thread(t.thread[ops])
    notes = timeline & (cat == _NOTE)
    op_mask = notes & is_op
    work = notes & ~is_op & ~t.named(_REGION)  # tasks, planning, set-up, the optimizer's, FSDP's
    blocking = ops & timeline & t.named(_BLOCKING)
    waits = iv.union(iv.joined(t.spans(notes & t.named(names.WAITS)), t.spans(blocking)))
    # The main thread's ops and work, the pipeline ops and the schedule's own code between them
    # are busy, less the waits inside them (an op or FSDP's hook blocked in a collective's
    # wait), but for the tasks run in a wait.
    spans = t.spans((ops & timeline) | work | op_mask | (notes & t.named(names.SCHEDULE_SPAN)))
    busy = iv.joined(t.spans(notes & t.named(names.TASK)), iv.subtract(iv.union(spans), waits))
    return "cpu", timeline, notes, op_mask, blocking, iv.union(busy)


def _idle_by_phase(t: RankTrace, op_mask: np.ndarray, rest: Spans, lo: float, hi: float
                   ) -> tuple[dict[str, float], bool]:
    """Idle time `rest` (the window's idle less the collectives') by pipeline phase: ``warmup``
    before the first backward op, ``cooldown`` after the last forward, ``steady`` between (all of
    it without ops of both kinds); and whether the phases are known."""
    by_kind = dict.fromkeys(IDLE_KINDS, 0.0)
    kinds = np.array([_op_kind(n) for n in t.names] or [-1], np.int8)[t.name]  # index in "FBIW"
    fwd = op_mask & (kinds == 0)
    bwd = op_mask & (kinds > 0)
    phases_known = bool(bwd.any() and fwd.any())
    if phases_known:
        first_b, last_f = float(t.start[bwd].min()), float(t.end[fwd].max())
        by_kind["warmup"] = iv.length(iv.clip(rest, lo, first_b))
        by_kind["cooldown"] = iv.length(iv.clip(rest, max(last_f, first_b), hi))
        by_kind["steady"] = iv.length(rest) - by_kind["warmup"] - by_kind["cooldown"]
    else:
        by_kind["steady"] = iv.length(rest)
    return by_kind, phases_known


def idle_by_parallelism(trace: RankTrace, gaps: Spans, notes: np.ndarray, blocking: np.ndarray,
                        collective: Spans) -> dict[str, float]:
    """Idle time (`gaps`) per kind of :data:`PARALLEL_KINDS`, each part of it to the first of these
    that covers it: the runtime's waits (`notes`: the rank's annotations), ``dp`` its data-parallel
    waits, ``tp`` its tensor-parallel waits and the host's waits for a functional collective
    (`blocking`), ``other`` its own synchronisation (the step's barrier and cost sharing, the
    encoder's gradient sum), ``pp`` its pipeline waits; then the same over the whole gaps each of
    them overlaps (the idle around a wait's annotation, until the rank resumes); then ``dp`` any
    other `collective` and ``pp`` the rank's posted sends and receives; the rest ``other``."""
    t = trace
    note = lambda pattern: t.spans(notes & t.named(pattern))  # noqa: E731
    waits = (("dp", note(names.DP_WAIT_SPAN)), ("tp", iv.joined(note(names.TP_WAIT_SPAN), t.spans(blocking))),
             ("other", note(names.SYNC)), ("pp", note(names.PIPELINE_WAIT)))
    order = (*waits, *((kind, _touching(gaps, spans)) for kind, spans in waits), ("dp", collective),
             ("pp", iv.joined(*transfer_posts(t))))
    out = dict.fromkeys(PARALLEL_KINDS, 0.0)
    rest = gaps
    for kind, spans in order:
        spans = iv.union(spans)
        out[kind] += iv.length(iv.overlap(rest, spans))
        rest = iv.subtract(rest, spans)
    out["other"] += iv.length(rest)
    return out


def _touching(gaps: Spans, spans: Spans) -> Spans:
    """The whole gaps that `spans` overlap (`gaps` sorted and disjoint)."""
    pieces = iv.overlap(gaps, iv.union(spans))
    hit = np.unique(np.searchsorted(gaps[0], pieces[0], side="right") - 1)
    return gaps[0][hit], gaps[1][hit]


def _op_kind(name: str) -> int:
    """The index in "FBIW" of a pipeline op's annotation (``PP:0B3``, ``Forward 3``), else -1."""
    m = _OP.match(name)
    return _OP_KINDS.index(m.group(2) or m.group(4)[0]) if m else -1


def trace_files(source: str | os.PathLike[str]) -> list[Path]:
    """The trace files of `source`: the file itself, or a folder's ``*.json`` and ``*.json.gz``
    files (one per rank; those named ``plan*``, a plan's own trace, left out)."""
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))
                       and not p.name.startswith("plan") and p.is_file())
        if not files:
            raise ValueError(f"{path}: no *.json or *.json.gz traces in this folder")
        return files
    if path.exists():
        return [path]
    raise ValueError(f"{path}: no such file or folder")


def measure(source: str | os.PathLike[str], min_gap_us: float = MIN_GAP_US) -> list[RankBubbles]:
    """Each rank's bubbles from ``source``: one trace file (that rank alone) or a folder of traces
    (one per rank, all of them; ``*.json`` or ``*.json.gz``), of any size: read as a stream; the
    rank from the trace's ``distributedInfo`` or a ``rank<N>`` file name. Raises ``ValueError``
    (naming the file or the rank) for a file that is not a JSON trace, a trace with no events, or
    a rank missing from a folder."""
    traces: dict[int, RankTrace] = {}
    world = None
    files = trace_files(source)
    for i, f in enumerate(files):
        trace = RankTrace.read(f)
        rank = file_rank(f, trace.rank, i)
        if rank in traces:
            raise ValueError(f"{f}: a second trace of rank {rank}")
        traces[rank] = trace
        world = trace.world_size if trace.world_size is not None else world
    size = world if world is not None else max(traces) + 1
    missing = next((r for r in range(size) if r not in traces), None) if Path(source).is_dir() else None
    if missing is not None:
        raise ValueError(f"ranks: rank {missing} missing (traces of ranks {sorted(traces)}, world size {size})")
    posts = {r: transfer_posts(t)[0] for r, t in traces.items()}
    peers = lambda r: iv.union(iv.joined(iv.NONE, *(s for q, s in posts.items() if q != r))) if len(traces) > 1 else None  # noqa: E731
    return [rank_bubbles(traces[r], r, peers(r), min_gap_us) for r in sorted(traces)]


# -- prediction ------------------------------------------------------------------------------------
def predicted_bubbles(source: str | os.PathLike[str]) -> tuple[float, dict[int, dict[str, float]]]:
    """The predicted step (us) and idle by measured kind per stage: from a planning config (YAML:
    the LLM-only step of :class:`pybubble.llm.step.LLMStep`) or a timeline's Chrome trace (JSON
    written by ``pybubble.save_trace`` or ``pybubble bubbles --trace``: its ``bubble`` slices)."""
    path = Path(source)
    if path.suffix.lower() in (".yaml", ".yml"):
        timeline = LLMStep.of(load_config(path)).timeline
        times = timeline.bubble_time()
        out = {s: dict.fromkeys(IDLE_KINDS, 0.0) for s in times}
        for s, kinds in times.items():
            for kind, t in kinds.items():
                out[s][PREDICTED_KINDS[kind]] += t
        return timeline.step_time, out
    trace = Trace(path)
    lo, hi, complete, has_op = math.inf, -math.inf, 0, False
    stages: set[int] = set()
    idle: dict[tuple[int, str], float] = {}
    for i, e in enumerate(trace.events()):  # one pass, keeping the sums only
        if type(e) is not dict or e.get("ph") != "X":
            continue
        complete += 1
        where = f"{path}: traceEvents[{i}]"
        ts, dur = _time(e.get("ts"), f"{where}.ts"), _time(e.get("dur"), f"{where}.dur")
        lo, hi = min(lo, ts), max(hi, ts + dur)
        if type(e.get("pid")) is int:
            stages.add(e["pid"])
        has_op = has_op or e.get("cat") == "op"
        if e.get("cat") == "bubble":
            kind = PREDICTED_KINDS.get(str(e.get("name")))
            if kind is None:
                raise ValueError(f"{path}: bubble kind {shown(e.get('name'))} is not one of {', '.join(PREDICTED_KINDS)}")
            stage = integer(e.get("pid"), f"{where}.pid", minimum=0)
            idle[stage, kind] = idle.get((stage, kind), 0.0) + dur
    if not complete:
        raise ValueError(f"{path}: no trace events (no complete 'X' events in traceEvents)")
    if not idle and not has_op:
        raise ValueError(f"{path}: no predicted bubbles (a timeline trace has 'bubble' and 'op' slices)")
    out = {s: dict.fromkeys(IDLE_KINDS, 0.0) for s in sorted(stages)}
    for (stage, kind), t in idle.items():
        out[stage][kind] += t
    return hi - lo, out


def compare(measured: list[RankBubbles], predicted: tuple[float, dict[int, dict[str, float]]]) -> dict[str, Any]:
    """Measured beside predicted idle per rank and kind, with the relative error (None where the
    prediction is 0)."""
    step, stages = predicted
    if len(stages) != len(measured):
        raise ValueError(f"predict: {len(stages)} pipeline stages predicted, {len(measured)} ranks measured")
    rows = []
    for r, s in zip(measured, sorted(stages)):
        kinds = {}
        for k in IDLE_KINDS:
            p, m = stages[s][k], r.idle_by_kind[k]
            kinds[k] = {"measured_us": m, "predicted_us": p, "error": (m / p - 1.0) if p > 0 else None}
        p_idle = sum(stages[s].values())
        rows.append({"rank": r.rank, "stage": s, "span_us": {"measured": r.span, "predicted": step},
                     "idle_us": {"measured": r.idle, "predicted": p_idle,
                                 "error": (r.idle / p_idle - 1.0) if p_idle > 0 else None},
                     "kinds": kinds})
    return {"predicted_step_us": step, "ranks": rows}


def to_dict(measured: list[RankBubbles], comparison: dict[str, Any] | None = None) -> dict[str, Any]:
    """The measurement (and the comparison, when given) as a ``pybubble.measure/1`` document."""
    return {"format": MEASURE_FORMAT, "ranks": [asdict(r) for r in measured],
            **({"prediction": comparison} if comparison is not None else {})}


def save_plot(measured: list[RankBubbles], path: str | os.PathLike[str],
              predicted: tuple[float, dict[int, dict[str, float]]] | None = None) -> None:
    """Idle time per rank and kind as stacked bars (measured; predicted beside it when given)."""
    fig, ax = pyplot().subplots(figsize=(2 + 1.6 * len(measured), 4))
    colors = {"warmup": "#4c72b0", "steady": "#55a868", "cooldown": "#c44e52", "collective": "#8172b2"}
    width = 0.38 if predicted else 0.6
    for i, r in enumerate(measured):
        bars = [("measured", i - (width / 2 if predicted else 0), r.idle_by_kind)]
        if predicted:
            bars.append(("predicted", i + width / 2, predicted[1][sorted(predicted[1])[i]]))
        for label, x, kinds in bars:
            bottom = 0.0
            for k in IDLE_KINDS:
                ax.bar(x, kinds[k] / 1e3, width, bottom=bottom, color=colors[k], hatch="//" if label == "predicted" else None,
                       label=k if i == 0 and label == "measured" else None, edgecolor="white")
                bottom += kinds[k] / 1e3
    ax.set_xticks(range(len(measured)), [f"rank {r.rank}" for r in measured])
    ax.set_ylabel("idle (ms)")
    ax.set_title("idle per rank by kind" + (" (hatched: predicted)" if predicted else ""))
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


__all__ = ["EVENT_CATEGORIES", "IDLE_KINDS", "MEASURE_FORMAT", "MIN_GAP_US", "PARALLEL_KINDS", "PREDICTED_KINDS",
           "RankBubbles", "RankTrace", "Spans", "compare", "idle_by_parallelism",
           "measure", "predicted_bubbles", "rank_bubbles", "save_plot", "to_dict", "trace_files", "transfer_posts"]
