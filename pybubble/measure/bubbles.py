"""Measured bubbles: idle time per rank read from ``torch.profiler`` Chrome traces of a pipeline
run (one file per rank, or a folder of them), beside a prediction when given.

No torch here: the traces are JSON. A rank's trace gives

- its window: the last ``ProfilerStep#`` annotation when there is one, else the span of its
  timeline's events;
- busy time: the union of its compute events: on the CPU (gloo) the ``cpu_op`` events of its
  main thread (the thread with the most of them) and its annotations of work (pipeline ops and
  pybubble's ``pybubble:schedule`` span of the whole schedule, less the waits annotated inside them; pybubble's ``pybubble:task:*``, ``plan`` and ``setup``; any
  other annotation that is not a region: ``pybubble:wait``/``front``/``drain``/``grad_sync``/``sync``,
  ``ProfilerStep#``, gloo's collectives and transfers), on CUDA (NCCL) its GPU kernels except
  NCCL's;
- idle time: the window less busy time (gaps under ``min_gap_us`` are host glue), split by
  kind: ``collective`` where a collective runs (gloo's ``gloo:all_reduce``/``barrier``/...
  annotations, the gap after a blocking ``c10d::`` collective op, pybubble's ``pybubble:sync``
  and ``pybubble:grad_sync`` regions, NCCL collective kernels), else by the rank's pipeline ops (``PP:<stage><F|B|I|W><mb>`` annotations,
  as torch.distributed.pipelining's runtime and pybubble's adapter write them, or GPipe's
  ``Forward i``/``Backward i``): ``warmup`` before its first backward, ``cooldown`` after its last
  forward, ``steady`` between; without op annotations everything not collective is ``steady``;
- with the traces of all ranks (one clock on one machine): idle time while one of this rank's
  receives and a peer's send are both posted, i.e. the data can be moving (``transferring``: an
  upper bound of the transfer), and the rest (``waiting``: the peer has not sent yet). gloo's and
  NCCL's own spans run from posting to completion, so one rank's trace alone does not separate
  the two (both None).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config.checks import shown
from ..config.documents import read_json
from ..config.schema import load_config
from ..llm.step import LLMStep
from ..viz.figures import pyplot, save_figure

IDLE_KINDS = ("warmup", "steady", "cooldown", "collective")
"""Kinds of measured idle time."""
PREDICTED_KINDS = {"pp_warmup": "warmup", "pp_steady": "steady", "pp_cooldown": "cooldown",
                   "dp_allgather": "collective", "dp_reducescatter": "collective", "tp": "collective"}
"""The simulator's bubble kinds (:data:`pybubble.llm.timeline.BUBBLE_KINDS`) as measured kinds."""
MEASURE_FORMAT = "pybubble.measure/1"
"""The format key of a measurement's document."""
_COLLECTIVE = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|barrier|broadcast|all_?to_?all)", re.I)
_TRANSFER = re.compile(r"^(gloo:(send|recv)|nccl:(send|recv))|SendRecv|nccl.*(Send|Recv)", re.I)
_OP = re.compile(r"^(?:PP:\d+([FBIW])\d+|(Forward|Backward) \d+)$")
_REGION = re.compile(r"^(pybubble:(wait|front|drain|grad_sync|sync|schedule)|ProfilerStep#|gloo:|nccl:)")
_SCHEDULE = "pybubble:schedule"
_WAIT = "pybubble:wait"
_SYNC_OP = re.compile(r"^c10d::(allreduce|allgather|barrier|reduce_scatter|broadcast|alltoall)", re.I)
MIN_GAP_US = 100.0
"""Gaps between busy events shorter than this are the host's own glue (Python, dispatch) between
its ops, not idle time."""
_SEND = re.compile(r"^(gloo|nccl):send|nccl.*Send", re.I)
_RECV = re.compile(r"^(gloo|nccl):recv|nccl.*Recv", re.I)


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
    waiting: float | None = None
    """Idle time with no transfer of this rank under way (None: the trace shows no transfers)."""
    transferring: float | None = None
    """Idle time while one of this rank's receives and a peer's send are both posted (an upper
    bound of the transfer; None: the trace shows no transfers)."""
    phases_known: bool = True
    """False when the trace has no pipeline op annotations (warm-up and cool-down not separable)."""


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two unions of disjoint sorted intervals."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _clip(intervals, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A Chrome trace as a dict with ``traceEvents``; ``ValueError`` naming the file otherwise (read
    within the limits of :mod:`pybubble.config.limits`)."""
    doc = read_json(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list) or not any(isinstance(e, dict) and e.get("ph") == "X" for e in events):
        raise ValueError(f"{path}: no trace events (no complete 'X' events in traceEvents)")
    return {"traceEvents": events, **({k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {})}


def _x_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]


def _interval(e: dict[str, Any]) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def transfer_posts(doc: dict[str, Any]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """A rank's posted sends and receives (gloo annotations, NCCL send/recv kernels), as unions."""
    xs = _x_events(doc)
    sends = _union([_interval(e) for e in xs if _SEND.search(str(e.get("name", "")))])
    recvs = _union([_interval(e) for e in xs if _RECV.search(str(e.get("name", "")))])
    return sends, recvs


