"""Pipeline schedules as action tables in torch.distributed.pipelining's format.

A table maps each pipeline rank to its list of actions in order: ``"0F1"`` is stage 0's forward of
microbatch 1; ``B`` a full backward, ``I`` the input-gradient backward, ``W`` the weight-gradient
backward; ``None`` is an idle step. Stages are global (``rank + chunk * ranks`` for the
interleaved schedule, ``rank`` and ``2 * ranks - 1 - rank`` for zbv).
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Mapping, Sequence
from typing import Union

import numpy as np

Table = dict[int, list[Union[str, None]]]
TableLike = Union[Mapping[int, Sequence[Union[str, None]]], Sequence[Sequence[Union[str, None]]]]

KINDS = ("F", "B", "I", "W")
NAMES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv")
_ACTION = re.compile(r"^([0-9]+)([FBIW])([0-9]+)$")
_ROW = re.compile(r"(?:[0-9]+[FBIW][0-9]+)(?:,[0-9]+[FBIW][0-9]+)*")
_LETTERS_ONLY = str.maketrans("", "", "0123456789,")
_LETTER_TO_COMMA = str.maketrans("FBIW", ",,,,")
_INT32_MAX = 2**31 - 1
_KIND_CODE = np.zeros(256, np.uint8)  # ASCII letter -> index in KINDS
_KIND_CODE[[ord(k) for k in KINDS]] = np.arange(4, dtype=np.uint8)


def parse_action(text: str, where: str = "action") -> tuple[int, int, int]:
    """``"3F12"`` -> (stage 3, kind index of F, microbatch 12); ValueError naming ``where``."""
    found = _ACTION.match(text.strip()) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{where}: {text!r} is not an action like '0F1' (stage, F/B/I/W, microbatch)")
    return int(found.group(1)), KINDS.index(found.group(2)), int(found.group(3))


def _positive(value: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: {value!r} is not an integer >= 1")
    return value


def gpipe(stages: int, microbatches: int) -> Table:
    """All forwards, then all backwards."""
    p, m = _positive(stages, "stages"), _positive(microbatches, "microbatches")
    return {r: [f"{r}F{k}" for k in range(m)] + [f"{r}B{k}" for k in range(m)] for r in range(p)}


def one_f_one_b(stages: int, microbatches: int) -> Table:
    """1F1B: rank r runs min(p - r - 1, m) warm-up forwards, alternates F and B, drains its Bs."""
    p, m = _positive(stages, "stages"), _positive(microbatches, "microbatches")
    table: Table = {}
    for r in range(p):
        warm = min(p - r - 1, m)
        row: list[str | None] = [f"{r}F{k}" for k in range(warm)]
        for k in range(m - warm):
            row += [f"{r}F{warm + k}", f"{r}B{k}"]
        row += [f"{r}B{k}" for k in range(m - warm, m)]
        table[r] = row
    return table


def interleaved_warmup(stages: int, microbatches: int, chunks: int) -> list[int]:
    """Megatron's warm-up forwards per rank: (v - 1) * round + 2 * (p - 1 - r), at most m * v."""
    p, m, v = stages, microbatches, chunks
    per_round = m // max(1, m // p)
    return [min((v - 1) * per_round + 2 * (p - 1 - r), m * v) for r in range(p)]


