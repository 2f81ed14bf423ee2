"""Gantt chart of a simulated LLM step (matplotlib, Agg backend: no display needed).

One block per pipeline stage: a row of the LLM's ops coloured by kind, with the stage's bubbles
shaded by kind; given an encoder problem and its schedule, one row per encoder lane of that stage
under it, labelled, where the bubbles are shaded too and the encoder's compute kernels are drawn
inside the bubbles they fill (forward and backward in their own colours, paler for microbatches
spread over every pipeline). Encoder work the schedule
puts before or after the LLM's step (the step grows) lies on a grey background. With a schedule the
chart is shifted like the trace: the step starts at 0.

Time reads in ms (s for steps over 10 s). `window` zooms into a part of the step; the legend lists
only what occurs in the picture. Each row is drawn in bins of two pixels, each kind taking its share
of the bin's time as a share of the row's height: wide ops look like bars (with a white line where
one ends and the next begins, when they are wide enough to tell apart), while ops, TP collectives
and kernels narrower than a pixel (a 3072-GPU plan's interleaved schedule, an encoder layer's
kernels) show in their true proportions instead of slivers that blur into stripes.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config.checks import interval
from ..llm.timeline import BUBBLE_KINDS, Timeline
from ..problem.problem import Problem
from ..schedule.scheduler import Schedule
from .figures import pyplot, save_figure

OP_COLOURS = {"F": "#3b6fb6", "B": "#1d3f73", "I": "#5b8fd9", "W": "#93b4e3"}
"""Colour of each LLM action kind (blues: the LLM computes)."""
OP_NAMES = {"F": "LLM forward", "B": "LLM backward", "I": "LLM input-grad backward", "W": "LLM weight-grad backward"}
"""Legend label of each LLM action kind."""
BUBBLE_COLOURS = {"dp_allgather": "#e3cff5", "pp_warmup": "#ffe08a", "pp_steady": "#ffc9a8",
                  "pp_cooldown": "#f7b3c2", "tp": "#b9e6f2", "dp_reducescatter": "#d6e3a8"}
"""Pale colour of each bubble kind (the LLM idles)."""
ENCODER_COLOURS = {0: "#22a05a", 1: "#8a3fa8"}
"""Colour of the encoder's forward (0) and backward (1) compute kernels."""
SPREAD_COLOURS = {0: "#86d9a8", 1: "#c99ee0"}
"""Colour of the forward (0) and backward (1) kernels of microbatches spread over every pipeline."""
GROWTH_COLOUR = "#e6e6e6"
"""Background where the step grows before or after the LLM's step."""
FIGURE_WIDTH = 12.0
"""Width of the chart (inches)."""
DPI = 100
"""Resolution of a raster chart (dots per inch)."""
BIN_PIXELS = 2
"""Width of the time bins a row is drawn in (pixels)."""


def time_unit(span_us: float) -> tuple[str, float]:
    """The unit a span of `span_us` microseconds reads best in: ("s", 1e6) from 10 s, else ("ms", 1e3)."""
    return ("s", 1e6) if span_us >= 10e6 else ("ms", 1e3)


