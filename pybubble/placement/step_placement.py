"""From measured costs to the step's placement: the LLM step's predicted timeline, the encoder's
tasks as a pybubble.problem/1, the core's schedule, and the predicted step time of each mode.

The prediction lives in one function, :func:`predict_step_s`, fed by
:class:`~pybubble.placement.measured.MeasuredCosts` (timed on this machine in a short profiling
step); a calibrated cost model can replace the measured costs without touching the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config.checks import integer, one_of
from ..llm.tables import Table, build_table
from ..llm.timeline import Timeline, simulate_pipeline
from ..problem.arrays import Tasks
from ..problem.problem import Problem
from ..schedule.scheduler import Schedule, schedule_problem
from .measured import MeasuredCosts

PLACEMENTS = ("megatron", "coarse", "pybubble")
"""Where the encoder runs: on stage 0 inside its ops, before and after the LLM's step on every
rank, or in the step's bubbles as pybubble schedules it."""

US = 1e6
"""Microseconds in a second (the core's times are microseconds, the runtime's seconds)."""


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

def chain_steps(pieces: int, spans: Sequence[int], phase: str) -> list[tuple[int, int]]:
    """An encoder microbatch's ``phase`` tasks in chain order as (chunk, piece): its chunks in
    ``spans`` (consecutive chunks run together, their sizes in order: an image across several
    chunks, whose attention spans them), each span's chunks piece by piece (forwards: pieces in
    order; backwards: in reverse), the spans in order. A span of one chunk runs its pieces in turn."""
    out, c0 = [], 0
    for g in spans:
        order = range(pieces) if phase == "fwd" else range(pieces - 1, -1, -1)
        out += [(c, i) for i in order for c in range(c0, c0 + g)] if g > 1 else [(c0, i) for i in order]
        c0 += g
    return out

def step_weights(steps: Sequence[tuple[int, int]], spans: Sequence[int], joint: Sequence[bool] | None) -> np.ndarray:
    """Per (chunk, piece) of ``steps`` (:func:`chain_steps` over ``spans``), the multiple of the
    piece's cost per chunk that its task takes: a piece that runs a span's chunks together
    (``joint[piece]``: its attention spans them) runs all of them in the span's first chunk's task
    (``g`` times, for a span of ``g`` chunks) and nothing in the others'; every other task 1."""
    span_of: dict[int, tuple[int, int]] = {}  # chunk -> (its span's first chunk, the span's size)
    c0 = 0
    for g in spans:
        span_of.update({c: (c0, g) for c in range(c0, c0 + g)})
        c0 += g
    out = np.ones(len(steps))
    for k, (c, i) in enumerate(steps):
        first, g = span_of[c]
        if joint and joint[i] and g > 1:
            out[k] = g if c == first else 0.0
    return out

def piece_tasks(costs: MeasuredCosts, producer: Sequence[int], chunks: Sequence[int] | None = None,
                spans: Sequence[Sequence[int]] | None = None, joint: Sequence[bool] | None = None) -> Tasks:
    """The encoder's piece tasks (index = id): per encoder microbatch j, for each of its
    ``chunks[j]`` chunks (inputs of the pieces' fixed shape; default one) the pieces' forwards in
    order, then per chunk the pieces' backwards in reverse, on the lane (rank) of its producer, each
    after the one before (arrays: one re-plan per step stays cheap). ``spans[j]``: microbatch j's
    chunks in spans (:func:`chain_steps`: a span's chunks run piece by piece; empty: one chunk each);
    ``joint[i]``: piece i runs a span's chunks together, in its first chunk's task (:func:`step_weights`)."""
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
    for j, s in enumerate(spans or ()):
        if any(g > 1 for g in s):  # a span's chunks piece by piece
            fwd, bwd_ = chain_steps(n, s, "fwd"), chain_steps(n, s, "bwd")
            duration[offset[j]:offset[j] + sizes[j]] = np.concatenate(
                [per_fwd[[i for _, i in fwd]] * step_weights(fwd, s, joint),
                 np.asarray(costs.piece_bwd_s)[[i for _, i in bwd_]] * US * step_weights(bwd_, s, joint)])
    first = pos == 0  # a microbatch's first forward waits for nothing
    after = np.arange(count)[~first] - 1
    return Tasks(lane=np.repeat(np.asarray(producer, np.int64), sizes),
                 microbatch=np.repeat(np.arange(m, dtype=np.int64), sizes), duration=duration.astype(np.float64),
                 resource=np.zeros(count, np.int64), phase=bwd.astype(np.int64),
                 after_offset=np.concatenate([[0], np.cumsum(~first)]).astype(np.int64), after=after.astype(np.int64))

