"""The plan one rank runs in one step, as data.

A :class:`RankPlan` holds what the rank's filler follows: its LLM ops in the order of the
schedule's action table, each with its predicted gap and start, and its encoder tasks in plan
order, each with its chain (encoder microbatch), piece, phase, planned start, measured duration
and the LLM microbatch whose first-stage forward needs it. It imports no torch: it is built from
the step's :class:`~pybubble.placement.step_placement.Placement` (:func:`rank_plan`),
written to JSON and read back equal (``python -m pybubble.testing.mllm --dump-plan DIR``).

Times are seconds, counted from the step's frame origin (the moment the rank enters the pipeline's
schedule); tasks planned before it (negative starts) run in the step's front.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields

from ..config.checks import one_of
from ..costs.kernels import PHASES
from ..llm.tables import Action
from ..measure import names as names_
from .measured import MeasuredCosts
from .step_placement import US, Placement, placement_step_s, shift_front_s, task_index

FORMAT = "pybubble.rank_plan/1"
"""The ``format`` key of a rank plan's JSON document."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedOp:
    """One of the rank's LLM ops."""

    action: Action
    """Its stage, kind (F, B, I, W) and microbatch, as in the schedule's action table."""
    gap_s: float
    """The idle time predicted before it (from the end of the rank's previous op, or from the
    frame origin for the first)."""
    start_s: float | None = None
    """When its input is predicted to arrive (None: ``gap_s`` after the gap opens)."""
    force_until_s: float = -math.inf
    """Forward tasks the first stage is planned to need before this time run before the wait ahead
    of this op: the filler gets no control again before then (the ops up to the next one that
    waits for a receive run back to back)."""

    @property
    def key(self) -> tuple[str, int]:
        """(kind, microbatch): how a stage's op announces itself."""
        return self.action.kind, self.action.microbatch


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedTask:
    """One of the rank's encoder tasks: one piece of one encoder microbatch, forward or backward."""

    chain: int
    """The encoder microbatch; a chain's tasks run in plan order."""
    piece: int
    """The piece's index in the encoder."""
    phase: str
    """``fwd`` or ``bwd``."""
    label: str
    """Its name in traces (:func:`pybubble.measure.names.task_label`)."""
    duration_s: float
    """Its measured duration."""
    planned_start_s: float
    """Its start in the plan."""
    needed_by: int | None = None
    """Forward tasks: the LLM microbatch whose first-stage forward needs the chain's output."""
    needed_at_s: float | None = None
    """Forward tasks on a rank other than the first stage's: when the first stage is planned to need
    the chain's output (None: no time is set)."""
    host_only: bool = False
    """It talks to another rank (sends the output, takes the output's gradient): it runs on the
    rank's main thread only."""
    after_grad: bool = False
    """Its input is the gradient of the chain's output, sent by the first stage (the first backward
    task)."""
    chunk: int = 0
    """The chunk of the chain's input it works on (a chain's input comes in chunks of the pieces'
    fixed shape; the chunks' forwards run in order, then their backwards)."""

    def __post_init__(self) -> None:
        one_of(self.phase, PHASES, "phase")


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPlan:
    """What one rank runs in one step (see the module's notes)."""

    mode: str
    """``megatron``, ``coarse`` or ``pybubble``."""
    rank: int
    """The rank in the pipeline group."""
    first_stage: int
    """The rank that holds the LLM's first stage (where the encoder outputs go)."""
    producer: tuple[int, ...]
    """The rank that computes each encoder microbatch."""
    assignment: tuple[int, ...]
    """The LLM microbatch each encoder microbatch feeds."""
    horizon_s: float
    """The LLM's step as predicted (without the encoder work outside its frame)."""
    shift_front_s: float
    """The encoder work planned before the frame origin (the step grows by it)."""
    tail_gap_s: float
    """The idle time predicted after the rank's last op, to the end of the LLM's step."""
    ops: tuple[PlannedOp, ...]
    """The rank's LLM ops, in the order they run."""
    tasks: tuple[PlannedTask, ...]
    """The rank's encoder tasks in plan order (by planned start)."""
    output_arrival_s: tuple[float | None, ...]
    """Per encoder microbatch: when its output is predicted at the first stage (None: not planned)."""
    chunks: tuple[int, ...] = ()
    """Per encoder microbatch: the chunks of its input (empty: one each)."""
    spans: tuple[tuple[int, ...], ...] = ()
    """Per encoder microbatch: its chunks in spans, run together (empty: one chunk each)."""
    predicted_step_s: float
    """The whole step as predicted."""

    @property
    def fill(self) -> bool:
        """Whether tasks run inside the waits (``pybubble`` mode)."""
        return self.mode == "pybubble"

    @property
    def gaps_s(self) -> list[float]:
        """The gap before each op, then the gap after the last."""
        return [op.gap_s for op in self.ops] + [self.tail_gap_s]

    def to_json(self) -> dict:
        """The plan as a JSON document (``format``: :data:`FORMAT`)."""
        def plain(obj):
            out = {}
            for f in fields(obj):
                v = getattr(obj, f.name)
                if isinstance(v, Action):
                    v = str(v)
                elif isinstance(v, tuple):
                    v = [plain(x) if hasattr(x, "__dataclass_fields__") else x for x in v]
                elif isinstance(v, float) and math.isinf(v):
                    v = None  # JSON has no infinity: only force_until_s can be one (-inf, no time)
                out[f.name] = v
            return out
        return {"format": FORMAT, **plain(self)}

    @classmethod
    def from_json(cls, doc: dict) -> RankPlan:
        """The plan of a document written by :meth:`to_json`; ``ValueError`` for another format."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"format: {doc.get('format') if isinstance(doc, dict) else doc!r} is not {FORMAT!r}")
        ops = tuple(PlannedOp(action=Action.parse(o["action"]), gap_s=o["gap_s"], start_s=o["start_s"],
                              force_until_s=-math.inf if o["force_until_s"] is None else o["force_until_s"])
                    for o in doc["ops"])
        tasks = tuple(PlannedTask(**t) for t in doc["tasks"])
        rest = {f.name: doc[f.name] for f in fields(cls) if f.name not in ("ops", "tasks", "chunks", "spans")}
        rest["chunks"] = doc.get("chunks", [])
        rest["spans"] = tuple(tuple(s) for s in doc.get("spans", []))
        for name in ("producer", "assignment", "output_arrival_s", "chunks"):
            rest[name] = tuple(rest[name])
        return cls(**rest, ops=ops, tasks=tasks)

    def write(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`to_json` to ``path``."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RankPlan:
        """The plan written to ``path`` by :meth:`write`."""
        with open(path) as f:
            return cls.from_json(json.load(f))




def _rank_tasks(plan: Placement, rank: int, costs: MeasuredCosts, names: Sequence[str]) -> list[PlannedTask]:
    """The encoder tasks ``rank`` runs under ``plan``, in plan order (by planned start)."""
    n, front, counts = len(names), shift_front_s(plan), plan.chunk_counts()
    tasks = []
    for j, producer in enumerate(plan.producer):
        if producer != rank or counts[j] == 0:
            continue
        k, remote, ch = plan.assignment[j], producer != plan.first_stage, counts[j]  # a remote chain's output travels
        needed_at = None
        if plan.start_s is not None and remote:
            needed_at = front + float(plan.timeline.forward_needed[k]) / US - costs.p2p_s
        weight = plan.step_weights(j, n, "fwd")
        for step, (c, i) in enumerate(plan.chain_steps(j, n, "fwd")):
            start = 0.0 if plan.start_s is None else float(plan.start_s[task_index(n, j, "fwd", step, counts)])
            tasks.append(PlannedTask(chain=j, piece=i, phase="fwd", label=names_.task_label(j, "fwd", names[i]),
                                     duration_s=costs.piece_fwd_s[i] * float(weight[step]), planned_start_s=start,
                                     needed_by=k, needed_at_s=needed_at, host_only=remote and step == n * ch - 1, chunk=c))
        weight = plan.step_weights(j, n, "bwd")
        for step, (c, i) in enumerate(plan.chain_steps(j, n, "bwd")):
            start = (plan.timeline.step_time / US if plan.start_s is None
                     else float(plan.start_s[task_index(n, j, "bwd", step, counts)]))
            tasks.append(PlannedTask(chain=j, piece=i, phase="bwd", label=names_.task_label(j, "bwd", names[i]),
                                     duration_s=costs.piece_bwd_s[i] * float(weight[step]), planned_start_s=start,
                                     host_only=remote and step == 0, after_grad=step == 0, chunk=c))
    return sorted(tasks, key=lambda t: t.planned_start_s)

def _rank_ops(plan: Placement, rank: int) -> tuple[list[PlannedOp], float]:
    """``rank``'s ops with their predicted gaps and starts (seconds after the step's start) from the
    LLM timeline and how far ahead each wait must produce the first stage's inputs (to the end of
    the ops that follow it without a receive); and the gap after the last op."""
    every = plan.timeline.ops
    ops = [op for op in every if op.rank == rank]  # in the table's order, the order they run in
    owner = {op.stage: op.rank for op in every}
    front, last = shift_front_s(plan), max(owner)

    def receives(op) -> bool:  # its input comes from another rank: the schedule waits before it
        return ((op.kind == "F" and op.stage > 0 and owner[op.stage - 1] != rank)
                or (op.kind in "BI" and op.stage < last and owner[op.stage + 1] != rank))

    planned, t = [], 0.0
    for n, op in enumerate(ops):
        k = n
        while k + 1 < len(ops) and not receives(ops[k + 1]):
            k += 1
        planned.append(PlannedOp(action=Action(op.stage, op.kind, op.microbatch), gap_s=(op.start - t) / US,
                                 start_s=front + op.start / US, force_until_s=front + ops[k].end / US))
        t = op.end
    return planned, (plan.timeline.step_time - t) / US

def rank_plan(plan: Placement, rank: int, costs: MeasuredCosts, piece_names: Sequence[str]) -> RankPlan:
    """What ``rank`` runs in the step ``plan`` places (its ops and its encoder tasks, the encoder
    of ``len(piece_names)`` pieces with the durations of ``costs``), as data."""
    if len(piece_names) != len(costs.piece_fwd_s):
        raise ValueError(f"piece_names: {len(piece_names)} names for {len(costs.piece_fwd_s)} pieces")
    n, front, counts = len(piece_names), shift_front_s(plan), plan.chunk_counts()
    arrival: list[float | None] = [None] * len(plan.producer)
    if plan.start_s is not None:
        for j, p in enumerate(plan.producer):
            if counts[j] == 0:
                continue
            last = task_index(n, j, "fwd", n * counts[j] - 1, counts)
            arrival[j] = (front + float(plan.start_s[last]) + costs.piece_fwd_s[-1]
                          + (costs.p2p_s if p != plan.first_stage else 0.0))
    ops, tail = _rank_ops(plan, rank)
    return RankPlan(mode=plan.mode, rank=rank, first_stage=plan.first_stage, producer=tuple(plan.producer),
                    assignment=tuple(plan.assignment), horizon_s=plan.timeline.step_time / US, shift_front_s=front,
                    tail_gap_s=tail, ops=tuple(ops), tasks=tuple(_rank_tasks(plan, rank, costs, piece_names)),
                    output_arrival_s=tuple(arrival), predicted_step_s=placement_step_s(plan, costs),
                    chunks=plan.chunks, spans=plan.spans)


__all__ = ["FORMAT", "PlannedOp", "PlannedTask", "RankPlan", "rank_plan"]
