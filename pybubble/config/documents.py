"""pybubble's versioned JSON documents (a ``format`` key names the format and its version): reading
with errors that name the file and the field, and writing atomically.

Every file pybubble writes (documents, traces, plots) goes through :func:`replacing`: the bytes go
to a temporary file in the same folder, which then replaces the target in one rename, so a write
that fails part-way (disk full, a size limit) leaves the file that was there whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

PathOrDict = str | os.PathLike[str] | Mapping[str, Any]
"""A document given as the path of a JSON file or as an already parsed mapping."""

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once, at import: files written get the usual mode, not mkstemp's 0600


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


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yields a temporary path in `path`'s folder to write to; on success it replaces `path` in one
    rename, on failure it is removed and `path` is left as it was."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Writes `text` to `path` atomically (see :func:`replacing`)."""
    with replacing(path) as tmp:
        Path(tmp).write_text(text)


def write_document(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Writes `doc` as JSON, atomically (floats written exactly, so a round trip loses nothing).
    A value that is not finite is refused: what pybubble writes is always standard JSON."""
    try:
        text = json.dumps(doc, indent=1, allow_nan=False)
    except ValueError:
        raise ValueError(f"{path}: the document holds a number that is not finite (not JSON)") from None
    write_text(path, text + "\n")


__all__ = ["PathOrDict", "read_document", "replacing", "write_document", "write_text"]
