"""The `pybubble dynamic` command, run as a real process on a small config."""

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

SMALL = {"cluster": {"gpus": 16, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"},
         "encoders": [{"preset": "vit-l-14"}], "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 2048},
         "llm_plan": {"dp": 2, "pp": 4, "tp": 2}}


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pybubble", "dynamic", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def test_runs_every_mode_and_writes_json_and_plot(tmp_path, config):
    out, plot = tmp_path / "r.json", tmp_path / "steps.png"
    r = run(config, "--steps", 6, "--seed", 3, "--json", out, "--plot", plot, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for mode in ("static", "balanced", "ordered", "online", "choice"):
        assert mode in r.stdout
    doc = json.loads(out.read_text())
    assert doc["format"] == "pybubble.dynamic/1"
    assert {"steps", "seed", "horizon", "budget_ms", "plans", "modes", "reschedule_ms", "chosen",
            "evaluated"} <= set(doc)
    assert doc["steps"] == 6 and doc["seed"] == 3 and doc["budget_ms"] == 10.0
    assert set(doc["modes"]) == {"static", "balanced", "ordered", "online", "choice"}
    for mode in doc["modes"].values():
        assert len(mode["step_time"]) == 6
        assert {"mean", "p95", "gain_vs_static"} <= set(mode)
        # nothing beats the LLM step alone
        assert min(mode["step_time"]) >= doc["horizon"]
    # the choice always reschedules the plan that `online` uses, so it is never worse
    choice, online = doc["modes"]["choice"]["step_time"], doc["modes"]["online"]["step_time"]
    assert all(c <= o for c, o in zip(choice, online))
    # ordering by encoder work keeps the loader's order when no other is shorter: never behind online
    assert all(o <= n for o, n in zip(doc["modes"]["ordered"]["step_time"], online))
    assert set(doc["order_chosen"]) == {"loader", "light_ends", "heavy_ends", "ascending", "descending"}
    assert sum(doc["order_chosen"].values()) == 6
    assert 1 <= len(doc["plans"]) <= 4
    assert all(1 <= e <= len(doc["plans"]) for e in doc["evaluated"])
    assert all(0 <= c < len(doc["plans"]) for c in doc["chosen"])
    steps = [p["mean_step"] for p in doc["plans"]]
    assert steps == sorted(steps)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_seed_same_steps_and_budget_zero_evaluates_one_plan(tmp_path, config):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run(config, "--steps", 3, "--json", a, cwd=tmp_path).returncode == 0
    r = run(config, "--steps", 3, "--json", b, "--budget-ms", 0, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    da, db = json.loads(a.read_text()), json.loads(b.read_text())
    assert da["modes"]["online"]["step_time"] == db["modes"]["online"]["step_time"]
    assert db["evaluated"] == [1, 1, 1] and db["chosen"] == [0, 0, 0]
    assert db["modes"]["choice"]["step_time"] == db["modes"]["online"]["step_time"]


@pytest.mark.parametrize("args,edit,message", [
    (["--steps", 0], None, "steps: 0 is not an integer >= 1"),
    (["--candidates", 0], None, "candidates: 0"),
    ([], ("llm_plan", "dp", 3), "llm_plan: dp x pp x tp"),
    ([], ("training", "micro_batch", 0), "training.micro_batch: 0"),
    ([], "missing", "no such file"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, config, replaced, args, edit, message):
    path = config
    if edit == "missing":
        path = tmp_path / "nope.yaml"
    elif edit is not None:
        *keys, value = edit
        path.write_text(yaml.safe_dump(replaced(SMALL, keys, value)))
    r = run(path, *args, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]


def test_mix_data_over_replicas_adds_a_mode_and_the_imbalance(tmp_path, config):
    out = tmp_path / "r.json"
    r = run(config, "--data", "mix", "--steps", 3, "--replicas", 3, "--candidates", 2, "--json", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "balanced_dp" in r.stdout and "before balancing" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["data"] == "mix" and doc["replicas"] == 3
    assert set(doc["modes"]) == {"static", "balanced", "ordered", "online", "choice", "balanced_dp"}
    before, after = doc["imbalance"]["before"], doc["imbalance"]["after"]
    assert len(before) == len(after) == 3
    assert all(1.0 <= a <= b + 1e-12 for a, b in zip(after, before)) and max(before) > 1.0
    assert set(doc["dp_wait"]) == set(doc["modes"]) and all(w >= 0 for w in doc["dp_wait"].values())
    for mode in doc["modes"].values():
        assert len(mode["step_time"]) == 3 and min(mode["step_time"]) >= doc["horizon"]


def test_a_data_file_is_replayed_and_a_bad_line_named(tmp_path, config):
    data = tmp_path / "samples.jsonl"
    data.write_text('{"tiles": [13], "text": 100}\n{"tiles": []}\n{"tiles": [1, 1, 1, 1, 1, 1, 1, 1]}\n')
    out = tmp_path / "r.json"
    r = run(config, "--data-file", data, "--steps", 2, "--candidates", 1, "--json", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["data"] == "file" and doc["replicas"] == SMALL["llm_plan"]["dp"]
    data.write_text('{"tiles": [13]}\n{"tiles": [2, 0]}\n')
    r = run(config, "--data-file", data, "--steps", 2, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: {data} line 2: tiles[1]: 0 is not a positive integer"
    r = run(config, "--replicas", 2, cwd=tmp_path)
    assert r.returncode == 2 and "replicas: modelled with --data mix, native or --data-file only" in r.stderr


def test_native_resolution_images_cost_their_attention_over_their_own_patches(tmp_path, config):
    """Samples in pixels (a file, or --data native): each image costs the encoder's time on a
    sequence of its own patches, so past the sizes where kernels are latency-bound one image of 4x
    the patches costs more than 4 small ones (attention); tiles cost the first encoder's image each."""
    from pybubble.config.schema import load_config
    from pybubble.costs.roofline import CostModel
    from pybubble.data.samples import Samples
    from pybubble.planner.sample_costs import encoder_time, image_costs

    cfg = load_config(config)
    costs = CostModel(cfg.cluster.gpu)
    enc = cfg.encoders[0]
    pixels = Samples(tiles=[4096, 1024, 1024, 1024, 1024], images=[1, 4], text=[0, 0],
                     grids=[[1, 128, 128]] + [[1, 64, 64]] * 4)  # the same patches: 16384 each sample
    big, *small = image_costs(pixels, cfg.encoders, costs)
    assert big == encoder_time(enc.model, 16384, costs) and small[0] == encoder_time(enc.model, 4096, costs)
    assert big > sum(small) > 0  # attention over one image of 16384 patches
    tiles = Samples(tiles=[3, 1], images=[2], text=[0])
    assert image_costs(tiles, cfg.encoders, costs).tolist() == [3 * encoder_time(enc.model, enc.model.tokens, costs),
                                                               encoder_time(enc.model, enc.model.tokens, costs)]
    out = tmp_path / "native.json"
    r = run(config, "--data", "native", "--steps", 2, "--candidates", 1, "--json", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["data"] == "native"


def test_replicas_wait_for_the_slowest_at_the_collective(tmp_path, config):
    """Replicas with the same work never wait; with uneven work each mode's step is the slowest
    replica's, and balancing the work over the replicas shortens the step."""
    out, data = tmp_path / "r.json", tmp_path / "samples.jsonl"
    steps = {}
    for name, text in (("same", '{"tiles": [4], "text": 100}\n'), ("uneven", '{"tiles": [32]}\n{"tiles": []}\n')):
        data.write_text(text)
        r = run(config, "--data-file", data, "--steps", 3, "--candidates", 1, "--json", out, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        doc = json.loads(out.read_text())
        steps[name] = {mode: np.array(v["step_time"]) for mode, v in doc["modes"].items()}
        steps[name]["wait"] = doc["dp_wait"]
    assert all(w == 0.0 for w in steps["same"]["wait"].values())
    uneven = steps["uneven"]
    assert uneven["wait"]["static"] > 0 and uneven["wait"]["online"] > uneven["wait"]["balanced_dp"]
    assert uneven["online"].sum() > uneven["balanced_dp"].sum()
    assert (uneven["balanced_dp"] <= uneven["online"] + 1e-6).all()
