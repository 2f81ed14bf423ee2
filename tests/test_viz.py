"""Pictures people would rather look at than read: the Gantt chart's time unit, title, legend,
window and the way it draws shares of time; the dynamic run's chart."""

from pathlib import Path

import numpy as np
import pytest

import pybubble
import pybubble.viz.gantt as gantt
import pybubble.viz.steps as steps
from pybubble.viz.gantt import coverage, save_gantt, time_unit

QUICKSTART = Path(__file__).resolve().parent.parent / "examples" / "quickstart.yaml"


@pytest.fixture
def figures(monkeypatch):
    """The figures the charts would save, kept open for inspection instead of written."""
    kept = []

    def keep(fig, path, dpi=120):
        fig.canvas.draw()
        kept.append(fig)

    monkeypatch.setattr(gantt, "save_figure", keep)
    monkeypatch.setattr(steps, "save_figure", keep)
    return kept


def legend(fig):
    return [t.get_text() for t in fig.legends[0].get_texts()]


def inside(fig, artist):
    box, frame = artist.get_window_extent(), fig.bbox
    return box.x0 >= frame.x0 - 1 and box.x1 <= frame.x1 + 1 and box.y0 >= frame.y0 - 1 and box.y1 <= frame.y1 + 1


def test_coverage_is_the_share_of_each_bin_the_intervals_cover():
    rng = np.random.default_rng(0)
    start = np.sort(rng.uniform(0, 100, 40))
    end = start + rng.uniform(0, 3, 40)
    edges = np.linspace(-5, 110, 47)
    fine = np.linspace(-5, 110, 460001)
    mid = (fine[1:] + fine[:-1]) / 2
    covered = ((mid[:, None] >= start) & (mid[:, None] < end)).sum(axis=1).astype(float)
    expected = covered.reshape(46, -1).mean(axis=1)
    assert np.allclose(coverage(start, end, edges), expected, atol=1e-3)


def test_time_reads_in_ms_or_s():
    assert time_unit(900e3) == ("ms", 1e3)
    assert time_unit(30e6) == ("s", 1e6)


def test_plain_llm_step_legend_lists_only_what_occurs(tmp_path, figures):
    tl = pybubble.simulate_pipeline("1f1b", ranks=4, microbatches=8, fwd=1000.0, bwd=2000.0)
    save_gantt(tl, tmp_path / "g.png")
    fig = figures[0]
    labels = legend(fig)
    assert labels == ["LLM forward", "LLM backward", "bubble: pp_warmup", "bubble: pp_cooldown"]
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (ms)"
    assert ax.get_xlim() == pytest.approx((0.0, tl.step_time / 1e3))
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"stage {s}" for s in range(4)]
    assert "1e" not in "".join(t.get_text() for t in ax.get_xticklabels())  # no offset or power notation


def test_plan_chart_labels_encoder_lanes_under_their_stage_and_its_title_fits(tmp_path, figures):
    report = pybubble.plan(pybubble.load_config(QUICKSTART))
    report.save_plot(tmp_path / "p.png")
    fig = figures[0]
    ax = fig.axes[0]
    lanes = report.best.plan.lanes_per_stage
    labels = [t.get_text() for t in ax.get_yticklabels()]
    stages = report.config.llm_plan.pp
    assert len(labels) == stages * (1 + lanes)
    assert labels[0] == "stage 0" and labels[1].startswith("encoder") and labels[1 + lanes] == "stage 1"
    assert {"encoder forward", "encoder backward", "LLM forward", "bubble: pp_warmup"} <= set(legend(fig))
    assert inside(fig, ax.title) and inside(fig, fig.legends[0])


def test_the_encoders_kernels_are_drawn_in_full_in_their_lane_rows(tmp_path, figures):
    """Bin by bin, a lane row's green share is the encoder's forward kernels' share of the bin: the
    green area is all of their time (a valid schedule puts them in bubbles or outside the LLM step)."""
    report = pybubble.plan(pybubble.load_config(QUICKSTART))
    report.save_plot(tmp_path / "p.png")
    ax = figures[0].axes[0]
    best = report.best
    t = best.problem.arrays().tasks
    start = best.schedule.start + best.schedule.shift_front
    spread = np.isin(t.microbatch, best.spread_microbatches)
    assert spread.any() and not spread.all(), "the quickstart spreads its head and tail, not the rest"
    fwd = (t.resource == 0) & (t.phase == 0)
    lane_h = 0.34
    for colour, which in ((gantt.ENCODER_COLOURS[0], ~spread), (gantt.SPREAD_COLOURS[0], spread)):
        green = [c for c in ax.collections
                 if len(c.get_facecolor()) and np.allclose(c.get_facecolor()[0][:3], _rgb(colour))]
        assert green, "the encoder's forward kernels are drawn"
        drawn = sum(_area(c) for c in green)  # ms x row height
        assert drawn / lane_h == pytest.approx(t.duration[fwd & which].sum() / 1e3, rel=0.02)
    assert start.min() >= 0.0


def test_window_zooms_and_is_checked(tmp_path, figures):
    tl = pybubble.simulate_pipeline("1f1b", ranks=2, microbatches=4, fwd=1000.0, bwd=2000.0)
    save_gantt(tl, tmp_path / "g.png", window=(2000.0, 5000.0))
    ax = figures[0].axes[0]
    assert ax.get_xlim() == pytest.approx((2.0, 5.0))
    assert "window 2-5 ms" in ax.get_title(loc="left")
    with pytest.raises(ValueError, match="window: start 5000 is not before end 2000"):
        save_gantt(tl, tmp_path / "g.png", window=(5000.0, 2000.0))
    with pytest.raises(ValueError, match="window.end: nan"):
        save_gantt(tl, tmp_path / "g.png", window=(0.0, float("nan")))


def test_step_chart_sorts_each_mode_and_shows_mean_and_p95(tmp_path, figures):
    rng = np.random.default_rng(1)
    modes = {"static": rng.uniform(1.1e6, 1.4e6, 50), "online": rng.uniform(1.0e6, 1.2e6, 50)}
    steps.save_step_chart(modes, 0.9e6, tmp_path / "s.png", title="two modes")
    fig = figures[0]
    left, right = fig.axes
    lines = {line.get_label(): line for line in left.get_lines()}
    assert set(lines) == {"static", "online", "LLM alone"}
    assert np.all(np.diff(lines["static"].get_ydata()) >= 0)
    assert left.get_ylabel() == "step time (ms)"
    assert [t.get_text() for t in right.get_yticklabels()] == ["static", "online"]
    assert inside(fig, fig._suptitle)
    with pytest.raises(ValueError, match="step_time"):
        steps.save_step_chart({}, 1.0, tmp_path / "s.png")


def _rgb(hex_colour):
    return tuple(int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))


def _area(collection):
    total = 0.0
    for path in collection.get_paths():
        x, y = path.vertices[:, 0], path.vertices[:, 1]
        total += 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))
    return total
