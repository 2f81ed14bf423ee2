"""Pipeline schedules as action tables in torch.distributed.pipelining's format.

A table maps each pipeline rank to its list of actions in order. An :class:`Action` is one stage's
pass over one microbatch, written as torch writes it: ``"0F1"`` is stage 0's forward of microbatch
1; ``B`` a full backward, ``I`` the input-gradient backward, ``W`` the weight-gradient backward;
``None`` is an idle step. Stages are global (``rank + chunk * ranks`` for the interleaved schedule,
``rank`` and ``2 * ranks - 1 - rank`` for zbv).
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Union

import numpy as np

from .. import _core
from ..config.checks import integer, one_of, shown
from ..config.documents import write_text
from ..config.limits import MAX_TABLE_ACTIONS
from ..config.schema import SCHEDULES

ACTION_KINDS = ("F", "B", "I", "W")
"""Action kinds: forward, full backward, input-gradient backward, weight-gradient backward."""
NAMES = SCHEDULES
"""The named schedules (:func:`build_table`)."""
_ACTION = re.compile(r"^([0-9]+)([FBIW])([0-9]+)$")
_INT32_MAX = 2**31 - 1
_KIND_CODE = np.zeros(256, np.uint8)  # ASCII letter -> index in ACTION_KINDS
_KIND_CODE[[ord(k) for k in ACTION_KINDS]] = np.arange(len(ACTION_KINDS), dtype=np.uint8)
_KIND_LETTERS = np.array([ord(k) for k in ACTION_KINDS], np.uint8)


class Action(NamedTuple):
    """One action of a table: stage ``stage``'s pass ``kind`` over microbatch ``microbatch``
    (torch's ``_Action``); ``str(action)`` is torch's notation, e.g. ``"3F12"``."""

    stage: int
    """The global stage (0 .. ranks * chunks - 1)."""
    kind: str
    """One of :data:`ACTION_KINDS`."""
    microbatch: int
    """The LLM microbatch."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: object, where: str = "action") -> "Action":
        """``"3F12"`` -> Action(3, "F", 12); an Action is returned as it is; ValueError naming ``where``."""
        if isinstance(text, Action):
            return text
        found = _ACTION.match(text.strip()) if isinstance(text, str) else None
        if found is None:
            raise ValueError(f"{where}: {shown(text)} is not an action like '0F1' (stage, F/B/I/W, microbatch)")
        stage, micro = int(found.group(1)), int(found.group(3))
        if max(stage, micro) >= _INT32_MAX:
            raise ValueError(f"{where}: {shown(text)} has a stage or microbatch of 2**31 - 1 or more")
        return cls(stage, found.group(2), micro)


Table = dict[int, list[Union[Action, None]]]
"""A checked table: ranks 0 .. p-1, each a list of actions or idle steps (None)."""
TableLike = Union[Mapping[int, Sequence[Union[Action, str, None]]], Sequence[Sequence[Union[Action, str, None]]]]
"""A user's table: a mapping or sequence of rows whose actions are :class:`Action` or strings."""


def _counts(ranks: int, microbatches: int, chunks: int = 1, passes: int = 2) -> tuple[int, int]:
    """The checked rank and microbatch counts of a table, whose actions must stay within
    :data:`MAX_TABLE_ACTIONS`."""
    p, m = integer(ranks, "ranks", minimum=1), integer(microbatches, "microbatches", minimum=1)
    if p * m * chunks * passes > MAX_TABLE_ACTIONS:
        raise ValueError(f"table: {p:,} ranks x {chunks:,} chunks x {m:,} microbatches x {passes} passes = "
                         f"{p * m * chunks * passes:,} actions, more than the limit of {MAX_TABLE_ACTIONS:,}")
    return p, m


def gpipe(ranks: int, microbatches: int) -> Table:
    """All forwards, then all backwards."""
    p, m = _counts(ranks, microbatches)
    return {r: [Action(r, "F", k) for k in range(m)] + [Action(r, "B", k) for k in range(m)] for r in range(p)}


def one_f_one_b(ranks: int, microbatches: int) -> Table:
    """1F1B: rank r runs min(p - r - 1, m) warm-up forwards, alternates F and B, drains its Bs (the
    core builds it: the same table as its generated problems')."""
    p, m = _counts(ranks, microbatches)
    offset, stage, kind, micro = _core.one_f_one_b(ranks=p, microbatches=m)
    actions = [Action(g, ACTION_KINDS[k], mb) for g, k, mb in zip(stage.tolist(), kind.tolist(), micro.tolist())]
    return {r: actions[offset[r]:offset[r + 1]] for r in range(p)}


def interleaved_warmup(ranks: int, microbatches: int, chunks: int) -> list[int]:
    """Megatron's warm-up forwards per rank: (v - 1) * round + 2 * (p - 1 - r), at most m * v."""
    p, m, v = ranks, microbatches, chunks
    per_round = m // max(1, m // p)
    return [min((v - 1) * per_round + 2 * (p - 1 - r), m * v) for r in range(p)]


def interleaved_1f1b(ranks: int, microbatches: int, chunks: int,
                     warmup: int | Sequence[int] | None = None) -> Table:
    """Interleaved 1F1B with ``chunks`` model chunks per rank (stage = rank + chunk * ranks).

    ``warmup`` overrides the warm-up forwards: one count for every rank or one per rank
    (Optimus' warm-up adjustment); the default is Megatron's count (:func:`interleaved_warmup`).
    """
    v = integer(chunks, "chunks", minimum=1)
    p, m = _counts(ranks, microbatches, v)
    total = m * v
    if warmup is None:
        warm = interleaved_warmup(p, m, v)
    else:
        warm = [warmup] * p if isinstance(warmup, int) else list(warmup)
        if len(warm) != p:
            raise ValueError(f"warmup: {len(warm)} counts for {p} ranks")
        for r, w in enumerate(warm):
            integer(w, f"warmup[{r}]", minimum=0, maximum=total)
    per_round = m // max(1, m // p)
    table: Table = {}
    for r in range(p):
        w = warm[r]
        fcount, bcount = [0] * v, [0] * v
        row: list[Action | None] = []

        def forward(step: int) -> None:
            local = (step // per_round) % v
            row.append(Action(local * p + r, "F", fcount[local]))
            fcount[local] += 1

        def backward(step: int) -> None:
            local = v - 1 - ((step - w) // per_round) % v
            row.append(Action(local * p + r, "B", bcount[local]))
            bcount[local] += 1

        for step in range(total):
            forward(step)
            if step >= w:
                backward(step)
        for step in range(total, total + w):
            backward(step)
        table[r] = row
    return table


def zb_h1(ranks: int, microbatches: int) -> Table:
    """Zero-bubble H1: 1F1B with each backward split in I and W; rank r defers r of its Ws
    into the cool-down, where 1F1B idles."""
    p, m = _counts(ranks, microbatches, 1, 3)
    table: Table = {}
    for r in range(p):
        warm = min(p - r - 1, m)
        row: list[Action | None] = [Action(r, "F", k) for k in range(warm)]
        w_next = 0
        for k in range(m - warm):
            row += [Action(r, "F", warm + k), Action(r, "I", k)]
            if k >= r:
                row.append(Action(r, "W", w_next))
                w_next += 1
        for k in range(m - warm, m):
            row.append(Action(r, "I", k))
            if w_next < m:
                row.append(Action(r, "W", w_next))
                w_next += 1
        row += [Action(r, "W", k) for k in range(w_next, m)]
        table[r] = row
    return table


def zbv(ranks: int, microbatches: int) -> Table:
    """ZBV zero bubble (torch's ``ScheduleZBVZeroBubble`` order): rank r holds stages r and
    2p - 1 - r in a V, backwards split in I and W.

    Rank r idles r steps, runs 2(p - r) - 1 forwards of its first stage, r pairs of forwards (second
    stage, first stage), p - r triples F, I, W of its second stage, then alternates (F, I, W) of
    the first and second stages and drains with I and W. The order is built for max(2p - 1, m)
    microbatches; actions of microbatches >= m become idle steps (``None``), as in torch.
    """
    p, m = _counts(ranks, microbatches, 2, 3)
    n = max(2 * p - 1, m)
    _counts(p, n, 2, 3)  # the V is built for n >= 2p - 1 microbatches
    table: Table = {}
    for r in range(p):
        first, second = r, 2 * p - 1 - r
        ops: list[tuple[int, str, int] | None] = [None] * r
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (p - r) - 1):
            ops.append((first, "F", f0))
            f0 += 1
        for _ in range(r):
            ops += [(second, "F", f1), (first, "F", f0)]
            f0, f1 = f0 + 1, f1 + 1
        for _ in range(p - r):
            ops += [(second, "F", f1), (second, "I", b1), (second, "W", b1)]
            f1, b1 = f1 + 1, b1 + 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                ops.append((first, "F", f0))
                f0 += 1
            ops += [(first, "I", b0), (first, "W", b0), (second, "F", f1), (second, "I", b1), (second, "W", b1)]
            b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
        w0, w1 = b0, b1
        for _ in range(r):
            ops += [(first, "I", b0), (second, "I", b1)]
            b0, b1 = b0 + 1, b1 + 1
        for _ in range(p - r):
            ops += [(first, "I", b0), (first, "W", w0)]
            b0, w0 = b0 + 1, w0 + 1
        ops += [(second, "W", k) for k in range(w1, b1)]
        ops += [(first, "W", k) for k in range(w0, b0)]
        table[r] = [None if op is None or op[2] >= m else Action(*op) for op in ops]
    return table


def build_table(name: str, ranks: int, microbatches: int, chunks: int = 1,
                warmup: int | Sequence[int] | None = None) -> Table:
    """The table of a named schedule (one of :data:`NAMES`)."""
    one_of(name, NAMES, "schedule")
    if warmup is not None and name != "interleaved_1f1b":
        raise ValueError(f"warmup: {warmup!r} applies only to interleaved_1f1b, not {name}")
    if name == "interleaved_1f1b":
        return interleaved_1f1b(ranks, microbatches, chunks, warmup)
    expected = 2 if name == "zbv" else 1
    if chunks not in (1, expected):
        raise ValueError(f"chunks: {chunks!r} is not {expected} for {name}")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb_h1": zb_h1, "zbv": zbv}[name](ranks, microbatches)


def load_csv(path: str | os.PathLike[str]) -> Table:
    """Reads a table in the CSV form of torch's ``_load_csv``: one row per rank, one action per
    cell, an empty cell for an idle step."""
    with open(path, newline="") as f:
        rows = [[cell.strip() or None for cell in row] for row in csv.reader(f)]
    return check_table(rows)


def save_csv(table: Table, path: str | os.PathLike[str]) -> None:
    """Writes a table in the CSV form :func:`load_csv` and torch's ``_load_csv`` read (torch's
    ``_PipelineScheduleRuntime`` then runs it as a custom schedule)."""
    rows = check_table(table)
    width = max((len(row) for row in rows.values()), default=0)
    text = "".join(",".join("" if a is None else str(a) for a in row + [None] * (width - len(row))) + "\n"
                   for row in rows.values())
    write_text(path, text)


def check_table(table: TableLike) -> Table:
    """A user's table as ``{rank: [Action or None]}`` with ranks 0..p-1, actions given as strings
    parsed; ValueError naming the cell. The fields of actions given as :class:`Action` are checked
    by :func:`flatten`, all at once."""
    if isinstance(table, Mapping):
        rows = dict(table)
    elif isinstance(table, Sequence) and not isinstance(table, str):
        rows = dict(enumerate(table))
    else:
        raise ValueError(f"schedule: {shown(table)} is not a schedule name, a table or a CSV path")
    if not rows or sorted(rows, key=repr) != list(range(len(rows))):
        raise ValueError(f"schedule: ranks {shown(sorted(rows, key=repr))} are not 0..p-1")
    out: Table = {}
    for r in range(len(rows)):
        row = rows[r]
        if isinstance(row, str) or not isinstance(row, Sequence):
            raise ValueError(f"schedule[{r}]: {shown(row)} is not a list of actions")
        if set(map(type, row)) <= _CELL_TYPES:  # actions and idle steps, looked at in C
            out[r] = list(row)
        else:
            out[r] = [a if a is None or type(a) is Action else Action.parse(a, f"schedule[{r}][{i}]")
                      for i, a in enumerate(row)]
    return out


_CELL_TYPES = {Action, type(None)}


def _well_formed(a: object) -> bool:
    """Whether an Action's fields are what :meth:`Action.parse` would give."""
    return (type(a) is Action and isinstance(a.stage, int) and isinstance(a.microbatch, int)
            and a.kind in ACTION_KINDS and 0 <= a.stage < _INT32_MAX and 0 <= a.microbatch < _INT32_MAX)


def flatten(table: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A checked table as flat arrays: row offsets, and per action its stage, kind index (in
    :data:`ACTION_KINDS`) and microbatch, idle steps dropped. The actions' fields are checked here
    with NumPy; ValueError naming the first bad cell."""
    offset = np.zeros(len(table) + 1, np.int64)
    actions: list[Action] = []
    for r in range(len(table)):
        actions += [a for a in table[r] if a is not None]
        offset[r + 1] = len(actions)
    if not actions:
        return offset, np.zeros(0, np.int32), np.zeros(0, np.uint8), np.zeros(0, np.int32)
    stage, kind, micro = zip(*actions)  # one pass in C over the tuples
    try:
        letters = "".join(kind).encode("ascii")
        numbers = np.array((stage, micro))
    except (TypeError, UnicodeEncodeError, ValueError, OverflowError):
        letters, numbers = b"", np.zeros(0)
    if (len(letters) != len(actions) or numbers.dtype.kind not in "iu" or not np.isin(
            np.frombuffer(letters, np.uint8), _KIND_LETTERS).all() or numbers.min() < 0 or numbers.max() >= _INT32_MAX):
        for r in range(len(table)):  # the slow path names the first bad cell
            for i, a in enumerate(table[r]):
                if a is not None and not _well_formed(a):
                    Action.parse(str(a) if isinstance(a, Action) else a, f"schedule[{r}][{i}]")
    code = _KIND_CODE[np.frombuffer(letters, np.uint8)]
    return offset, numbers[0].astype(np.int32), code, numbers[1].astype(np.int32)


__all__ = ["ACTION_KINDS", "NAMES", "Action", "Table", "TableLike", "build_table", "check_table", "flatten", "gpipe",
           "interleaved_1f1b", "interleaved_warmup", "load_csv", "one_f_one_b", "save_csv", "zb_h1", "zbv"]