def interleaved_1f1b(stages: int, microbatches: int, chunks: int,
                     warmup: int | Sequence[int] | None = None) -> Table:
    """Interleaved 1F1B with ``chunks`` model chunks per rank (stage = rank + chunk * stages).

    ``warmup`` overrides the warm-up forwards: one count for every rank or one per rank
    (Optimus' warm-up adjustment); the default is Megatron's count (:func:`interleaved_warmup`).
    """
    p, m, v = _positive(stages, "stages"), _positive(microbatches, "microbatches"), _positive(chunks, "chunks")
    total = m * v
    if warmup is None:
        warm = interleaved_warmup(p, m, v)
    else:
        warm = [warmup] * p if isinstance(warmup, int) else list(warmup)
        if len(warm) != p:
            raise ValueError(f"warmup: {len(warm)} counts for {p} stages")
        for r, w in enumerate(warm):
            if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= total:
                raise ValueError(f"warmup[{r}]: {w!r} is not an integer in 0..{total} (microbatches * chunks)")
    per_round = m // max(1, m // p)
    table: Table = {}
    for r in range(p):
        w = warm[r]
        fcount, bcount = [0] * v, [0] * v
        row: list[str | None] = []

        def forward(step: int) -> None:
            local = (step // per_round) % v
            row.append(f"{local * p + r}F{fcount[local]}")
            fcount[local] += 1

        def backward(step: int) -> None:
            local = v - 1 - ((step - w) // per_round) % v
            row.append(f"{local * p + r}B{bcount[local]}")
            bcount[local] += 1

        for step in range(total):
            forward(step)
            if step >= w:
                backward(step)
        for step in range(total, total + w):
            backward(step)
        table[r] = row
    return table


def zb_h1(stages: int, microbatches: int) -> Table:
    """Zero-bubble H1: 1F1B with each backward split in I and W; rank r defers r of its Ws
    into the cool-down, where 1F1B idles."""
    p, m = _positive(stages, "stages"), _positive(microbatches, "microbatches")
    table: Table = {}
    for r in range(p):
        warm = min(p - r - 1, m)
        row: list[str | None] = [f"{r}F{k}" for k in range(warm)]
        w_next = 0
        for k in range(m - warm):
            row += [f"{r}F{warm + k}", f"{r}I{k}"]
            if k >= r:
                row.append(f"{r}W{w_next}")
                w_next += 1
        for k in range(m - warm, m):
            row.append(f"{r}I{k}")
            if w_next < m:
                row.append(f"{r}W{w_next}")
                w_next += 1
        row += [f"{r}W{k}" for k in range(w_next, m)]
        table[r] = row
    return table


def zbv(stages: int, microbatches: int) -> Table:
    """ZBV zero bubble (torch's ``ScheduleZBVZeroBubble`` order): rank r holds stages r and
    2p - 1 - r in a V, backwards split in I and W.

    Rank r idles r steps, runs 2(p - r) - 1 forwards of its first stage, r pairs of forwards (second
    stage, first stage), p - r triples F, I, W of its second stage, then alternates (F, I, W) of
    the first and second stages and drains with I and W. The order is built for max(2p - 1, m)
    microbatches; actions of microbatches >= m become idle steps (``None``), as in torch.
    """
    p, m = _positive(stages, "stages"), _positive(microbatches, "microbatches")
    n = max(2 * p - 1, m)
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
        table[r] = [None if op is None or op[2] >= m else f"{op[0]}{op[1]}{op[2]}" for op in ops]
    return table


def build_table(name: str, stages: int, microbatches: int, chunks: int = 1,
                warmup: int | Sequence[int] | None = None) -> Table:
    """The table of a named schedule (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise ValueError(f"schedule: {name!r} is not one of {', '.join(NAMES)}")
    if warmup is not None and name != "interleaved_1f1b":
        raise ValueError(f"warmup: {warmup!r} applies only to interleaved_1f1b, not {name}")
    if name == "interleaved_1f1b":
        return interleaved_1f1b(stages, microbatches, chunks, warmup)
    expected = 2 if name == "zbv" else 1
    if chunks not in (1, expected):
        raise ValueError(f"chunks: {chunks!r} is not {expected} for {name}")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb_h1": zb_h1, "zbv": zbv}[name](stages, microbatches)


def load_csv(path: str | os.PathLike[str]) -> Table:
    """Reads a table in the CSV form of torch's ``_load_csv``: one row per rank, one action per
    cell, an empty cell for an idle step."""
    with open(path, newline="") as f:
        return {r: [cell.strip() or None for cell in row] for r, row in enumerate(csv.reader(f))}


def check_table(table: TableLike) -> Table:
    """A user's table as ``{rank: [action or None]}`` with ranks 0..p-1; ValueError naming the cell."""
    if isinstance(table, Mapping):
        rows = dict(table)
    elif isinstance(table, Sequence) and not isinstance(table, str):
        rows = dict(enumerate(table))
    else:
        raise ValueError(f"schedule: {table!r} is not a schedule name, a table or a CSV path")
    if sorted(rows) != list(range(len(rows))) or not rows:
        raise ValueError(f"schedule: ranks {sorted(rows)!r} are not 0..p-1")
    out: Table = {}
    for r in range(len(rows)):
        row = rows[r]
        if isinstance(row, str) or not isinstance(row, Sequence):
            raise ValueError(f"schedule[{r}]: {row!r} is not a list of actions")
        out[r] = list(row)
    return out


def flatten(table: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The table as flat arrays: row offsets, and per action its stage, kind index and microbatch
    (idle steps dropped). ValueError naming the cell of a malformed action.

    Each row is checked with one regex pass over its joined actions; the numbers and letters are
    then split out of the whole table's text by NumPy, with no Python object per action.
    """
    offset, parts = [0], []
    for r in range(len(table)):
        row = table[r]
        cells = [a for a in row if a is not None]
        try:
            joined = ",".join(cells)
        except TypeError:
            joined = None
        # A cell holding a comma would pass the row pattern as two actions: count the commas too.
        if cells and (joined is None or _ROW.fullmatch(joined) is None or joined.count(",") != len(cells) - 1):
            actions = [parse_action(a, f"schedule[{r}][{i}]") for i, a in enumerate(row) if a is not None]
            joined = ",".join(f"{g}{KINDS[k]}{mb}" for g, k, mb in actions)  # tolerated spaces dropped
        if cells:
            parts.append(joined)
        offset.append(offset[-1] + len(cells))
    text = ",".join(parts)
    kind = _KIND_CODE[np.frombuffer(text.translate(_LETTERS_ONLY).encode("ascii"), np.uint8)]
    numbers = text.translate(_LETTER_TO_COMMA).split(",") if text else []
    try:
        pairs = np.array(numbers, dtype=np.int64).reshape(-1, 2)
        too_large = bool(numbers) and int(pairs.max()) >= _INT32_MAX
    except OverflowError:
        too_large = True
    if too_large:  # name the first action whose stage or microbatch does not fit in int32
        i = next(i for i in range(len(numbers) // 2) if max(int(numbers[2 * i]), int(numbers[2 * i + 1])) >= _INT32_MAX)
        r = next(r for r in range(len(offset) - 1) if offset[r] <= i < offset[r + 1])
        raise ValueError(f"schedule[{r}]: '{numbers[2 * i]}{KINDS[kind[i]]}{numbers[2 * i + 1]}' has a stage or "
                         "microbatch of 2**31 - 1 or more")
    return (np.array(offset, np.int64), pairs[:, 0].astype(np.int32), kind, pairs[:, 1].astype(np.int32))
