"""The data options of every command and trainer that draws MLLM data, with one meaning each
wherever they appear: ``--data NAME`` picks a named source (:data:`SOURCES`: each command offers the
ones it can draw), ``--data-file FILE`` replays a user's samples instead; the two are one mutually
exclusive group (:func:`add_data_options`), and :func:`data_source` turns what was given into the
source to draw from::

    add_data_options(parser, ("fixed", "mix"), default="fixed", file_use="replayed in order")
    args = parser.parse_args()
    source = data_source(args, tokens_per_tile=256)   # None, a MixSpec or Samples
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .files import read_samples
from .mix import MixSpec, NativeMixSpec
from .samples import TOKENS_PER_TILE, Samples

SOURCES = {
    "workload": "images per sample from the config (one replica, as before)",
    "fixed": "one image per sample, the same shape every step",
    "mix": "an open VLM's training mix as tiles over data-parallel replicas (docs/dynamic.md)",
    "native": "the same mix at native resolution, images in pixels over data-parallel replicas (docs/dynamic.md)",
}
"""The named data sources --data offers, each with what it means wherever it is offered (its help):
``workload``, the config's synthetic token workload (:mod:`pybubble.data.workloads`); ``fixed``,
one image per sample, the same shape every step; ``mix``, the seeded open-VLM mix
(:mod:`pybubble.data.mix`); ``native``, that mix at native resolution (:class:`~pybubble.data.mix.NativeMixSpec`)."""
DATA_FILE = 'JSON lines, one sample each: {"tiles": [t1, t2, ...], "text": N}'
"""What --data-file reads (:func:`pybubble.data.files.read_samples`), the start of its help."""
FILE_SOURCE = "file"
"""The name of the source --data-file gives (:func:`data_name`), beside the names of :data:`SOURCES`."""


def add_data_options(parser: argparse.ArgumentParser, sources: Sequence[str], *, default: str,
                     file_use: str) -> None:
    """Adds ``--data NAME`` (`sources`: the names of :data:`SOURCES` the command draws; `default`
    one of them) and ``--data-file FILE`` (its help: :data:`DATA_FILE`, then `file_use`: how the
    command draws the file's samples) to `parser` as one mutually exclusive group."""
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise ValueError(f"sources: {', '.join(map(repr, unknown))} not among {', '.join(SOURCES)}")
    if default not in sources:
        raise ValueError(f"default: {default!r} is not one of {', '.join(sources)}")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--data", choices=tuple(sources), default=default,
                       help="; ".join(f"{name}: {SOURCES[name]}" for name in sources))
    group.add_argument("--data-file", metavar="FILE", help=f"{DATA_FILE}, {file_use}")


def data_name(args: argparse.Namespace) -> str:
    """The source the parsed options name: :data:`FILE_SOURCE` with --data-file, else --data's name."""
    return FILE_SOURCE if args.data_file is not None else args.data


def data_source(args: argparse.Namespace, *, tokens_per_tile: int = TOKENS_PER_TILE, max_tiles: int | None = None,
                max_tokens: int | None = None, mix: MixSpec | None = None
                ) -> MixSpec | NativeMixSpec | Samples | None:
    """The source the parsed options name: the data file's samples with --data-file (read with
    `tokens_per_tile`, `max_tiles` and `max_tokens`: :func:`~pybubble.data.files.read_samples`), `mix`
    (default: ``MixSpec()``) with ``--data mix``, and None with ``workload`` or ``fixed`` (the data
    the caller makes itself)."""
    name = data_name(args)
    if name == FILE_SOURCE:
        return read_samples(args.data_file, tokens_per_tile=tokens_per_tile, max_tiles=max_tiles,
                            max_tokens=max_tokens)
    if name == "mix":
        return mix if mix is not None else MixSpec()
    if name == "native":
        return NativeMixSpec()
    return None
