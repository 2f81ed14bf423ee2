"""The cost model fitted to measured steps: from the traces of one pipeline step or several
(torch.profiler Chrome traces, one per rank, or a Chrome trace the simulator wrote), per op kind of
:data:`pybubble.costs.roofline.OP_KINDS` the ratio of measured to predicted time; with several
steps, each measured quantity at its median over them (:func:`fit_steps`).

What the trace gives, per rank:

- pipeline ops: torch.distributed.pipelining's ``PP:<stage><F|B|I|W><microbatch>`` annotations (its
  schedules and pybubble's adapter write them), or the simulator's ``<stage><kind><microbatch>``
  op slices; each op's time less the encoder pieces and waits annotated inside it;
- encoder pieces: pybubble's ``pybubble:task:e<j><f|b>.*`` annotations (the runtime's pieces of
  encoder microbatch j), or the simulator's ``enc fwd|bwd mb<j>`` slices; summed per microbatch and
  phase (the simulator's slices of a microbatch spread over pipelines carry their piece's images
  and lane: summed per piece, each predicted at its images). A trace without them (a trainer that never used pybubble) has the encoder where Megatron-LM
  puts it, inside pipeline stage 0's forwards and backwards;
- pipeline sends: the shortest gap from an op's end to the start of the op on the next rank that
  needs its output (F to the next stage's F, B to the previous stage's B): all ranks' traces share
  one clock (one machine);
- the data-parallel all-gather and reduce-scatter: the backend's collective events (``nccl:``,
  ``gloo:``, NCCL kernels) outside pybubble's own sync regions, or the simulator's ``dp_allgather``
  and ``dp_reducescatter`` bubbles, per rank, where the config predicts them.

Each measured quantity is a row ``measured ≈ Σ_kind factor[kind] · predicted[kind]`` (predicted by
the config's cost model without op factors; stage 0's ops hold both LLM and encoder terms when the
encoder runs inside them). The factors, one per op kind the trace measures, minimise the squared
error over the rows: no more free parameters than op kinds. A kind the config predicts but
the trace does not measure, or a trace of another pipeline, is a ``ValueError``. Times are
microseconds.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config.checks import finite, shown
from ..config.schema import Config
from ..costs.roofline import CALIBRATION_FORMAT, OP_KINDS, CostModel
from ..llm.step import LLMStep, cost_model, step_comm
from . import names
from .bubbles import trace_files
from .intervals import Spans, clip, length, union
from .trace_reader import Trace, file_rank

_OP = names.OP_OR_ROW
_TASK = names.TASK
_SIM_ENCODER = re.compile(r"^enc (fwd|bwd) mb(\d+)$")
_INSIDE_OPS = names.INSIDE_OPS
_OWN_SYNC = names.SYNC
_COLLECTIVE = {"all_gather": re.compile(r"all_?gather", re.I), "reduce_scatter": re.compile(r"reduce_?scatter", re.I)}
_DP_BUBBLES = {"dp_allgather": "all_gather", "dp_reducescatter": "reduce_scatter"}


@dataclass(slots=True)
class MeasuredRank:
    """What one rank's trace measured (microseconds)."""

    rank: int
    """The rank (the trace's ``distributedInfo``, file name, or the simulator's process)."""
    ops: list[tuple[int, str, int, float, float, float]] = field(default_factory=list)
    """Pipeline ops: (stage, kind F/B/I/W, microbatch, start, end, time inside it that is not the op's
    own: encoder pieces and waits)."""
    encoder: dict[tuple[int, str, tuple[int, ...], int], float] = field(default_factory=dict)
    """Encoder compute per (microbatch, ``fwd``/``bwd``, images, lane): where the simulator's trace
    gives them (a plan that spreads microbatches over pipelines), each piece apart, with its images
    of each encoder and its lane; else the whole microbatch on the rank, images () and lane -1."""
    collectives: dict[str, float] = field(default_factory=dict)
    """Data-parallel collective time per kind (``all_gather``, ``reduce_scatter``)."""
    start: float = float("inf")
    """The first op's, encoder piece's or data-parallel collective's start."""
    end: float = float("-inf")
    """The last op's, encoder piece's or data-parallel collective's end."""
    encoder_in_ops: bool = False
    """Whether encoder pieces ran inside the rank's pipeline ops (Megatron-LM's layout)."""
    simulated: bool = False
    """Whether the trace is the simulator's (else torch.profiler's)."""

    def spanning(self, start: float, end: float) -> None:
        """Widens :attr:`start` and :attr:`end` to an op or piece from `start` to `end`."""
        self.start, self.end = min(self.start, start), max(self.end, end)


