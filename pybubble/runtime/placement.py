"""From measured costs to this rank's plan: the LLM step's predicted timeline, the encoder's
tasks as a pybubble.problem/1, the core's schedule, and the predicted step time of each mode.

The prediction lives in one function, :func:`predict_step_s`, fed by :class:`MeasuredCosts`
(timed on this machine in a short profiling step); a calibrated cost model can replace the
measured costs without touching the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config.checks import finite, integer, one_of
from ..llm.tables import Action, Table, build_table
from ..llm.timeline import Timeline, simulate_pipeline
from ..problem.arrays import Tasks
from ..problem.problem import Problem
from ..measure import names as names_
from ..schedule.scheduler import Schedule, schedule_problem
from .plan import PlannedOp, PlannedTask, RankPlan

PLACEMENTS = ("megatron", "coarse", "pybubble")
"""Where the encoder runs: on stage 0 inside its ops, before and after the LLM's step on every
rank, or in the step's bubbles as pybubble schedules it."""
US = 1e6
"""Microseconds in a second (the core's times are microseconds, the runtime's seconds)."""


@dataclass(kw_only=True, slots=True)
class MeasuredCosts:
    """Seconds, one microbatch each."""

    stage_fwd_s: list[float]
    """Forward of each LLM pipeline stage (global stage index, as in the schedule's table)."""
    stage_bwd_s: list[float]
    """Full backward of each LLM pipeline stage (B, or I + W in a zero-bubble schedule)."""
    p2p_s: float
    """Latency of one pipeline send/receive (activation or gradient)."""
    piece_fwd_s: list[float]
    """Forward of each encoder piece (kernel-level task)."""
    piece_bwd_s: list[float]
    """Backward of each encoder piece."""
    optimizer_s: float = 0.0
    """What each step does outside the pipeline and the encoder: per rank (the largest) the
    optimizer step, the trainer's own work between steps and the runtime's own work before the
    step (its planning, the step's set-up); and the runtime's collectives before the step (the
    data's agreement, the moves between replicas, the costs' sharing, the barrier) as the last
    rank to reach them saw them."""
    grad_sync_s: float = 0.0
    """All-reduce of the encoder's gradients (modes that spread the encoder over ranks; with
    data-parallel replicas every mode, over them: :func:`lockstep_s`'s prediction adds it)."""
    stage_wgrad_s: list[float] | None = None
    """The weight-gradient part W of each stage's backward (zero-bubble schedules; I takes the
    rest); None: half of it."""
    tp_count: int = 0
    """Tensor-parallel collectives waited on inside each LLM forward and backward op (measured on
    the mesh: layers x collectives per layer)."""
    tp_gap_s: float = 0.0
    """A TP collective's typical gap, how long its consumer waits for it (measured, the median):
    the gaps the plan offers the pieces and the filler's room at a TP wait."""
    tp_wait_s: float = 0.0
    """The mean of those waits (the gaps are heavy-tailed on a loaded machine): count x mean is the
    ops' time in TP waits; 0: the typical gap."""

    @property
    def tp_op_wait_s(self) -> float:
        """The time each LLM forward and backward op waits on TP collectives: count x mean (the
        typical gap where no mean was measured)."""
        return self.tp_count * max(self.tp_gap_s, self.tp_wait_s)

    def __post_init__(self) -> None:
        if len(self.stage_fwd_s) != len(self.stage_bwd_s) or not self.stage_fwd_s:
            raise ValueError(f"stage_bwd_s: {len(self.stage_bwd_s)} stages, stage_fwd_s has {len(self.stage_fwd_s)}")
        if len(self.piece_fwd_s) != len(self.piece_bwd_s) or not self.piece_fwd_s:
            raise ValueError(f"piece_bwd_s: {len(self.piece_bwd_s)} pieces, piece_fwd_s has {len(self.piece_fwd_s)}")
        if self.stage_wgrad_s is not None and len(self.stage_wgrad_s) != len(self.stage_fwd_s):
            raise ValueError(f"stage_wgrad_s: {len(self.stage_wgrad_s)} stages, stage_fwd_s has {len(self.stage_fwd_s)}")
        for name in ("stage_fwd_s", "stage_bwd_s", "stage_wgrad_s", "piece_fwd_s", "piece_bwd_s"):
            for i, v in enumerate(getattr(self, name) or ()):
                finite(v, f"{name}[{i}]", minimum=0.0)
        for name in ("p2p_s", "optimizer_s", "grad_sync_s", "tp_gap_s", "tp_wait_s"):
            finite(getattr(self, name), name, minimum=0.0)
        integer(self.tp_count, "tp_count", minimum=0)

    @property
    def stages(self) -> int:
        """Pipeline stages (of every rank)."""
        return len(self.stage_fwd_s)


