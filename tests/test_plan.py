"""`pybubble plan`: the report's JSON, trace and plot for the quickstart, and pybubble against
the baselines on every shipped example config."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import pybubble
from pybubble.config.schema import load_config
from pybubble.planner.report import plan
from pybubble.llm.timeline import BUBBLE_KINDS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
QUICKSTART = EXAMPLES / "quickstart.yaml"
CONFIGS = sorted(EXAMPLES.glob("**/*.yaml"))


def run(*args):
    # from outside the source tree, so the installed package runs
    return subprocess.run([sys.executable, "-m", "pybubble", *map(str, args)], capture_output=True, text=True,
                          cwd=EXAMPLES.parent.parent)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    r = run("plan", QUICKSTART, "--json", out / "p.json", "--trace", out / "p.trace.json", "--plot", out / "p.png")
    assert r.returncode == 0, r.stderr
    return out, r.stdout


def test_plan_prints_the_comparison(quickstart):
    _, stdout = quickstart
    for name in ("megatron", "megatron_balanced", "coarse", "pybubble", "non-colocated", "MFU", "planner"):
        assert name in stdout


def test_plan_json_has_exactly_the_promised_keys(quickstart):
    out, _ = quickstart
    doc = json.loads((out / "p.json").read_text())
    assert set(doc) == {"baselines", "pybubble", "speedup_vs_megatron", "planner_seconds"}
    assert set(doc["baselines"]) == {"megatron", "megatron_balanced", "coarse"}
    assert all(set(b) == ({"step_time_s", "hidden_fraction"} if name == "coarse" else {"step_time_s"})
               and b["step_time_s"] > 0 for name, b in doc["baselines"].items())
    assert 0.0 <= doc["baselines"]["coarse"]["hidden_fraction"] <= 1.0
    pb = doc["pybubble"]
    assert set(pb) == {"step_time_s", "encoder_plan", "partition", "hidden_fraction", "mfu"}
    assert set(pb["encoder_plan"]) == {"dp", "pp", "tp"}
    cfg = load_config(QUICKSTART)
    assert sum(pb["partition"]) == cfg.microbatches
    assert pb["encoder_plan"]["dp"] == len(pb["partition"]) * cfg.llm_plan.dp
    assert 0.0 <= pb["hidden_fraction"] <= 1.0 and 0.0 < pb["mfu"] < 1.0
    assert doc["speedup_vs_megatron"] == pytest.approx(doc["baselines"]["megatron"]["step_time_s"] / pb["step_time_s"])
    assert pb["step_time_s"] <= min(b["step_time_s"] for b in doc["baselines"].values())


def test_plan_trace_has_a_track_per_lane_with_ops_bubbles_and_encoder_kernels(quickstart):
    out, _ = quickstart
    events = json.loads((out / "p.trace.json").read_text())["traceEvents"]
    cfg = load_config(QUICKSTART)
    report = plan(cfg)
    best, stages = report.best, cfg.llm_plan.pp
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in slices} == {"op", "bubble", "encoder"}
    assert {e["pid"] for e in slices} == set(range(stages))
    encoder = [e for e in slices if e["cat"] == "encoder"]
    durations = best.problem.arrays().tasks.duration
    assert len(encoder) == int((durations > 0).sum())
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    lanes = best.plan.lanes_per_stage
    assert sum("encoder lane" in n for n in names.values()) == 2 * lanes * stages  # compute and sends per lane
    assert all((e["pid"], e["tid"]) in names for e in slices)
    # shifted so the step starts at 0 and ends at pybubble's step time
    assert min(e["ts"] for e in slices) >= 0.0
    assert max(e["ts"] + e["dur"] for e in slices) == pytest.approx(best.step_time, rel=1e-9)
    assert {e["name"] for e in slices if e["cat"] == "bubble"} <= set(BUBBLE_KINDS)


def test_report_to_json_is_the_text_of_to_dict(quickstart):
    out, _ = quickstart
    report = plan(load_config(QUICKSTART))
    text = report.to_json()
    assert isinstance(text, str) and json.loads(text) == json.loads(json.dumps(report.to_dict()))
    assert set(json.loads((out / "p.json").read_text())) == set(report.to_dict())


def test_plan_plot_is_a_png(quickstart):
    out, _ = quickstart
    data = (out / "p.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_pybubble_is_never_worse_than_a_baseline(path):
    report = plan(load_config(path))
    best = report.best
    assert pybubble.validate(best.problem, best.schedule) == []
    assert best.memory_bytes <= report.config.memory_gb * 1e9
    for name, b in report.baselines.items():
        assert best.step_time <= b.step_time * (1 + 1e-12), name
    assert best.step_time >= report.search.timeline.step_time


@pytest.mark.parametrize("content,message", [
    ("cluster: {gpus: 16}\n", "llm: missing"),
    ("nonsense: 1\n", "config.nonsense: unknown key"),
])
def test_plan_bad_config_is_one_error_line(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    r = run("plan", path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith("error: ")
    assert message in r.stderr


def test_plan_derives_the_llm_step_once(monkeypatch):
    """`pybubble.plan` reads the config once: the LLM's layer times, its timeline and its memory per
    rank are derived once and handed to the search, the baselines and the non-colocated layout."""
    from pybubble.costs.roofline import CostModel
    from pybubble.llm import step as llm_step

    config = load_config(QUICKSTART)
    calls = {"llm_layer_kernels": 0, "steps": 0, "timelines": 0, "memory": 0}
    layer_kernels = CostModel.layer_kernels
    of, simulate, memory = llm_step.LLMStep.of.__func__, llm_step._simulate, llm_step._stage_memory

    def counted_layer_kernels(self, model, *args, **kwargs):
        calls["llm_layer_kernels"] += model is config.llm
        return layer_kernels(self, model, *args, **kwargs)

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(CostModel, "layer_kernels", counted_layer_kernels)
    monkeypatch.setattr(llm_step.LLMStep, "of", classmethod(counted("steps", of)))
    monkeypatch.setattr(llm_step, "_simulate", counted("timelines", simulate))
    monkeypatch.setattr(llm_step, "_stage_memory", counted("memory", memory))
    plan(config, workers=1)
    # one LLM step: its layer's forward and backward kernels (times and TP collectives); then the two
    # Megatron layouts simulate their own steps (encoder layers added) and count their own memory
    assert calls == {"llm_layer_kernels": 2, "steps": 1, "timelines": 3, "memory": 3}
