"""Chrome trace JSON (opens in the Perfetto UI) of a simulated LLM step, with the encoder's
scheduled kernels when given: one process per pipeline stage, with a track of LLM ops, a track of
bubbles (named by kind) and, per encoder lane on that stage, a track of its compute kernels and one
of its sends. Times are microseconds, as Chrome traces expect; with a schedule, the whole step is
shifted so that it starts at 0 (the LLM starts after the encoder work the schedule put before it).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..config.documents import write_text
from ..costs.kernels import PHASES
from ..llm.timeline import Timeline
from ..problem.problem import Problem
from ..schedule.scheduler import Schedule

OPS_TID = 0
"""The track of a rank's LLM ops."""
BUBBLES_TID = 1
"""The track of a rank's bubbles."""


def lane_tid(lane_in_stage: int, resource: int) -> int:
    """The track of an encoder lane's compute (resource 0) or comm (resource 1) kernels."""
    return 2 + 2 * lane_in_stage + resource


def trace_events(timeline: Timeline, problem: Problem | None = None,
                 schedule: Schedule | None = None, images: np.ndarray | None = None) -> list[dict[str, Any]]:
    """The trace's events: "X" slices for ops (named by their action, like "3F1"), bubbles (named by
    kind) and, given `problem` and its `schedule`, encoder kernels (cat "encoder"). `images`: per
    task, the images of each encoder its piece holds (a microbatch spread over pipelines), written
    as the kernel's ``images`` argument (none: every microbatch whole)."""
    if (problem is None) != (schedule is None):
        raise ValueError("schedule: give both the problem and its schedule, or neither")
    shift = schedule.shift_front if schedule is not None else 0.0
    lanes_per_stage = problem.num_lanes // timeline.ranks if problem is not None else 0
    if problem is not None and problem.num_lanes != lanes_per_stage * timeline.ranks:
        raise ValueError(f"problem: {problem.num_lanes} lanes do not split over {timeline.ranks} stages")
    events: list[dict[str, Any]] = []
    for s in range(timeline.ranks):
        events.append({"ph": "M", "pid": s, "name": "process_name", "args": {"name": f"stage {s}"}})
        events.append({"ph": "M", "pid": s, "name": "process_sort_index", "args": {"sort_index": s}})
        tracks = [(OPS_TID, "LLM ops"), (BUBBLES_TID, "bubbles")]
        for k in range(lanes_per_stage):
            tracks += [(lane_tid(k, 0), f"encoder lane {k} compute"), (lane_tid(k, 1), f"encoder lane {k} sends")]
        for tid, label in tracks:
            events.append({"ph": "M", "pid": s, "tid": tid, "name": "thread_name", "args": {"name": label}})
            events.append({"ph": "M", "pid": s, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for op in timeline.ops:
        events.append({"ph": "X", "pid": op.rank, "tid": OPS_TID, "cat": "op", "ts": op.start + shift,
                       "dur": op.end - op.start, "name": f"{op.stage}{op.kind}{op.microbatch}",
                       "args": {"chunk": op.chunk, "microbatch": op.microbatch, "stage_index": op.stage}})
    for b in timeline.bubbles:
        events.append({"ph": "X", "pid": b.rank, "tid": BUBBLES_TID, "cat": "bubble", "ts": b.start + shift,
                       "dur": b.end - b.start, "name": b.kind})
    if problem is not None and schedule is not None:
        a = problem.arrays().tasks
        phases = PHASES
        held = None if images is None else np.asarray(images).tolist()
        if held is not None and len(held) != len(a):
            raise ValueError(f"images: {len(held)} rows for {len(a)} tasks")
        for t, (lane, dur, res, ph, j, start) in enumerate(zip(
                a.lane.tolist(), a.duration.tolist(), a.resource.tolist(), a.phase.tolist(),
                a.microbatch.tolist(), schedule.start.tolist())):
            if dur <= 0.0:
                continue
            events.append({"ph": "X", "pid": lane // lanes_per_stage, "tid": lane_tid(lane % lanes_per_stage, res),
                           "cat": "encoder", "ts": start + shift, "dur": dur,
                           "name": f"{'send' if res else 'enc'} {phases[ph]} mb{j}",
                           "args": {"task": t, "microbatch": j, "phase": phases[ph],
                                    **({} if held is None else {"images": held[t], "lane": lane})}})
    return events


def save_trace(timeline: Timeline, path: str | os.PathLike[str], problem: Problem | None = None,
               schedule: Schedule | None = None, images: np.ndarray | None = None) -> None:
    """Writes the step (and the encoder's schedule, when given; `images` as :func:`trace_events`) as a
    Chrome trace JSON file that opens in the Perfetto UI (atomically: a failed write leaves the old
    file whole)."""
    write_text(path, json.dumps({"traceEvents": trace_events(timeline, problem, schedule, images),
                                 "displayTimeUnit": "ms"}))


__all__ = ["BUBBLES_TID", "OPS_TID", "lane_tid", "save_trace", "trace_events"]