def check_mode(mode: str) -> str:
    """`mode` if it is one of :data:`PLACEMENTS`."""
    return one_of(mode, PLACEMENTS, "mode")


def producers(mode: str, microbatches: int, ranks: int, first_stage_rank: int = 0,
              chunks: Sequence[int] | None = None) -> list[int]:
    """The rank that runs encoder microbatch j: the first stage's rank in megatron mode; otherwise,
    in microbatch order, the rank with the least encoder work so far (``chunks[j]``: the
    microbatch's pieces of a fixed shape, default one each: round robin), the first stage's rank
    for a microbatch without encoder work (nothing to send)."""
    check_mode(mode)
    if mode == "megatron":
        return [first_stage_rank] * microbatches
    counts = [1] * microbatches if chunks is None else [int(c) for c in chunks]
    load, out = [0] * ranks, []
    for j, c in enumerate(counts):
        if c == 0:
            out.append(first_stage_rank)
            continue
        least = [r for r in range(ranks) if load[r] == min(load)]
        r = j % ranks if j % ranks in least else least[0]
        load[r] += c
        out.append(r)
    return out


def stage_ranks(table: Table) -> dict[int, int]:
    """The rank that runs each stage of an action table."""
    return {a.stage: r for r, row in table.items() for a in row if a is not None}


def splits_backward(table: Table) -> bool:
    """Whether the action table splits backwards into I and W (zero-bubble schedules)."""
    return any(a is not None and a.kind in "IW" for row in table.values() for a in row)


def first_stage_rank(table: Table) -> int:
    """The rank that holds the LLM's first stage (stage 0) in an action table."""
    return stage_ranks(table).get(0, 0)


def measured_timeline(costs: MeasuredCosts, microbatches: int, encoder_on_first_stage: bool = False,
                      table: Table | None = None, encoder_chunks: Sequence[int] | None = None) -> Timeline:
    """The LLM step of ``table`` (the schedule's action table; default 1F1B, one stage per rank)
    with the measured stage costs (with the whole encoder inside stage 0's ops when asked: its
    backward inside stage 0's W when the table splits it). With tensor parallelism each forward
    and backward op also holds ``tp_count`` gaps of ``tp_gap_s`` (the ops' measured times leave the
    waits out: they are added back, ``tp_count`` x ``tp_wait_s`` in all; what the mean exceeds the
    typical gap by stays in the op, unfillable); a table that splits backwards (I, W) is refused
    with tensor parallelism (the measured figures do not say how its TP waits fall on I and W).
    ``encoder_chunks``: the encoder's chunks per microbatch (stage 0's ops then hold the mean: the
    simulator takes one duration per stage)."""
    table = build_table("1f1b", costs.stages, microbatches) if table is None else table
    ranks, owner = len(table), stage_ranks(table)
    if sorted(owner) != list(range(costs.stages)):
        raise ValueError(f"table: stages {sorted(owner)} are not the {costs.stages} stages of the costs")
    tp = costs.tp_op_wait_s
    if tp > 0.0 and splits_backward(table):
        raise ValueError(f"tp_count: {costs.tp_count} TP collectives per op, but the table splits backwards "
                         "into I and W: tensor parallelism is predicted with whole backwards only (1f1b, gpipe, "
                         "interleaved_1f1b)")
    chunks = costs.stages // ranks
    fwd, bwd = np.zeros((ranks, chunks)), np.zeros((ranks, chunks))
    wgrad = None if costs.stage_wgrad_s is None else np.zeros((ranks, chunks))
    place = {}
    for r in range(ranks):
        for c, s in enumerate(sorted(s for s, rr in owner.items() if rr == r)):
            place[s] = (r, c)
            fwd[r, c], bwd[r, c] = (costs.stage_fwd_s[s] + tp) * US, (costs.stage_bwd_s[s] + tp) * US
            if wgrad is not None:
                wgrad[r, c] = costs.stage_wgrad_s[s] * US
    if wgrad is None:
        wgrad = bwd / 2
    if encoder_on_first_stage:
        per = 1.0 if not encoder_chunks else float(np.mean(encoder_chunks))
        fwd[place[0]] += per * sum(costs.piece_fwd_s) * US
        bwd[place[0]] += per * sum(costs.piece_bwd_s) * US
        wgrad[place[0]] += per * sum(costs.piece_bwd_s) * US
    # torch's first stage runs its whole backward in W (its I has no input to differentiate); the
    # core wants some of it in I
    wgrad = np.minimum(wgrad, bwd * (1 - 1e-6))
    tp_comm = (costs.tp_count, costs.tp_gap_s * US) if tp > 0.0 else None
    if tp_comm is not None and not (tp_comm[0] + 1) * tp_comm[1] < min(fwd.min(), bwd.min()):
        tp_comm = None  # the core's gaps need some compute around each: the ops keep the time, not the gaps
    return simulate_pipeline(table, fwd=fwd, bwd=bwd, wgrad=wgrad, p2p=costs.p2p_s * US, tp_comm=tp_comm)


