"""Chrome trace JSON (opens in the Perfetto UI) of a simulated LLM step: one track of ops and one
track of bubbles per pipeline stage. Times are microseconds, as Chrome traces expect."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .timeline import Timeline


def trace_events(timeline: "Timeline") -> list[dict[str, Any]]:
    """The trace's events: "X" slices for ops (named by their action, like "3F1") and bubbles (named by kind)."""
    events: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "LLM step"}}]
    for s in range(timeline.stages):
        for tid, label in ((2 * s, f"stage {s} ops"), (2 * s + 1, f"stage {s} bubbles")):
            events.append({"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": label}})
            events.append({"ph": "M", "pid": 0, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for op in timeline.ops:
        events.append({"ph": "X", "pid": 0, "tid": 2 * op.stage, "cat": "op", "ts": op.start,
                       "dur": op.end - op.start, "name": f"{op.stage_index}{op.kind}{op.microbatch}",
                       "args": {"chunk": op.chunk, "microbatch": op.microbatch, "stage_index": op.stage_index}})
    for b in timeline.bubbles:
        events.append({"ph": "X", "pid": 0, "tid": 2 * b.stage + 1, "cat": "bubble", "ts": b.start,
                       "dur": b.end - b.start, "name": b.kind})
    return events


def write_trace(timeline: "Timeline", path: str | os.PathLike[str]) -> None:
    """Writes the timeline as a Chrome trace JSON file."""
    with open(path, "w") as f:
        json.dump({"traceEvents": trace_events(timeline), "displayTimeUnit": "ms"}, f)