def _spans(events: list[tuple[float, float]]) -> Spans:
    """The union of `events`' intervals (:data:`pybubble.measure.bubbles.Spans`)."""
    return union((np.array([s for s, _ in events], np.float64), np.array([e for _, e in events], np.float64)))


def _inside(lo: float, hi: float, spans: Spans) -> float:
    """The length of `spans` between `lo` and `hi`."""
    return length(clip(spans, lo, hi))


_Event = tuple[str, Any, Any, float, float, Any]  # name, category, pid, start, end, args


def _kept(trace: Trace) -> list[_Event]:
    """The complete events of `trace` this module reads (ops, encoder pieces, waits, syncs,
    collectives, the simulator's slices), streamed."""
    out = []
    for e in trace.events():
        if type(e) is not dict or e.get("ph") != "X" or "ts" not in e or "dur" not in e:
            continue
        name = e.get("name")
        if not isinstance(name, str) or not (_OP.match(name) or _TASK.match(name) or _INSIDE_OPS.match(name)
                                             or _OWN_SYNC.match(name) or _SIM_ENCODER.match(name)
                                             or name in _DP_BUBBLES or any(p.search(name) for p in _COLLECTIVE.values())):
            continue
        start, dur = finite(e["ts"], f"{trace.path}: ts"), finite(e["dur"], f"{trace.path}: dur", minimum=0.0)
        out.append((name, e.get("cat"), e.get("pid"), start, start + dur, e.get("args")))
    return out


def _simulated(events: list[_Event]) -> dict[int, MeasuredRank]:
    """The ranks of a trace the simulator wrote (one process per pipeline rank)."""
    out: dict[int, MeasuredRank] = {}
    for name, cat, pid, start, end, args in events:
        if not isinstance(pid, int):
            continue
        r = out.setdefault(pid, MeasuredRank(rank=pid, simulated=True))
        if cat == "op" and (m := _OP.match(name)):
            r.ops.append((int(m.group(1)), m.group(2), int(m.group(3)), start, end, 0.0))
            r.spanning(start, end)
        elif cat == "encoder" and (m := _SIM_ENCODER.match(name)):
            images = _piece_images(args, name)
            key = (int(m.group(2)), m.group(1), images, int(args.get("lane", -1)) if images else -1)
            r.encoder[key] = r.encoder.get(key, 0.0) + end - start
            r.spanning(start, end)
        elif cat == "bubble" and name in _DP_BUBBLES:
            kind = _DP_BUBBLES[name]
            r.collectives[kind] = r.collectives.get(kind, 0.0) + end - start
            r.spanning(start, end)
    return out


def _piece_images(args: Any, name: str) -> tuple[int, ...]:
    """The ``images`` argument of a simulator's encoder kernel (its piece's images of each encoder),
    or () when it has none (the whole microbatch)."""
    images = args.get("images") if isinstance(args, dict) else None
    if images is None:
        return ()
    if not isinstance(images, list) or not all(type(n) is int and n >= 0 for n in images) \
            or type(args.get("lane")) is not int:
        raise ValueError(f"trace: {name}: images {shown(images)} is not a list of image counts with its lane")
    return tuple(images)