def rank_bubbles(doc: dict[str, Any], rank: int, peer_sends: list[tuple[float, float]] | None = None,
                 min_gap_us: float = MIN_GAP_US) -> RankBubbles:
    """One rank's busy and idle time from its trace (see the module's note); ``peer_sends``: the
    other ranks' posted sends (:func:`transfer_posts`), to separate transferring from waiting;
    gaps shorter than ``min_gap_us`` count as busy."""
    xs = _x_events(doc)
    iv = _interval
    kernels = [e for e in xs if e.get("cat") == "kernel"]
    busy_extra: list[tuple[float, float]] = []
    if kernels:
        device = "cuda"
        busy_ev = [e for e in kernels if not str(e.get("name", "")).lower().startswith("nccl")]
        timeline_ev = kernels + [e for e in xs if e.get("cat") == "gpu_user_annotation"]
        op_ev = [e for e in xs if e.get("cat") == "gpu_user_annotation"]
    else:
        device = "cpu"
        ops = [e for e in xs if e.get("cat") == "cpu_op"]
        if not ops:
            raise ValueError(f"rank {rank}: no cpu_op or kernel events")
        main = Counter((e.get("pid"), e.get("tid")) for e in ops).most_common(1)[0][0]
        timeline_ev = [e for e in xs if (e.get("pid"), e.get("tid")) == main]
        notes = [e for e in timeline_ev if e.get("cat") == "user_annotation"]
        op_ev = [e for e in notes if _OP.match(str(e.get("name", "")))]
        work = [e for e in notes if not _OP.match(str(e.get("name", ""))) and not _REGION.match(str(e.get("name", "")))]
        waits = _union([iv(e) for e in notes if e.get("name") == _WAIT])
        busy_ev = [e for e in ops if (e.get("pid"), e.get("tid")) == main] + work
        # Pipeline ops and the schedule's own code between them are busy, less the waits in them.
        spans = [e for e in notes if e.get("name") == _SCHEDULE]
        busy_extra = _subtract(_union([iv(e) for e in op_ev + spans]), waits)
    steps = [e for e in xs if str(e.get("name", "")).startswith("ProfilerStep#")]
    if steps:
        lo, hi = iv(max(steps, key=lambda e: float(e["ts"])))
    else:
        lo = min(iv(e)[0] for e in timeline_ev)
        hi = max(iv(e)[1] for e in timeline_ev)
    busy = _clip(_union([iv(e) for e in busy_ev] + busy_extra), lo, hi)
    if not min_gap_us >= 0:
        raise ValueError(f"min_gap_us: {min_gap_us} is not >= 0")
    gaps, t = [], lo
    for s, e in busy:
        if s - t >= min_gap_us:
            gaps.append((t, s))
        t = max(t, e)
    if hi - t >= min_gap_us:
        gaps.append((t, hi))
    # A blocking collective waits after its c10d op returns: the gap after it is the collective's.
    after_sync = []
    for e in timeline_ev:
        if _SYNC_OP.match(str(e.get("name", ""))):
            end = iv(e)[1]
            after_sync += [(end, ge) for gs, ge in gaps if gs <= end + min_gap_us and ge > end]
    names = lambda pattern, evs: [iv(e) for e in evs if pattern.search(str(e.get("name", "")))]  # noqa: E731
    collective = _union(names(_COLLECTIVE, [e for e in xs if e.get("cat") in
                                            ("user_annotation", "cpu_op", "kernel", "gpu_user_annotation")
                                            and not _TRANSFER.search(str(e.get("name", "")))])
                        + after_sync + names(re.compile("^pybubble:(grad_sync|sync)$"), xs))
    in_collective = _overlap(gaps, collective)
    rest = _subtract(gaps, collective)
    by_kind = dict.fromkeys(IDLE_KINDS, 0.0)
    by_kind["collective"] = _length(in_collective)
    marks = [(m.group(1) or m.group(2)[0], iv(e)) for e in op_ev if (m := _OP.match(str(e.get("name", ""))))]
    bwd = [i for k, i in marks if k in "BIW"]
    fwd = [i for k, i in marks if k == "F"]
    phases_known = bool(bwd and fwd)
    if phases_known:
        first_b, last_f = min(s for s, _ in bwd), max(e for _, e in fwd)
        by_kind["warmup"] = _length(_clip(rest, lo, first_b))
        by_kind["cooldown"] = _length(_clip(rest, max(last_f, first_b), hi))
        by_kind["steady"] = _length(rest) - by_kind["warmup"] - by_kind["cooldown"]
    else:
        by_kind["steady"] = _length(rest)
    waiting = transferring = None
    if peer_sends is not None:
        _sends, recvs = transfer_posts(doc)
        transferring = _length(_overlap(gaps, _overlap(recvs, peer_sends)))
        waiting = _length(gaps) - transferring
    return RankBubbles(rank=rank, device=device, span=hi - lo, busy=_length(busy), idle=_length(gaps),
                       idle_by_kind=by_kind, waiting=waiting, transferring=transferring, phases_known=phases_known)


