"""What the commands show on the terminal: tables that fit its width, progress on stderr (on a
terminal only), and the summary line for scripts that ends each command's output."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(highlight=False)
"""Where commands print (stdout)."""
status = Console(stderr=True, highlight=False)
"""Where progress goes (stderr: stdout stays clean for pipes)."""

MAX_TABLE_ROWS = 24
"""The most rows a table prints: longer ones show their first and last rows around a "..." row."""


def summary(command: str, **fields: Any) -> None:
    """Prints the summary line ``<command>: key=value ...`` (never wrapped: one line to grep).
    Floats are rounded: times (keys ending in ``_us``, ``_ms``, ``_s``) to 3 decimals, the rest to 4."""
    parts = [f"{k}={round(v, 3 if k.endswith(('_us', '_ms', '_s')) else 4)!r}" if isinstance(v, float) else f"{k}={v}"
             for k, v in fields.items()]
    print(f"{command}: {' '.join(parts)}", flush=True)


@contextlib.contextmanager
def drawing(path: str) -> Iterator[None]:
    """A spinner on stderr while a picture is drawn (on a terminal only)."""
    with status.status(f"drawing {path}") if status.is_terminal else contextlib.nullcontext():
        yield
    console.print(f"wrote {path}")


@contextlib.contextmanager
def progress_bar(what: str, total: int | None = None) -> Iterator[Callable[[int, int | None], None]]:
    """A progress bar on stderr (gone when done; none when stderr is not a terminal); yields
    ``update(done, total)``. It redraws only when updated (no drawing thread), so it does not disturb
    what a benchmark times between updates."""
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=status,
                  transient=True, auto_refresh=False, disable=not status.is_terminal) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done, total=total: bar.update(task, completed=done, total=total, refresh=True)


def table(heading: str | None = None, **kwargs: Any) -> Table:
    """A table in the commands' style (fits the terminal: cells wrap rather than overflow); its
    `heading`, when given, is printed as a line of its own first (it wraps at the terminal's width,
    not at the table's)."""
    if heading:
        console.print(heading)
    return Table(box=box.SIMPLE_HEAVY, show_edge=False, pad_edge=False, collapse_padding=True, **kwargs)


def shown_rows(count: int) -> list[int | None]:
    """The rows of a table of `count` rows to print (None: the "..." between its ends)."""
    if count <= MAX_TABLE_ROWS:
        return list(range(count))
    half = MAX_TABLE_ROWS // 2
    return [*range(half), None, *range(count - half, count)]


def in_ms(us: float) -> str:
    """A time in us as the commands print it: ``1,234.5 ms``."""
    return f"{us / 1000.0:,.1f} ms"
