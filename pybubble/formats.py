"""Reading and writing pybubble's versioned JSON documents, with errors that name the field."""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

PathOrDict = str | os.PathLike[str] | Mapping[str, Any]


def read_document(source: PathOrDict, fmt: str) -> Mapping[str, Any]:
    """Returns the document at `source` (a path to a JSON file, or an already parsed mapping),
    checking that its ``format`` key is `fmt`."""
    if isinstance(source, Mapping):
        doc = source
    else:
        path = Path(source)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise ValueError(f"{path}: no such file") from None
        except OSError as e:
            raise ValueError(f"{path}: cannot read: {e.strerror}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    got = doc.get("format")
    if got != fmt:
        raise ValueError(f"format: {got!r} is not {fmt!r}")
    return doc


def write_document(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Writes `doc` as JSON (floats written exactly, so a round trip loses nothing)."""
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def field(doc: Mapping[str, Any], key: str, where: str) -> Any:
    """`doc[key]`, or a ValueError naming `where.key` when it is missing."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(doc).__name__}")
    if key not in doc:
        raise ValueError(f"{where + '.' if where else ''}{key}: missing")
    return doc[key]


def number(value: Any, where: str) -> float:
    """`value` as a float; a ValueError naming `where` for anything but a real number (NumPy
    scalars included, bools excluded)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: {value!r} is not a number")
    return float(value)


def finite(value: Any, where: str) -> float:
    """`value` as a finite float."""
    v = number(value, where)
    if not math.isfinite(v):
        raise ValueError(f"{where}: {value!r} is not a finite number")
    return v


def integer(value: Any, where: str) -> int:
    """`value` as an int (NumPy integers included); a ValueError naming `where` for anything else
    (bools included)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{where}: {value!r} is not an integer")
    return int(value)


def array(value: Any, where: str) -> list[Any]:
    """`value` as a list; a ValueError naming `where` otherwise."""
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    return value