def piece_tasks(costs: MeasuredCosts, producer: Sequence[int], chunks: Sequence[int] | None = None) -> Tasks:
    """The encoder's piece tasks (index = id): per encoder microbatch j, for each of its
    ``chunks[j]`` chunks (inputs of the pieces' fixed shape; default one) the pieces' forwards in
    order, then per chunk the pieces' backwards in reverse, on the lane (rank) of its producer, each
    after the one before (arrays: one re-plan per step stays cheap)."""
    n, m = len(costs.piece_fwd_s), len(producer)
    counts = np.ones(m, np.int64) if chunks is None else np.asarray(chunks, np.int64)
    per_fwd, per_bwd = np.asarray(costs.piece_fwd_s) * US, np.asarray(costs.piece_bwd_s)[::-1] * US
    sizes = 2 * n * counts
    count = int(sizes.sum())
    offset = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pos = np.arange(count) - np.repeat(offset, sizes)  # position inside its microbatch's chain
    half = np.repeat(n * counts, sizes)
    bwd = pos >= half
    duration = np.where(bwd, per_bwd[(pos - half) % n], per_fwd[pos % n]) if count else np.zeros(0)
    first = pos == 0  # a microbatch's first forward waits for nothing
    after = np.arange(count)[~first] - 1
    return Tasks(lane=np.repeat(np.asarray(producer, np.int64), sizes),
                 microbatch=np.repeat(np.arange(m, dtype=np.int64), sizes), duration=duration.astype(np.float64),
                 resource=np.zeros(count, np.int64), phase=bwd.astype(np.int64),
                 after_offset=np.concatenate([[0], np.cumsum(~first)]).astype(np.int64), after=after.astype(np.int64))


@dataclass(frozen=True, slots=True)
class Placement:
    """What every rank needs to run one mode's step."""

    mode: str
    """One of :data:`PLACEMENTS`."""
    timeline: Timeline
    """The LLM step as predicted (with the encoder inside stage 0 in megatron mode)."""
    producer: list[int]
    """The rank that computes each encoder microbatch."""
    assignment: list[int]
    """The LLM microbatch each encoder microbatch feeds."""
    start_s: np.ndarray | None
    """Planned start of each encoder task (None in megatron mode: it runs inside stage 0's ops)."""
    problem: Problem | None
    """The bubble-filling problem of the encoder's pieces (None in megatron mode)."""
    schedule: Schedule | None
    """Its schedule (None in megatron mode)."""
    first_stage: int = 0
    """The rank that holds the LLM's first stage (where the encoder outputs go)."""
    chunks: tuple[int, ...] = ()
    """Encoder microbatch j's chunks (inputs of the pieces' fixed shape); empty: one each."""

    def chunk_counts(self) -> list[int]:
        """The chunks of each encoder microbatch."""
        return list(self.chunks) or [1] * len(self.producer)


def check_chunks(chunks: Sequence[int] | None, microbatches: int) -> tuple[int, ...]:
    """``chunks`` (one count >= 0 per microbatch) as a tuple; () for None."""
    if chunks is None:
        return ()
    out = tuple(chunks)
    if len(out) != microbatches:
        raise ValueError(f"chunks: {len(out)} counts for {microbatches} microbatches")
    for j, c in enumerate(out):
        integer(c, f"chunks[{j}]", minimum=0)
    return out


