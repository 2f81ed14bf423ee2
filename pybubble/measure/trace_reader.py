"""Chrome traces (``torch.profiler``'s, pybubble's own timelines) read as a stream, whatever their
size: a trace of one step of a large pipeline on GPUs is often gigabytes, so it is never read
whole (nor held to the size limit of pybubble's documents). Every reader of traces uses this::

    trace = Trace("rank0.pt.trace.json.gz")
    for event in trace.events():       # each entry of traceEvents, a dict, in file order
        ...
    trace.fields["distributedInfo"]    # the top-level fields asked for, once events() is done

A file is JSON, plain or gzipped (told by its first bytes, whatever its name), holding either an
object with ``traceEvents`` (torch.profiler's form) or a bare list of events. Memory is bounded by
what the caller keeps of the events; time is linear in the file's size. A file that is missing,
empty, truncated, not gzip or JSON, or of another shape is a ``ValueError`` naming the file, raised
by :meth:`Trace.events` when it gets there.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np

from ..config.limits import MAX_NESTING

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip file."""
TRACE_FIELDS = ("distributedInfo",)
"""The top-level fields :class:`Trace` keeps by default: torch.profiler's ``distributedInfo``
(``rank``, ``world_size``, ``backend``) of the process that wrote the trace."""


def file_rank(path: str | os.PathLike[str], rank: int | None, index: int) -> int:
    """The rank of the trace at `path`: `rank` (its ``distributedInfo``'s) when known, else the N of
    a ``rank<N>`` in its file name, else `index` (its place among the files read)."""
    if rank is not None:
        return rank
    m = re.search(r"rank[_-]?(\d+)", Path(path).name)
    return int(m.group(1)) if m else index


class Trace:
    """One Chrome trace file, read as a stream (see the module's note)."""

    def __init__(self, path: str | os.PathLike[str], fields: Sequence[str] = TRACE_FIELDS):
        self.path = Path(path)
        """The file."""
        self.wanted = tuple(fields)
        """The top-level fields to keep."""
        self.fields: dict[str, Any] = {}
        """The top-level fields of :attr:`wanted` the file holds, filled by :meth:`events` (complete
        once it is exhausted)."""
        if not self.path.is_file():
            raise ValueError(f"{self.path}: no such file" if not self.path.exists() else f"{self.path}: not a file")

    @property
    def gzipped(self) -> bool:
        """Whether the file is gzip (by its first bytes, not its name)."""
        try:
            with open(self.path, "rb") as f:
                return f.read(2) == GZIP_MAGIC
        except OSError as e:
            raise ValueError(f"{self.path}: cannot read: {e.strerror}") from None

    def _open(self) -> "_Nesting":
        return _Nesting(gzip.open(self.path, "rb") if self.gzipped else open(self.path, "rb"), self.path)

    def events(self) -> Iterator[Any]:
        """Each entry of the trace's events in file order (dicts in a well-formed trace: callers
        skip what they do not use). Fills :attr:`fields`: those written before the events in this
        pass (torch.profiler writes ``distributedInfo`` there), those after them in one more pass."""
        self.fields = {}
        try:
            layout = self._head()
            if layout is not None:
                with self._open() as f:
                    yield from ijson.items(f, layout, use_float=True)
                missing = [name for name in self.wanted if name not in self.fields]
                if layout == "traceEvents.item" and missing:
                    for name in missing:
                        with self._open() as f:
                            for value in ijson.items(f, name, use_float=True):
                                self.fields[name] = value
                                break
        except ijson.JSONError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "premature EOF" in first:
                first = "it ends early (truncated)"
            raise ValueError(f"{self.path}: not valid JSON: {first}") from None
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise ValueError(f"{self.path}: not a valid gzip file ({e})") from None
        except OSError as e:
            raise ValueError(f"{self.path}: cannot read: {e.strerror or e}") from None

    def _head(self) -> str | None:
        """Reads the file up to its events: the top-level fields written before them, and the prefix
        of the events (``traceEvents.item`` or ``item``; None for an object without events)."""
        with self._open() as f:
            if not f.read(1):
                raise ValueError(f"{self.path}: empty file (no JSON)")
        with self._open() as f:
            builders: dict[str, ijson.ObjectBuilder] = {}
            for prefix, event, value in ijson.parse(f, use_float=True):
                if prefix == "" and event == "start_array":
                    return "item"
                if prefix == "traceEvents" and event == "start_array":
                    return "traceEvents.item"
                if prefix == "" and event not in ("start_map", "map_key"):  # a scalar at the top, or the object's end
                    break
                name = prefix.split(".", 1)[0]
                if name in self.wanted and prefix:
                    builders.setdefault(name, ijson.ObjectBuilder()).event(event, value)
                    if prefix == name and event in ("end_map", "end_array", "string", "number", "boolean", "null"):
                        self.fields[name] = builders[name].value
        return None


class _Nesting:
    """A binary stream that refuses JSON nested deeper than :data:`MAX_NESTING` as it is read: ijson
    keeps a prefix per open level, so its memory grows with the square of the depth (a 400 kB file
    nested 200,000 deep would take a hundred GB). The depth is tracked outside strings (escapes
    included), a chunk at a time with NumPy."""

    def __init__(self, raw: IO[bytes], path: Path):
        self.raw, self.path = raw, path
        self.depth, self.in_string, self.backslashes = 0, False, 0

    def read(self, size: int = -1) -> bytes:
        """The next bytes of the stream, checked."""
        chunk = self.raw.read(size)
        if chunk:
            self._scan(chunk)
        return chunk

    def _scan(self, chunk: bytes) -> None:
        b = np.frombuffer(chunk, np.uint8)
        quotes = np.flatnonzero(b == 0x22)
        escaped = np.zeros(len(quotes), bool)
        if len(quotes) and ((b[np.maximum(quotes - 1, 0)] == 0x5C).any() or (quotes[0] == 0 and self.backslashes)):
            # a quote is escaped by an odd run of backslashes before it (runs may start in the last chunk)
            last_other = np.maximum.accumulate(np.where(b != 0x5C, np.arange(len(b)), -1))
            before = np.where(quotes > 0, last_other[np.maximum(quotes - 1, 0)], -1)
            run = quotes - 1 - before + np.where(before < 0, self.backslashes, 0)
            escaped = run % 2 == 1
        real = quotes[~escaped]
        brackets = np.flatnonzero((b == 0x5B) | (b == 0x7B) | (b == 0x5D) | (b == 0x7D))
        outside = brackets[(np.searchsorted(real, brackets) + self.in_string) % 2 == 0]
        if len(outside):
            levels = self.depth + np.cumsum(np.where((b[outside] == 0x5B) | (b[outside] == 0x7B), 1, -1))
            if levels.max() > MAX_NESTING:
                raise ValueError(f"{self.path}: nested deeper than the limit of {MAX_NESTING} levels")
            self.depth = int(levels[-1])
        self.in_string = (self.in_string + len(real)) % 2 == 1
        trail = len(chunk) - len(chunk.rstrip(b"\\"))
        self.backslashes = trail + (self.backslashes if trail == len(chunk) else 0)

    def __enter__(self) -> "_Nesting":
        return self

    def __exit__(self, *exc: object) -> None:
        self.raw.close()


__all__ = ["GZIP_MAGIC", "TRACE_FIELDS", "Trace", "file_rank"]