def _profiled(events: list[_Event], rank: int) -> MeasuredRank:
    """One rank's torch.profiler trace."""
    iv = [(name, s, e, cat) for name, cat, _, s, e, _ in events]
    r = MeasuredRank(rank=rank)
    inner = _spans([(s, e) for n, s, e, _ in iv if _INSIDE_OPS.match(n)])
    tasks = _spans([(s, e) for n, s, e, _ in iv if _TASK.match(n)])
    own = _spans([(s, e) for n, s, e, _ in iv if _OWN_SYNC.match(n)])
    for name, s, e, cat in iv:
        if cat in ("user_annotation", "gpu_user_annotation") and (m := _OP.match(name)) and name.startswith("PP:"):
            r.ops.append((int(m.group(1)), m.group(2), int(m.group(3)), s, e, _inside(s, e, inner)))
            r.encoder_in_ops |= _inside(s, e, tasks) > 0
            r.spanning(s, e)
        elif m := _TASK.match(name):
            key = (int(m.group(1)), "fwd" if m.group(2) == "f" else "bwd", (), -1)
            r.encoder[key] = r.encoder.get(key, 0.0) + e - s
            r.spanning(s, e)
        elif (name.startswith(("nccl:", "gloo:")) or cat == "kernel") and _inside(s, e, own) < e - s:
            for kind, pattern in _COLLECTIVE.items():
                if pattern.search(name):
                    r.collectives[kind] = r.collectives.get(kind, 0.0) + e - s
                    r.spanning(s, e)
    return r


def read_step(source: str | os.PathLike[str]) -> dict[int, MeasuredRank]:
    """Each rank's measured step from `source`: a folder of torch.profiler traces (one per rank, as
    :func:`pybubble.measure.bubbles.measure` reads them) or one trace file (torch's, or the
    simulator's with every rank). ValueError naming the file, or when no pipeline op is found."""
    ranks: dict[int, MeasuredRank] = {}
    for i, f in enumerate(trace_files(source)):
        trace = Trace(f)
        events = _kept(trace)
        if any(cat == "op" for _, cat, _, _, _, _ in events):
            found = _simulated(events)
        else:
            info = trace.fields.get("distributedInfo")
            rank = file_rank(f, info.get("rank") if isinstance(info, dict) and type(info.get("rank")) is int else None, i)
            found = {rank: _profiled(events, rank)}
        for rank, r in found.items():
            if rank in ranks:
                raise ValueError(f"{f}: a second trace of rank {rank}")
            ranks[rank] = r
    if not any(r.ops for r in ranks.values()):
        raise ValueError(f"{source}: no pipeline ops (PP:<stage><F|B|I|W><microbatch> annotations) in the trace")
    return ranks


def read_steps(sources: Sequence[str | os.PathLike[str]]) -> list[dict[int, MeasuredRank]]:
    """The measured step of each of `sources` (:func:`read_step`): several steps of one job.
    ValueError with no source, or naming two whose traces hold other ranks."""
    if not sources:
        raise ValueError("trace: no measured step given")
    steps = [read_step(source) for source in sources]
    for source, ranks in zip(sources, steps):
        if sorted(ranks) != sorted(steps[0]):
            raise ValueError(f"trace: {source} holds the traces of {_listed(ranks)}, {sources[0]} of "
                             f"{_listed(steps[0])}: not steps of one job")
    return steps


def _listed(ranks: dict[int, MeasuredRank]) -> str:
    """The ranks in words, e.g. ``2 ranks (0, 1)``."""
    return f"{len(ranks)} rank{'' if len(ranks) == 1 else 's'} ({', '.join(map(str, sorted(ranks)))})"


@dataclass(kw_only=True, slots=True)
class Fit:
    """The op factors fitted to a measured step, with their residuals."""

    factors: dict[str, float]
    """Measured over predicted time per op kind the trace measured."""
    rows: dict[str, int]
    """Measured quantities per op kind (by the kind that dominates each one's prediction)."""
    residuals: dict[str, list[float]]
    """Per op kind, each row's relative residual: fitted prediction / measured - 1."""
    ranks: int
    """Ranks in the trace."""
    steps: int = 1
    """Measured steps fitted (each quantity at its median over them)."""

    def to_calibration(self, base: dict[str, Any], hardware: str, fitted_on: str) -> dict[str, Any]:
        """A ``pybubble.calibration/1`` document: `base` (the config's own calibration, or empty) with
        these ``op_factors``."""
        worst = max((abs(r) for rs in self.residuals.values() for r in rs), default=0.0)
        return {**base, "format": CALIBRATION_FORMAT, "hardware": hardware, "op_factors": dict(self.factors),
                "fitted_on": fitted_on,
                "fit": f"op factors fitted to {self.measured} of {self.ranks} ranks ({sum(self.rows.values())} "
                       f"measured quantities, {len(self.factors)} kinds); largest residual {worst:.1%}"}

    @property
    def measured(self) -> str:
        """What was fitted, in words: ``the measured step`` or ``the medians of N measured steps``."""
        return "the measured step" if self.steps == 1 else f"the medians of {self.steps} measured steps"