def _subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``a`` less ``b`` (unions of disjoint sorted intervals): ``a`` within ``b``'s complement."""
    if not a:
        return []
    edges = [a[0][0], *(t for iv in _union(b) for t in iv), a[-1][1]]
    return _overlap(a, [(s, e) for s, e in zip(edges[::2], edges[1::2]) if e > s])


def _rank_of(path: Path, doc: dict[str, Any]) -> tuple[int | None, int | None]:
    info = doc.get("distributedInfo") or {}
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"], info.get("world_size")
    m = re.search(r"rank[_-]?(\d+)", path.name)
    return (int(m.group(1)) if m else None), None


def measure(source: str | os.PathLike[str], min_gap_us: float = MIN_GAP_US) -> list[RankBubbles]:
    """Each rank's bubbles from ``source``: one trace file or a folder of ``*.json`` traces (one
    per rank; the rank from the trace's ``distributedInfo`` or a ``rank<N>`` file name). Raises
    ``ValueError`` (naming the file or the rank) for a file that is not a JSON trace, a trace with
    no events, or a missing rank."""
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.json") if not p.name.startswith("plan"))
        if not files:
            raise ValueError(f"{path}: no *.json traces in this folder")
    elif path.exists():
        files = [path]
    else:
        raise ValueError(f"{path}: no such file or folder")
    docs, world = {}, None
    for i, f in enumerate(files):
        doc = load_trace(f)
        rank, size = _rank_of(f, doc)
        rank = i if rank is None else rank
        if rank in docs:
            raise ValueError(f"{f}: a second trace of rank {rank}")
        docs[rank] = doc
        world = size if size is not None else world
    expected = range(world if world is not None else max(docs) + 1)
    missing = [r for r in expected if r not in docs]
    if missing:
        raise ValueError(f"ranks: rank {missing[0]} missing (traces of ranks {sorted(docs)}, world size "
                         f"{len(expected)})")
    posts = {r: transfer_posts(d)[0] for r, d in docs.items()}
    peers = lambda r: _union([i for q, s in posts.items() if q != r for i in s]) if len(docs) > 1 else None  # noqa: E731
    return [rank_bubbles(docs[r], r, peers(r), min_gap_us) for r in sorted(docs)]


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
    doc = load_trace(path)
    bubbles = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "bubble"]
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    if not bubbles and not any(e.get("cat") == "op" for e in ops):
        raise ValueError(f"{path}: no predicted bubbles (a timeline trace has 'bubble' and 'op' slices)")
    stages = sorted({int(e["pid"]) for e in ops if isinstance(e.get("pid"), int)})
    out = {s: dict.fromkeys(IDLE_KINDS, 0.0) for s in stages}
    for e in bubbles:
        kind = PREDICTED_KINDS.get(str(e.get("name")))
        if kind is None:
            raise ValueError(f"{path}: bubble kind {shown(e.get('name'))} is not one of {', '.join(PREDICTED_KINDS)}")
        out[int(e["pid"])][kind] += float(e["dur"])
    step = max(float(e["ts"]) + float(e["dur"]) for e in ops) - min(float(e["ts"]) for e in ops)
    return step, out


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


__all__ = ["IDLE_KINDS", "MEASURE_FORMAT", "MIN_GAP_US", "PREDICTED_KINDS", "RankBubbles", "compare", "load_trace",
           "measure", "predicted_bubbles", "rank_bubbles", "save_plot", "to_dict", "transfer_posts"]
