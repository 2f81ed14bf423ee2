"""pybubble's files: versioned JSON documents (a ``format`` key names the format and its version)
and YAML configs, read within the limits of :mod:`pybubble.config.limits` with one-line errors that
name the file, and written atomically.

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

import yaml

from .checks import shown
from .limits import MAX_DOCUMENT_BYTES, MAX_NESTING, MAX_YAML_ALIASES

PathOrDict = str | os.PathLike[str] | Mapping[str, Any]
"""A document given as the path of a JSON file or as an already parsed mapping."""

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once, at import: files written get the usual mode, not mkstemp's 0600


def read_text(path: str | os.PathLike[str]) -> str:
    """The text of the file at `path`: at most :data:`MAX_DOCUMENT_BYTES`, UTF-8."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"source: {shown(path)} is not a file path or a parsed document")
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{path}: larger than the limit of {MAX_DOCUMENT_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def check_nesting(doc: Any, where: str) -> None:
    """A ValueError when `doc` nests lists and mappings deeper than :data:`MAX_NESTING`. Walked
    without recursion, each container once: subtrees shared through YAML aliases (or a structure
    that contains itself) cost their size once, not once per reference."""
    stack = [(doc, 1)]
    visited: set[int] = set()
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children = list(node.values())
        elif isinstance(node, list):
            children = node
        else:
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        if depth > MAX_NESTING:
            raise ValueError(f"{where}: nested deeper than the limit of {MAX_NESTING} levels")
        stack.extend((child, depth + 1) for child in children)


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON value in the file at `path` (see :func:`read_text` and :func:`check_nesting`)."""
    text = read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested deeper than the limit of {MAX_NESTING} levels") from None
    check_nesting(doc, str(path))
    return doc


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The YAML value in the file at `path`, read safely (``yaml.safe_load``): no tags that build
    objects, at most :data:`MAX_YAML_ALIASES` aliases, nesting within :data:`MAX_NESTING`."""
    text = read_text(path)
    try:
        aliases = sum(isinstance(token, yaml.AliasToken) for token in yaml.scan(text, Loader=yaml.SafeLoader))
        if aliases > MAX_YAML_ALIASES:
            raise ValueError(f"{path}: {aliases} YAML aliases, more than the limit of {MAX_YAML_ALIASES}")
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path}: not valid YAML: {problem}{where}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested deeper than the limit of {MAX_NESTING} levels") from None
    check_nesting(doc, str(path))
    return doc


@contextlib.contextmanager
def naming(source: Any) -> Iterator[None]:
    """Prefixes the message of a ValueError raised inside with the file `source`, when it is a
    path (errors then name the file and the field: ``cfg.yaml: llm.layers: -1 is not ...``)."""
    try:
        yield
    except ValueError as e:
        if isinstance(source, (str, os.PathLike)) and not str(e).startswith(f"{os.fspath(source)}:"):
            raise ValueError(f"{os.fspath(source)}: {e}") from None
        raise


def read_document(source: PathOrDict, fmt: str) -> Mapping[str, Any]:
    """Returns the document at `source` (a path to a JSON file, or an already parsed mapping),
    checking that its ``format`` key is `fmt`."""
    if isinstance(source, Mapping):
        doc = source
        check_nesting(doc, "document")
    else:
        doc = read_json(source)
        if not isinstance(doc, Mapping):
            raise ValueError(f"{source}: expected a JSON object, got {type(doc).__name__}")
    got = doc.get("format")
    if got != fmt:
        with naming(source):
            raise ValueError(f"format: {shown(got)} is not {fmt!r}")
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


__all__ = ["PathOrDict", "check_nesting", "naming", "read_document", "read_json", "read_text", "read_yaml", "replacing",
           "write_document", "write_text"]