def _predicted(config: Config) -> tuple[LLMStep, dict[str, float], CostModel]:
    """The config's LLM step, per-kind unit predictions and the cost model they come from: the
    config's, less any op factors (the fit measures them from scratch)."""
    costs: CostModel = cost_model(config)
    costs.op_factors = {}
    step = LLMStep.of(config, costs)
    p2p, gather, scatter = step_comm(config, costs)
    unit = {"p2p": p2p, "all_gather": gather, "reduce_scatter": scatter,
            **_encoder_unit(config, costs, tuple(config.encoder_images))}
    return step, unit, costs


def _encoder_unit(config: Config, costs: CostModel, images: tuple[int, ...]) -> dict[str, float]:
    """The encoders' forward and backward time (one GPU) for `images` images of each encoder."""
    unit = {"encoder_fwd": 0.0, "encoder_bwd": 0.0}
    for enc, n in zip(config.encoders, images):
        m = enc.model
        if n == 0:
            continue
        unit["encoder_fwd"] += m.layers * costs.layer_time(m, n, m.tokens, phase="fwd")
        if not enc.frozen:
            unit["encoder_bwd"] += m.layers * costs.layer_time(m, n, m.tokens, phase="bwd",
                                                               recompute=config.training.recompute)
    return unit


Row = tuple[dict[str, float], float]
"""A measured quantity: its predicted time per op kind (the factors' coefficients), and its measured time."""


def fit_step(config: Config, ranks: dict[int, MeasuredRank]) -> Fit:
    """The op factors of `config`'s cost model that best explain the measured step `ranks` (see the
    module docstring). ValueError when the trace is of another pipeline (rank or stage count) or
    lacks an op kind the config predicts."""
    return fit_steps(config, [ranks])


def fit_steps(config: Config, steps: Sequence[dict[int, MeasuredRank]]) -> Fit:
    """The op factors that best explain several measured steps of one job: each measured quantity
    (an op, the sends, a collective, an encoder piece) at its median over the steps that measured
    it, so that one disturbed step does not move the factors. ValueError with no step, or for a
    step as :func:`fit_step`."""
    if not steps:
        raise ValueError("steps: no measured step to fit")
    step, unit, costs = _predicted(config)
    per_step = [_rows(config, ranks, step, unit, costs) for ranks in steps]
    rows: dict[tuple, Row] = {}
    for key in dict.fromkeys(k for found in per_step for k in found):
        seen = [found[key] for found in per_step if key in found]
        rows[key] = (seen[0][0], float(np.median([value for _, value in seen])))
    return _solve(config, list(rows.values()), unit, ranks=len(steps[0]), steps=len(steps))


