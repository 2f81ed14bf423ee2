"""A chart of step times over many batches, one series per way of meeting them (``pybubble
dynamic --plot``): on the left each mode's steps sorted from fastest to slowest (how often a step
is that long), on the right each mode's mean step with its 95th percentile (matplotlib, Agg backend).
Times read in ms (s for steps over 10 s)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping

import numpy as np

from .figures import pyplot, save_figure
from .gantt import DPI, time_unit

MODE_COLOURS = ("#8c8c8c", "#e69f00", "#3b6fb6", "#22a05a", "#8a3fa8", "#d55e00")
"""Colours of the series, in the order they are given."""


def save_step_chart(step_time: Mapping[str, np.ndarray], horizon: float, path: str | os.PathLike[str],
                    title: str = "") -> None:
    """Writes the chart of `step_time` (per mode, one step per batch, us) with the LLM-only step
    `horizon` (us) as a dashed line (format from the file name)."""
    if not step_time:
        raise ValueError("step_time: no mode to draw")
    plt = pyplot()
    values = {mode: np.sort(np.asarray(v, dtype=np.float64)) for mode, v in step_time.items()}
    top = max(float(v.max()) for v in values.values() if len(v))
    unit, scale = time_unit(top)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), width_ratios=(2.2, 1), layout="constrained")
    for (mode, v), colour in zip(values.items(), MODE_COLOURS):
        share = (np.arange(len(v)) + 0.5) / max(1, len(v)) * 100.0
        left.plot(share, v / scale, color=colour, linewidth=1.8, label=mode)
    left.axhline(horizon / scale, color="#555555", linestyle="--", linewidth=1.0, label="LLM alone")
    left.set_xlabel("batches, fastest to slowest (%)")
    left.set_ylabel(f"step time ({unit})")
    left.set_xlim(0, 100)
    left.legend(loc="upper left", fontsize=9, frameon=False)
    left.grid(alpha=0.3)
    modes = list(values)
    means = [float(np.mean(v)) / scale for v in values.values()]
    p95 = [float(np.percentile(v, 95)) / scale for v in values.values()]
    y = np.arange(len(modes))
    right.barh(y, means, color=MODE_COLOURS[:len(modes)], height=0.6, label="mean")
    right.scatter(p95, y, marker="|", s=300, color="black", zorder=3, label="95th percentile")
    right.axvline(horizon / scale, color="#555555", linestyle="--", linewidth=1.0)
    for yi, m in zip(y, means):
        right.text(m, yi, f" {m:,.4g}", va="center", ha="left", fontsize=8)
    right.set_yticks(y, modes)
    right.invert_yaxis()
    lo = min(horizon / scale, min(means)) * 0.9
    right.set_xlim(lo, max(p95) * 1.08)
    right.set_xlabel(f"mean step ({unit}), | = 95th percentile")
    right.grid(axis="x", alpha=0.3)
    for ax in (left, right):
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 120)), x=0.01, ha="left", fontsize=11)
    save_figure(fig, path, dpi=DPI)


__all__ = ["MODE_COLOURS", "save_step_chart"]
