"""Gantt chart of a simulated LLM step: one row per pipeline stage, ops coloured by kind, bubbles
shaded by kind (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .timeline import Timeline

OP_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#c44e52", "W": "#8172b3"}
BUBBLE_COLOURS = {"dp_allgather": "#2ca02c", "pp_warmup": "#bcbd22", "pp_steady": "#ff7f0e",
                  "pp_cooldown": "#d62728", "tp": "#17becf", "dp_reducescatter": "#9467bd"}


def save_gantt(timeline: "Timeline", path: str | os.PathLike[str]) -> None:
    """Writes the step's Gantt chart (format from the file name, e.g. .png or .svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    p = timeline.stages
    fig, ax = plt.subplots(figsize=(12, 0.6 * p + 1.5))
    # One pass over ops and bubbles: bars grouped by (stage, kind), then one call per group.
    op_bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for o in timeline.ops:
        op_bars[(o.stage, o.kind)].append((o.start, o.end - o.start))
    bubble_bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for b in timeline.bubbles:
        bubble_bars[(b.stage, b.kind)].append((b.start, b.end - b.start))
    for (s, kind), bars in op_bars.items():
        ax.broken_barh(bars, (s - 0.4, 0.8), facecolors=OP_COLOURS[kind], edgecolor="white", linewidth=0.2)
    for (s, kind), bars in bubble_bars.items():
        ax.broken_barh(bars, (s - 0.4, 0.8), facecolors=BUBBLE_COLOURS[kind], alpha=0.35)
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_xlim(0, timeline.step_time)
    ax.set_title(f"LLM step {timeline.step_time / 1000:.3f} ms")
    handles = [Patch(color=c, label=k) for k, c in OP_COLOURS.items()]
    handles += [Patch(color=c, alpha=0.35, label=k) for k, c in BUBBLE_COLOURS.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