def _rows(config: Config, ranks: dict[int, MeasuredRank], step: LLMStep, unit: dict[str, float],
          costs: CostModel) -> dict[tuple, Row]:
    """The measured quantities of one step, each under a key that names it in every step of the job
    (the rank and op, the sends, the rank and collective, the rank and encoder piece)."""
    plan = config.llm_plan
    stages = plan.pp * (2 if plan.schedule == "zbv" else plan.vpp)
    if len(ranks) not in (plan.pp, plan.pp * plan.dp):
        raise ValueError(f"ranks: the trace has {len(ranks)} ranks, the config's pipeline {plan.pp} "
                         f"(llm_plan.pp; {plan.pp * plan.dp} with data parallelism)")
    layers = step.chunk_layers
    rows: dict[tuple, Row] = {}
    encoder_measured = any(r.encoder for r in ranks.values())
    ends: dict[tuple[int, str, int], tuple[float, float]] = {}
    for rank, r in ranks.items():
        for stage, kind, mb, start, end, inside in r.ops:
            if stage >= stages:
                raise ValueError(f"stages: the trace has an op of pipeline stage {stage}, the config's pipeline "
                                 f"{stages} stages")
            at = stage % plan.pp if plan.schedule != "zbv" else (stage if stage < plan.pp else 2 * plan.pp - 1 - stage)
            chunk = stage // plan.pp if plan.schedule != "zbv" else int(stage >= plan.pp)
            n = float(layers[at, chunk])
            terms = {"llm_fwd": n * step.layer_fwd} if kind == "F" else \
                {"llm_bwd": n * step.layer_bwd} if kind == "B" else \
                {"llm_bwd": n * step.layer_bwd / 2} if kind == "I" else {"llm_wgrad": n * step.layer_bwd / 2}
            if stage == 0 and not encoder_measured:  # Megatron-LM: the encoder inside stage 0's ops
                phase = "fwd" if kind == "F" else "bwd"  # a split backward: I and W take half each
                terms[f"encoder_{phase}"] = unit[f"encoder_{phase}"] * (1.0 if kind in "FB" else 0.5)
            rows["op", rank, stage, kind, mb] = (terms, end - start - inside)
            ends[(stage, kind, mb)] = (start, end)
    gaps = []  # a send: from an op's end to the start of the op that needs its output
    for (stage, kind, mb), (_, end) in ends.items():
        if kind == "W":  # nothing waits for a weight gradient
            continue
        nxt = (stage + 1, "F", mb) if kind == "F" else (stage - 1, "B" if (stage - 1, "B", mb) in ends else "I", mb)
        if nxt in ends and ends[nxt][0] > end:
            gaps.append(ends[nxt][0] - end)
    if gaps:
        rows["p2p",] = ({"p2p": unit["p2p"]}, min(gaps))
    for rank, r in ranks.items():
        for kind, t in r.collectives.items():
            rows["collective", rank, kind] = ({kind: unit[kind]}, t)
        for (mb, phase, images, lane), t in r.encoder.items():
            if images and len(images) != len(config.encoders):
                raise ValueError(f"trace: an encoder piece of {len(images)} encoders' images, the config has "
                                 f"{len(config.encoders)} encoders")
            piece = _encoder_unit(config, costs, images) if images else unit
            rows["encoder", rank, mb, phase, images, lane] = ({f"encoder_{phase}": piece[f"encoder_{phase}"]}, t)
    return rows


def _solve(config: Config, found: list[Row], unit: dict[str, float], ranks: int, steps: int) -> Fit:
    """The factors minimising the squared error over the measured quantities `found` (those with a
    positive time and prediction), with their residuals."""
    plan = config.llm_plan
    columns = {k: i for i, k in enumerate(OP_KINDS)}
    rows, measured = [], []
    for terms, value in found:
        if value > 0 and any(v > 0 for v in terms.values()):
            a = np.zeros(len(OP_KINDS))
            for k, v in terms.items():
                a[columns[k]] += v
            rows.append(a)
            measured.append(value)
    if not rows:
        raise ValueError("trace: no op the config predicts was measured")
    a, y = np.array(rows), np.array(measured)
    seen = [k for k in OP_KINDS if a[:, columns[k]].any()]
    wanted = {"p2p": plan.pp > 1, "all_gather": plan.dp > 1, "reduce_scatter": plan.dp > 1,
              "encoder_fwd": unit["encoder_fwd"] > 0, "encoder_bwd": unit["encoder_bwd"] > 0, "llm_fwd": True,
              "llm_bwd": True}
    missing = [k for k, want in wanted.items() if want and k not in seen]
    if missing:
        raise ValueError(f"op_kinds: the config predicts {', '.join(missing)} but the trace measures none "
                         f"(it measures {', '.join(seen)})")
    cols = [columns[k] for k in seen]
    # least squares on the time itself: the long ops, which make the step, weigh the most
    x, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
    bad = [k for k, v in zip(seen, x) if not v > 0]
    if bad:
        raise ValueError(f"op_kinds: the trace does not separate {', '.join(bad)} from the other kinds "
                         "(its fitted factor is not > 0)")
    factors = {k: float(v) for k, v in zip(seen, x)}
    fitted = a[:, cols] @ x
    residuals: dict[str, list[float]] = defaultdict(list)
    for i in range(len(y)):
        dominant = seen[int(np.argmax(a[i, cols] * x))]
        residuals[dominant].append(float(fitted[i] / y[i] - 1.0))
    return Fit(factors=factors, rows={k: len(v) for k, v in residuals.items()}, residuals=dict(residuals),
               ranks=ranks, steps=steps)


__all__ = ["Fit", "MeasuredRank", "Row", "fit_step", "fit_steps", "read_step", "read_steps"]