def coverage(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of each bin ``[edges[j], edges[j + 1])`` that the intervals ``[start, end)`` cover
    (overlapping intervals count twice)."""
    s, e = np.sort(start), np.sort(end)
    ps, pe = np.concatenate(([0.0], np.cumsum(s))), np.concatenate(([0.0], np.cumsum(e)))

    def covered(x: np.ndarray) -> np.ndarray:  # sum of relu(x - s) - relu(x - e)
        ks, ke = np.searchsorted(s, x, side="right"), np.searchsorted(e, x, side="right")
        return (ks * x - ps[ks]) - (ke * x - pe[ke])

    c = covered(edges)
    return np.diff(c) / np.diff(edges)


@dataclass(slots=True)
class _Layer:
    """Intervals of one kind drawn in one row."""

    key: str
    colour: str
    start: np.ndarray
    end: np.ndarray


class _Chart:
    """The visible part of the chart, cut into time bins of :data:`BIN_PIXELS` pixels; a row is
    drawn bin by bin, each kind taking its share of the bin's time as a share of the row's height."""

    def __init__(self, ax: Any, lo: float, hi: float, scale: float, width_px: int):
        self.ax, self.lo, self.hi, self.scale = ax, lo, hi, scale
        self.edges = np.linspace(lo, hi, width_px // BIN_PIXELS + 1)
        self.pixel = (hi - lo) / width_px
        """Microseconds per pixel."""
        self.present: set[str] = set()
        """The kinds drawn so far (the legend's entries)."""

    def visible(self, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The intervals clipped to the window (empty ones dropped)."""
        keep = (end > self.lo) & (start < self.hi) & (end > start)
        return np.maximum(start[keep], self.lo), np.minimum(end[keep], self.hi)

    def background(self, layer: _Layer, y: float, height: float) -> None:
        """Draws `layer`'s intervals as plain bars behind everything, from `y` down `height`."""
        start, end = self.visible(layer.start, layer.end)
        if len(start):
            spans = np.column_stack((start / self.scale, (end - start) / self.scale))
            self.ax.broken_barh(spans, (y, height), facecolors=layer.colour, linewidth=0.0, zorder=0.5)
            self.present.add(layer.key)

    def shares(self, layer: _Layer) -> np.ndarray:
        """`layer`'s share of each bin."""
        start, end = self.visible(layer.start, layer.end)
        return coverage(start, end, self.edges) if len(start) else np.zeros(len(self.edges) - 1)

    def stacked(self, parts: list[tuple[_Layer, np.ndarray]], y: float, height: float) -> None:
        """Draws, bin by bin, each layer's share as a part of the row's height, stacked from `y` down."""
        x = self.edges / self.scale
        base = np.zeros(len(self.edges) - 1)
        for layer, share in parts:
            if not np.any(share > 1e-9):
                continue
            top = base + share
            self.ax.fill_between(x, y + height * np.append(base, base[-1]), y + height * np.append(top, top[-1]),
                                 step="post", color=layer.colour, linewidth=0, zorder=2)
            self.present.add(layer.key)
            base = top


_ENCODER_COLOURS = {**{f"enc{ph}": c for ph, c in ENCODER_COLOURS.items()},
                    **{f"enc{ph}s": c for ph, c in SPREAD_COLOURS.items()}}
_LLM_ROW, _LANE_ROW, _GAP = 0.62, 0.34, 0.36
"""Heights of a stage's LLM row, of each encoder lane's row and of the gap after a stage (y units)."""


@dataclass(slots=True)
class _Intervals:
    """Intervals of several kinds, each on a row (a pipeline rank, or an encoder lane: -1 for none)."""

    row: np.ndarray
    kind: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def layers(self, colours: dict[str, str], row: int) -> list[_Layer]:
        """One layer per kind of `colours`: the intervals of that kind on `row`."""
        rows = self.row == row
        return [_Layer(k, c, self.start[rows & (self.kind == k)], self.end[rows & (self.kind == k)])
                for k, c in colours.items()]


def _timeline_intervals(items: Sequence[Any], shift: float) -> _Intervals:
    """The LLM's ops or bubbles (each with a rank, a kind, a start and an end), shifted by `shift`."""
    return _Intervals(row=np.array([o.rank for o in items], dtype=np.int64), kind=np.array([o.kind for o in items]),
                      start=np.array([o.start for o in items], dtype=np.float64) + shift,
                      end=np.array([o.end for o in items], dtype=np.float64) + shift)


def _encoder_intervals(problem: Problem, schedule: Schedule, shift: float, spread: Sequence[int]) -> _Intervals:
    """The encoder's compute kernels by lane (comm tasks on no row), of kind ``enc<phase>``, with an
    ``s`` for the microbatches in `spread`."""
    t = problem.arrays().tasks
    start = schedule.start + shift
    pale = np.isin(t.microbatch, np.asarray(list(spread), np.int64))
    kind = np.char.add(np.where(t.phase == 0, "enc0", "enc1"), np.where(pale, "s", ""))
    return _Intervals(row=np.where(t.resource == 0, t.lane, -1), kind=kind, start=start, end=start + t.duration)


def _draw_stage(chart: _Chart, r: int, top: float, ops: _Intervals, bubbles: _Intervals,
                encoder: _Intervals | None, lanes: int, op_px: float) -> list[tuple[float, str]]:
    """Stage r's block from `top` down: its LLM row, then one row per encoder lane; returns each
    row's (tick, label)."""
    rows = [(top + _LLM_ROW / 2, f"stage {r}")]
    ops_r = [(layer, chart.shares(layer)) for layer in ops.layers(OP_COLOURS, r)]
    idle = [(layer, chart.shares(layer)) for layer in bubbles.layers(BUBBLE_COLOURS, r)]
    # An op's time includes its TP collectives (the tp bubbles): they come off the ops' shares.
    busy = sum(s for _, s in ops_r)
    tp = next(s for layer, s in idle if layer.key == "tp")
    computing = np.clip(np.divide(busy - tp, busy, out=np.zeros_like(busy), where=busy > 0), 0.0, 1.0)
    chart.stacked([(layer, s * computing) for layer, s in ops_r] + idle, top, _LLM_ROW)
    if op_px >= 6:  # wide enough to tell one op from the next
        sel = (ops.row == r) & (ops.start > chart.lo) & (ops.start < chart.hi)
        chart.ax.vlines(ops.start[sel] / chart.scale, top, top + _LLM_ROW, colors="white", linewidth=0.6, zorder=3)
    idle_total = sum(s for _, s in idle)
    for k in range(lanes):
        rows.append((top + _LLM_ROW + (k + 0.5) * _LANE_ROW, "encoder" if lanes == 1 else f"encoder {k}"))
        assert encoder is not None
        enc = [(layer, chart.shares(layer)) for layer in encoder.layers(_ENCODER_COLOURS, r * lanes + k)]
        # the lane's bubbles, less what the encoder fills, shaded by kind below its kernels
        filled = np.minimum(sum(s for _, s in enc), idle_total)
        unfilled = np.divide(idle_total - filled, idle_total, out=np.zeros_like(idle_total), where=idle_total > 0)
        chart.stacked(enc + [(layer, s * unfilled) for layer, s in idle], top + _LLM_ROW + k * _LANE_ROW, _LANE_ROW)
    return rows


def _label_axes(chart: _Chart, rows: list[tuple[float, str]], bottom: float, unit: str, title: str) -> None:
    """The rows' labels (the encoder lanes' smaller and grey), the time axis and the title."""
    ax = chart.ax
    ax.set_yticks([y for y, _ in rows], [label for _, label in rows])
    for label in ax.get_yticklabels():
        if label.get_text().startswith("encoder"):
            label.set_fontsize(8)
            label.set_color("#555555")
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(bottom, -_GAP / 2)
    ax.set_xlim(chart.lo / chart.scale, chart.hi / chart.scale)
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    ax.set_xlabel(f"time ({unit})")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title("\n".join(textwrap.fill(line, 130) for line in title.split("\n")), loc="left", fontsize=11)


def _legend(fig: Any, present: set[str]) -> None:
    """The legend of the kinds drawn, under the chart."""
    from matplotlib.patches import Patch

    labels_of = {**OP_NAMES, **{k: f"bubble: {k}" for k in BUBBLE_KINDS}, "enc0": "encoder forward",
                 "enc1": "encoder backward", "enc0s": "encoder forward, spread over every pipeline",
                 "enc1s": "encoder backward, spread over every pipeline",
                 "grown": "step grows (encoder outside the LLM's step)"}
    colours = {**OP_COLOURS, **BUBBLE_COLOURS, **_ENCODER_COLOURS, "grown": GROWTH_COLOUR}
    handles = [Patch(color=colours[k], label=labels_of[k]) for k in labels_of if k in present]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=8, frameon=False)


def save_gantt(timeline: Timeline, path: str | os.PathLike[str], problem: Problem | None = None,
               schedule: Schedule | None = None, title: str | None = None,
               window: tuple[float, float] | None = None, spread: Sequence[int] = ()) -> None:
    """Writes the step's Gantt chart (format from the file name, e.g. .png or .svg). `window`:
    (start, end) in microseconds of the chart's time (0 = the step's start) to draw only that part.
    `spread`: encoder microbatches spread over every pipeline, drawn in paler colours."""
    if (problem is None) != (schedule is None):
        raise ValueError("schedule: give both the problem and its schedule, or neither")
    window = interval(window, "window") if window is not None else None
    plt = pyplot()
    ranks = timeline.ranks
    lanes = problem.num_lanes // ranks if problem is not None else 0
    if problem is not None and problem.num_lanes != lanes * ranks:
        raise ValueError(f"problem: {problem.num_lanes} lanes do not split over {timeline.ranks} stages")
    shift = schedule.shift_front if schedule is not None else 0.0
    step = schedule.step_time if schedule is not None else timeline.step_time
    lo, hi = window if window is not None else (0.0, step)
    unit, scale = time_unit(hi - lo)
    block = _LLM_ROW + lanes * _LANE_ROW + _GAP
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 1.9 + ranks * block * 0.62), layout="constrained")
    chart = _Chart(ax, lo, hi, scale, width_px=int(0.86 * FIGURE_WIDTH * DPI))
    if schedule is not None and (schedule.shift_front > 0 or schedule.shift_back > 0):
        grown = _Layer("grown", GROWTH_COLOUR, np.array([0.0, shift + timeline.step_time]), np.array([shift, step]))
        chart.background(grown, -_GAP / 2, ranks * block)
    ops, bubbles = _timeline_intervals(timeline.ops, shift), _timeline_intervals(timeline.bubbles, shift)
    shown_ops = chart.visible(ops.start, ops.end)
    op_px = float(np.median(shown_ops[1] - shown_ops[0])) / chart.pixel if len(shown_ops[0]) else 0.0
    encoder = _encoder_intervals(problem, schedule, shift, spread) if problem is not None and schedule is not None \
        else None
    rows = [row for r in range(ranks) for row in _draw_stage(chart, r, r * block, ops, bubbles, encoder, lanes, op_px)]
    if title is None:
        title = f"LLM step {timeline.step_time / 1e3:,.1f} ms"
    if window is not None:
        title += f"  [window {lo / scale:,.6g}-{hi / scale:,.6g} {unit}]"
    _label_axes(chart, rows, ranks * block - _GAP / 2, unit, title)
    _legend(fig, chart.present)
    save_figure(fig, path, dpi=DPI)


__all__ = ["BUBBLE_COLOURS", "DPI", "ENCODER_COLOURS", "FIGURE_WIDTH", "GROWTH_COLOUR", "BIN_PIXELS",
           "OP_COLOURS", "OP_NAMES", "SPREAD_COLOURS", "coverage", "save_gantt", "time_unit"]
