"""Gantt chart of a simulated LLM step: one row per pipeline stage, ops coloured by kind, bubbles
shaded by kind and, given an encoder problem and its schedule, the encoder's compute kernels as a
thin band under each stage's row, one band per lane (matplotlib, Agg backend: no display needed).
With a schedule the chart is shifted like the trace: the step starts at 0."""

from __future__ import annotations

import os
from collections import defaultdict

from ..llm.timeline import Timeline
from ..problem.problem import Problem
from ..schedule.scheduler import Schedule
from .figures import pyplot, save_figure

OP_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#c44e52", "W": "#8172b3"}
"""Colour of each LLM action kind."""
BUBBLE_COLOURS = {"dp_allgather": "#2ca02c", "pp_warmup": "#bcbd22", "pp_steady": "#ff7f0e",
                  "pp_cooldown": "#d62728", "tp": "#17becf", "dp_reducescatter": "#9467bd"}
"""Colour of each bubble kind (shaded)."""
ENCODER_COLOURS = {0: "#222222", 1: "#8c564b"}
"""Colour of the encoder's forward (0) and backward (1) kernels."""


def save_gantt(timeline: Timeline, path: str | os.PathLike[str], problem: Problem | None = None,
               schedule: Schedule | None = None, title: str | None = None) -> None:
    """Writes the step's Gantt chart (format from the file name, e.g. .png or .svg)."""
    plt = pyplot()
    from matplotlib.patches import Patch

    if (problem is None) != (schedule is None):
        raise ValueError("schedule: give both the problem and its schedule, or neither")
    p = timeline.ranks
    shift = schedule.shift_front if schedule is not None else 0.0
    end = schedule.step_time if schedule is not None else timeline.step_time
    lanes_per_stage = problem.num_lanes // p if problem is not None else 0
    llm_height = 0.8 if problem is None else 0.55
    fig, ax = plt.subplots(figsize=(12, 0.7 * p + 1.5))
    # One pass over ops and bubbles: bars grouped by (stage, kind), then one call per group.
    op_bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for o in timeline.ops:
        op_bars[(o.rank, o.kind)].append((o.start + shift, o.end - o.start))
    bubble_bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for b in timeline.bubbles:
        bubble_bars[(b.rank, b.kind)].append((b.start + shift, b.end - b.start))
    top = -0.4
    for (s, kind), bars in op_bars.items():
        ax.broken_barh(bars, (s + top, llm_height), facecolors=OP_COLOURS[kind], edgecolor="white", linewidth=0.2)
    for (s, kind), bars in bubble_bars.items():
        ax.broken_barh(bars, (s + top, llm_height), facecolors=BUBBLE_COLOURS[kind], alpha=0.35)
    if problem is not None and schedule is not None:
        a = problem.arrays().tasks
        compute = a.resource == 0
        band = (0.8 - llm_height) / max(1, lanes_per_stage)
        for lane in range(problem.num_lanes):
            s, k = divmod(lane, lanes_per_stage)
            for ph, colour in ENCODER_COLOURS.items():
                sel = compute & (a.lane == lane) & (a.phase == ph)
                bars = list(zip((schedule.start[sel] + shift).tolist(), a.duration[sel].tolist()))
                if bars:
                    ax.broken_barh(bars, (s + top + llm_height + k * band, band * 0.9), facecolors=colour)
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_xlim(0, end)
    ax.set_title(title or f"LLM step {timeline.step_time / 1000:.3f} ms")
    handles = [Patch(color=c, label=k) for k, c in OP_COLOURS.items() if any(key[1] == k for key in op_bars)]
    handles += [Patch(color=c, alpha=0.35, label=k) for k, c in BUBBLE_COLOURS.items()]
    if problem is not None:
        handles += [Patch(color=ENCODER_COLOURS[0], label="encoder fwd"),
                    Patch(color=ENCODER_COLOURS[1], label="encoder bwd")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


__all__ = ["BUBBLE_COLOURS", "ENCODER_COLOURS", "OP_COLOURS", "save_gantt"]
