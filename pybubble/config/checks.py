"""Argument checks, in one place: every public function and every loader of pybubble checks its
input with these and raises ``ValueError`` naming the field (``where``) and the bad value.

The value shown in a message is :func:`shown`: a ``repr`` that never expands more than a few
levels, items or digits of it, so an error never prints (or builds) an unbounded value.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SHOWN_CHARS = 80
"""The most characters of a bad value an error message shows."""

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 2, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = SHOWN_CHARS - 20, 30, SHOWN_CHARS - 20


def shown(value: Any) -> str:
    """A short ``repr`` of `value`: nested containers, long strings and huge integers cut with
    "..." (by :mod:`reprlib`, which never builds the whole ``repr``), at most :data:`SHOWN_CHARS`."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a hostile __repr__, or an integer too long to print, must not hide the error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def number(value: Any, where: str) -> float:
    """`value` as a float: any real number (NumPy scalars included, bools excluded)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: {shown(value)} is not a number")
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        raise ValueError(f"{where}: {shown(value)} is out of range") from None


def finite(value: Any, where: str, minimum: float | None = None) -> float:
    """`value` as a finite float, at least `minimum` when given."""
    v = number(value, where)
    if not math.isfinite(v) or (minimum is not None and v < minimum):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{where}: {shown(value)} is not a finite number{bound}")
    return v


def positive(value: Any, where: str) -> float:
    """`value` as a finite float > 0."""
    v = number(value, where)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{where}: {shown(value)} is not a finite number > 0")
    return v


INT64 = (-(2**63), 2**63 - 1)
"""The range of every integer pybubble reads: its arrays and the core hold integers as int64."""


def _integral(value: Any, where: str) -> int:
    """`value` as a Python int (NumPy integers included, bools excluded), of any size."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{where}: {shown(value)} is not an integer")
    return int(value)


def _int64(v: int, value: Any, where: str) -> int:
    """`v` if it fits :data:`INT64`: the one place where an integer of any size is refused before
    it reaches an int64 array or the core (which would raise OverflowError, not ValueError)."""
    if not INT64[0] <= v <= INT64[1]:
        raise ValueError(f"{where}: {shown(value)} is out of range (not a 64-bit integer)")
    return v


def integer(value: Any, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int (NumPy integers included, bools excluded), within [minimum, maximum] and
    within :data:`INT64` (every integer pybubble reads ends in an int64)."""
    v = _integral(value, where)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        if maximum is None:
            want = f">= {minimum}"
        elif minimum is None:
            want = f"<= {maximum}"
        else:
            want = f"in [{minimum}, {maximum}]"
        raise ValueError(f"{where}: {shown(value)} is not an integer {want}")
    return _int64(v, value, where)


def positive_int(value: Any, where: str, limit: int | None = None) -> int:
    """`value` as an int >= 1, and at most `limit` when given (one of :mod:`pybubble.config.limits`)
    and within :data:`INT64`."""
    v = _integral(value, where)
    if v < 1:
        raise ValueError(f"{where}: {shown(value)} is not a positive integer")
    if limit is not None and v > limit:
        raise ValueError(f"{where}: {shown(value)} is more than the limit of {limit:,}")
    return _int64(v, value, where)


def flag(value: Any, where: str) -> bool:
    """`value` as a bool (true or false only)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{where}: {shown(value)} is not true or false")
    return bool(value)


def one_of(value: Any, names: Sequence[str], where: str) -> str:
    """`value` if it is one of `names`."""
    if not isinstance(value, str) or value not in names:
        raise ValueError(f"{where}: {shown(value)} is not one of {', '.join(names)}")
    return value


def required(doc: Any, key: str, where: str) -> Any:
    """``doc[key]``; a ValueError naming ``where.key`` when it is missing or `doc` is no mapping."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where or 'document'}: expected an object, got {type(doc).__name__}")
    if key not in doc:
        raise ValueError(f"{where + '.' if where else ''}{key}: missing")
    return doc[key]


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    """`value` if it is a mapping (a JSON object, a YAML mapping)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def array(value: Any, where: str) -> list[Any]:
    """`value` if it is a list (a JSON array)."""
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def known_keys(section: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    """A ValueError naming the first key of `section` that is not in `known`."""
    for key in section:
        if key not in known:
            raise ValueError(f"{where}.{shown(key) if not isinstance(key, str) else key}: unknown key "
                             f"(known: {', '.join(known)})")


def real_array(values: Any, where: str, minimum: float | None = None, positive_values: bool = False,
               ndim: int | None = 1) -> np.ndarray:
    """`values` as a float64 array of finite numbers (>= `minimum`, or > 0 with `positive_values`),
    of `ndim` dimensions when given; a ValueError naming the first bad entry."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: {shown(values)} is not an array of numbers") from None
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise ValueError(f"{where}: {shown(values)} is not an array of numbers")
    arr = arr.astype(np.float64)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{where}: shape {arr.shape} is not {ndim}-dimensional")
    bad = ~np.isfinite(arr)
    if minimum is not None:
        bad |= arr < minimum
    if positive_values:
        bad |= arr <= 0
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        label = ", ".join(map(str, index))
        want = "> 0" if positive_values else (f">= {minimum:g}" if minimum is not None else "")
        raise ValueError(f"{where}[{label}]: {float(arr[index])!r} is not a finite number {want}".rstrip())
    return arr


def index_array(values: Any, where: str, bound: int, shape: tuple[int, ...]) -> np.ndarray:
    """`values` as an int64 array of `shape` with entries in [0, `bound`) (e.g. the replica or the
    sample each item belongs to)."""
    a = np.asarray(values)
    if a.shape != shape or (a.size and (a.dtype.kind not in "iu" or a.min() < 0 or a.max() >= bound)):
        raise ValueError(f"{where}: expected {shape} integers in [0, {bound}), got {a.dtype} of shape {a.shape}")
    return a.astype(np.int64)


def interval(value: Any, where: str) -> tuple[float, float]:
    """`value` as (start, end) finite floats with start < end: a pair of numbers, or a string
    ``"START:END"`` (as typed on a command line)."""
    if isinstance(value, str):
        parts = value.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            value = (float(parts[0]), float(parts[1]))
        except ValueError:
            raise ValueError(f"{where}: {shown(value)} is not START:END (two numbers)") from None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{where}: {shown(value)} is not a (start, end) pair")
    start, end = finite(value[0], f"{where}.start"), finite(value[1], f"{where}.end")
    if not start < end:
        raise ValueError(f"{where}: start {start:g} is not before end {end:g}")
    return start, end


__all__ = ["INT64", "SHOWN_CHARS", "array", "finite", "flag", "index_array", "integer", "interval", "known_keys",
           "mapping", "number", "one_of", "positive", "positive_int", "real_array", "required", "shown"]