def make_placement(mode: str, costs: MeasuredCosts, microbatches: int, table: Table | None = None,
                   chunks: Sequence[int] | None = None) -> Placement:
    """Megatron: the encoder inside stage 0. coarse / pybubble: the core's ``coarse`` / ``greedy``
    schedule of the encoder's tasks over all ranks. ``table``: the schedule's action table
    (default 1F1B, one stage per rank). ``chunks``: each microbatch's encoder input in chunks of
    the pieces' shape (data that varies per microbatch; default one each); when they differ,
    encoder microbatch j feeds LLM microbatch j (its data is that microbatch's)."""
    table = build_table("1f1b", costs.stages, microbatches) if table is None else table
    counts = check_chunks(chunks, microbatches)
    first = first_stage_rank(table)
    producer = producers(mode, microbatches, len(table), first, counts or None)
    if mode == "megatron":
        return Placement(mode=mode, timeline=measured_timeline(costs, microbatches, True, table, counts or None),
                         producer=producer, assignment=list(range(microbatches)), start_s=None, problem=None,
                         schedule=None, first_stage=first, chunks=counts)
    timeline = measured_timeline(costs, microbatches, table=table)
    problem = Problem.on_timeline(timeline, piece_tasks(costs, producer, counts or None))
    sched = schedule_problem(problem, "coarse" if mode == "coarse" else "greedy",
                             fixed_assignment=len(set(counts)) > 1)
    return Placement(mode=mode, timeline=timeline, producer=producer, assignment=[int(k) for k in sched.assignment],
                     start_s=np.asarray(sched.start) / US, problem=problem, schedule=sched, first_stage=first,
                     chunks=counts)


def predict_step_s(mode: str, costs: MeasuredCosts, microbatches: int, table: Table | None = None,
                   chunks: Sequence[int] | None = None) -> float:
    """Predicted step time (s) of ``mode``: the simulated LLM step of ``table`` (default 1F1B)
    with the encoder where the mode puts it (``chunks``: each microbatch's, see
    :func:`make_placement`), plus what follows the pipeline (gradient sync of a spread encoder,
    optimizer)."""
    return placement_step_s(make_placement(check_mode(mode), costs, microbatches, table, chunks), costs)


def placement_step_s(plan: Placement, costs: MeasuredCosts) -> float:
    """The step ``plan`` predicts with ``costs`` (see :func:`predict_step_s`)."""
    step_us = plan.timeline.step_time if plan.schedule is None else plan.schedule.step_time
    sync = 0.0 if plan.mode == "megatron" else costs.grad_sync_s
    return step_us / US + sync + costs.optimizer_s


def step_marks_s(plan: Placement, rank: int, costs: MeasuredCosts) -> np.ndarray:
    """Seconds from the step's start at which ``rank`` is predicted to begin each of its LLM ops (in
    the order they run), to end its last op, and to end the step's compute (the pipeline and the
    encoder's tasks, before the encoder's gradient sync): where its data-parallel collectives meet
    those of the other replicas (:func:`lockstep_s`). In megatron mode with chunks that vary per
    microbatch, the first stage's ops carry their own microbatch's encoder work (its timeline holds
    the mean): the marks after them move by what they carry over the mean."""
    ops = [op for op in plan.timeline.ops if op.rank == rank]
    if not ops:
        raise ValueError(f"rank: {rank} runs no op of the plan's {len(plan.timeline.ops)}")
    starts = np.array([op.start for op in ops], dtype=np.float64) / US
    end = ops[-1].end / US
    if plan.mode == "megatron" and plan.chunks and rank == plan.first_stage:
        over = np.asarray(plan.chunks, np.float64) - float(np.mean(plan.chunks))
        backward = "W" if any(op.kind == "W" for op in ops) else "B"  # where the timeline put the encoder's backward
        per = {"F": sum(costs.piece_fwd_s), backward: sum(costs.piece_bwd_s)}
        carried = np.array([over[op.microbatch] * per.get(op.kind, 0.0) if op.stage == 0 else 0.0 for op in ops])
        moved = np.concatenate([[0.0], np.cumsum(carried)])
        starts, end = starts + moved[:-1], end + moved[-1]
    front = shift_front_s(plan)
    compute = (plan.timeline.step_time if plan.schedule is None else plan.schedule.step_time) / US
    return np.concatenate([front + starts, [front + end, max(compute, front + end)]])