def task_index(pieces: int, chain: int, phase: str, step: int, chunks: Sequence[int] | None = None) -> int:
    """The id in a placement's problem of encoder microbatch ``chain``'s task: its ``step``-th
    forward or its ``step``-th backward in chain order (:func:`chain_steps`), as :func:`piece_tasks`
    numbers them (``chunks``: each microbatch's chunks, default one each)."""
    before = chain if chunks is None else int(sum(chunks[:chain]))
    mine = 1 if chunks is None else int(chunks[chain])
    return 2 * pieces * before + (step if phase == "fwd" else pieces * mine + step)

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
    spans: tuple[tuple[int, ...], ...] = ()
    """Encoder microbatch j's chunks in spans (:func:`chain_steps`); empty: one chunk each."""
    joint: tuple[bool, ...] = ()
    """Per piece, whether it runs a span's chunks together (:func:`step_weights`); empty: none."""

    def chunk_counts(self) -> list[int]:
        """The chunks of each encoder microbatch."""
        return list(self.chunks) or [1] * len(self.producer)

    def spans_of(self, j: int) -> Sequence[int]:
        """Encoder microbatch j's chunks in spans (one chunk each when none spans several)."""
        return self.spans[j] if self.spans else [1] * self.chunk_counts()[j]

    def chain_steps(self, j: int, pieces: int, phase: str) -> list[tuple[int, int]]:
        """Encoder microbatch j's ``phase`` tasks in chain order, as (chunk, piece)."""
        return chain_steps(pieces, self.spans_of(j), phase)

    def step_weights(self, j: int, pieces: int, phase: str) -> np.ndarray:
        """Per task of :meth:`chain_steps`, the multiple of its piece's cost it takes (:func:`step_weights`)."""
        return step_weights(self.chain_steps(j, pieces, phase), self.spans_of(j), self.joint)

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

def check_spans(spans: Sequence[Sequence[int]] | None, chunks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """``spans`` (per microbatch, sizes >= 1 that sum to its chunks) as tuples; () for None."""
    if spans is None:
        return ()
    out = tuple(tuple(int(g) for g in s) for s in spans)
    if len(out) != len(chunks) or any(sum(s) != c or any(g < 1 for g in s) for s, c in zip(out, chunks)):
        raise ValueError(f"spans: {[list(s) for s in out]} do not split each microbatch's chunks {list(chunks)} "
                         "into spans of 1 or more")
    return out

def make_placement(mode: str, costs: MeasuredCosts, microbatches: int, table: Table | None = None,
                   chunks: Sequence[int] | None = None, spans: Sequence[Sequence[int]] | None = None,
                   joint: Sequence[bool] | None = None) -> Placement:
    """Megatron: the encoder inside stage 0. coarse / pybubble: the core's ``coarse`` / ``greedy``
    schedule of the encoder's tasks over all ranks. ``table``: the schedule's action table
    (default 1F1B, one stage per rank). ``chunks``: each microbatch's encoder input in chunks of
    the pieces' shape (data that varies per microbatch; default one each); when they differ,
    encoder microbatch j feeds LLM microbatch j (its data is that microbatch's). ``spans``: each
    microbatch's chunks in spans (:func:`chain_steps`; with ``chunks``); ``joint``: per piece,
    whether it runs a span's chunks together (:func:`step_weights`)."""
    joint = () if joint is None else tuple(bool(x) for x in joint)
    if joint and len(joint) != len(costs.piece_fwd_s):
        raise ValueError(f"joint: {len(joint)} entries for {len(costs.piece_fwd_s)} pieces")
    table = build_table("1f1b", costs.stages, microbatches) if table is None else table
    counts = check_chunks(chunks, microbatches)
    grouped = check_spans(spans, counts)
    first = first_stage_rank(table)
    producer = producers(mode, microbatches, len(table), first, counts or None)
    if mode == "megatron":
        return Placement(mode=mode, timeline=measured_timeline(costs, microbatches, True, table, counts or None),
                         producer=producer, assignment=list(range(microbatches)), start_s=None, problem=None,
                         schedule=None, first_stage=first, chunks=counts, spans=grouped, joint=joint)
    timeline = measured_timeline(costs, microbatches, table=table)
    problem = Problem.on_timeline(timeline, piece_tasks(costs, producer, counts or None, grouped or None, joint))
    sched = schedule_problem(problem, "coarse" if mode == "coarse" else "greedy",
                             fixed_assignment=len(set(counts)) > 1)
    return Placement(mode=mode, timeline=timeline, producer=producer, assignment=[int(k) for k in sched.assignment],
                     start_s=np.asarray(sched.start) / US, problem=problem, schedule=sched, first_stage=first,
                     chunks=counts, spans=grouped, joint=joint)

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

def shift_front_s(plan: Placement) -> float:
    """Seconds from the step's start to the LLM's frame 0 (the encoder work planned before it)."""
    return 0.0 if plan.schedule is None else plan.schedule.shift_front / US