def lockstep(marks: np.ndarray | Sequence[Sequence[float]], meets_s: Sequence[float]) -> tuple[float, np.ndarray]:
    """:func:`lockstep_s`'s compute and :func:`lockstep_waits_s`'s waits, from one pass."""
    marks = np.asarray(marks, dtype=np.float64)
    if marks.ndim != 2 or marks.shape[0] < 1 or marks.shape[1] < 2:
        raise ValueError(f"marks: shape {marks.shape} is not one row per replica of n ops + 2 marks")
    n = marks.shape[1] - 2
    if len(meets_s) != n + 1:
        raise ValueError(f"meets_s: {len(meets_s)} values for {n} ops (need {n + 1})")
    for r, k in np.argwhere(~np.isfinite(marks))[:1]:
        finite(float(marks[r, k]), f"marks[{r}][{k}]")
    own = {k: finite(v, f"meets_s[{k}]", minimum=0.0) for k, v in enumerate(meets_s)
           if not (isinstance(v, (float, np.floating)) and math.isnan(v))}
    total, before = 0.0, np.zeros(len(marks))
    waits = np.full((len(marks), n + 1), np.nan)
    for k in [*own, n + 1]:
        stretch = marks[:, k] - before
        total += float(stretch.max()) + own.get(k, 0.0)
        if k <= n:
            waits[:, k] = stretch.max() - stretch
        before = marks[:, k]
    return total, waits


def lockstep_s(marks: np.ndarray | Sequence[Sequence[float]], meets_s: Sequence[float]) -> float:
    """The step's compute (s) of data-parallel replicas that wait for each other at their
    collectives: ``marks`` one row per replica, the :func:`step_marks_s` of the same rank in each
    (n ops, the last op's end, the compute's end); ``meets_s`` n + 1 values: where the replicas'
    collectives meet, at op k's start (k = n: after the last op), the collectives' time there
    beyond the replicas' waits for each other (NaN: none). The replicas also meet at the compute's
    end (the encoder's gradient sync over them). Each stretch up to a meeting takes as long as its
    slowest replica, then the collectives' time. With one replica and no meeting: its compute's
    end."""
    return lockstep(marks, meets_s)[0]


def lockstep_waits_s(marks: np.ndarray | Sequence[Sequence[float]], meets_s: Sequence[float]) -> np.ndarray:
    """How long each replica is predicted to wait for the slowest at each place where they meet
    (:func:`lockstep_s`'s arguments): one row per replica, one column per op and one after the
    last; NaN where they do not meet (the collectives' own time not included)."""
    return lockstep(marks, meets_s)[1]


def shift_front_s(plan: Placement) -> float:
    """Seconds from the step's start to the LLM's frame 0 (the encoder work planned before it)."""
    return 0.0 if plan.schedule is None else plan.schedule.shift_front / US


def task_index(pieces: int, chain: int, phase: str, step: int, chunks: Sequence[int] | None = None) -> int:
    """The id in a placement's problem of encoder microbatch ``chain``'s task: its ``step``-th
    forward (chunk ``step // pieces``, piece ``step % pieces``) or its ``step``-th backward (chunk
    ``step // pieces``, piece ``pieces - 1 - step % pieces``), as :func:`piece_tasks` numbers them
    (``chunks``: each microbatch's chunks, default one each)."""
    before = chain if chunks is None else int(sum(chunks[:chain]))
    mine = 1 if chunks is None else int(chunks[chain])
    return 2 * pieces * before + (step if phase == "fwd" else pieces * mine + step)


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
        for step in range(n * ch):
            c, i = divmod(step, n)
            start = 0.0 if plan.start_s is None else float(plan.start_s[task_index(n, j, "fwd", step, counts)])
            tasks.append(PlannedTask(chain=j, piece=i, phase="fwd", label=names_.task_label(j, "fwd", names[i]),
                                     duration_s=costs.piece_fwd_s[i], planned_start_s=start, needed_by=k,
                                     needed_at_s=needed_at, host_only=remote and step == n * ch - 1, chunk=c))
        for step in range(n * ch):
            c, i = step // n, n - 1 - step % n
            start = (plan.timeline.step_time / US if plan.start_s is None
                     else float(plan.start_s[task_index(n, j, "bwd", step, counts)]))
            tasks.append(PlannedTask(chain=j, piece=i, phase="bwd", label=names_.task_label(j, "bwd", names[i]),
                                     duration_s=costs.piece_bwd_s[i], planned_start_s=start,
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
                    chunks=plan.chunks)
