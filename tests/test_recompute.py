"""Activation recomputation (FLOPs against Megatron-LM's four-pass formula, memory with and without
it), the encoder load as one config field, the baselines' own LLM plans, and the cluster calibration
file a config names (refused with one clear error when missing or malformed)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pybubble import presets
from pybubble.config.schema import load_config
from pybubble.costs.kernels import decompose_layer, layer_flops
from pybubble.costs.memory import activation_bytes, recompute_bytes
from pybubble.costs.roofline import CostModel
from pybubble.llm.step import LLMStep
from pybubble.planner.report import encoder_flops, llm_flops, model_flops, plan

OPTIMUS = Path(__file__).resolve().parent.parent / "examples" / "optimus"


def megatron_four_pass(batch, s, layers, h, vocab):
    """Megatron-LM's FLOPs per step under full recomputation (Narayanan et al. 2021, eq. 3)."""
    return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def test_full_recomputation_counts_megatrons_four_passes():
    gpt = presets.llm("gpt-175b")
    s, b = 2048, 1
    per_layer = layer_flops(gpt, b, s) + layer_flops(gpt, b, s, phase="bwd", recompute="full")
    logits = 3 * 2.0 * s * gpt.hidden * gpt.vocab  # forward and backward, never recomputed
    expected = megatron_four_pass(b, s, gpt.layers, gpt.hidden, gpt.vocab)
    # the element-wise kernels (norms, activation, residuals) add ~50/(24 h) to the GEMMs' count
    assert gpt.layers * per_layer + logits == pytest.approx(expected, rel=2e-3)
    # without recomputation: three passes, Megatron's 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
    plain = layer_flops(gpt, b, s) + layer_flops(gpt, b, s, phase="bwd")
    three = 72 * b * s * gpt.layers * gpt.hidden ** 2 * (1 + s / (6 * gpt.hidden) + gpt.vocab / (12 * gpt.layers * gpt.hidden))
    assert gpt.layers * plain + logits == pytest.approx(three, rel=2e-3)


def test_selective_recomputation_adds_the_core_attention_only():
    vit = presets.encoder("vit-22b")
    none = layer_flops(vit, 4, 256, phase="bwd")
    selective = layer_flops(vit, 4, 256, phase="bwd", recompute="selective")
    assert selective - none == pytest.approx(4.0 * 4 * 256 * 256 * vit.hidden)  # QK^T and PV once more
    kernels = decompose_layer(vit, 4, 256, tp=8, phase="bwd", recompute="full")
    again = [k for k in kernels if k.name.startswith("recompute_")]
    forward = decompose_layer(vit, 4, 256, tp=8)
    assert [k.name for k in again] == [f"recompute_{k.name}" for k in forward]  # its TP collectives too
    assert all(k.phase == "bwd" for k in again) and kernels[:len(again)] == again  # before the gradients
    with pytest.raises(ValueError, match="recompute: 'some' is not one of none, selective, full"):
        decompose_layer(vit, 4, 256, phase="bwd", recompute="some")


def test_the_shipped_3072_gpu_config_counts_the_papers_flops_per_step():
    # the encoder load comes from 866.3 PFLOP/s x 5.91 s = 5.12e18 FLOPs per step (docs/reproduction.md)
    cfg = load_config(OPTIMUS / "strong_3072.yaml")
    assert cfg.training.recompute == "full" and cfg.encoders[0].images_per_sample == 8
    gpt = cfg.llm
    assert llm_flops(cfg) == pytest.approx(megatron_four_pass(1536, 2048, gpt.layers, gpt.hidden, gpt.vocab), rel=2e-3)
    assert model_flops(cfg) == pytest.approx(llm_flops(cfg) + encoder_flops(cfg))
    assert model_flops(cfg) == pytest.approx(866.3e15 * 5.91, rel=0.02)
    no_recompute = load_config({**_doc(OPTIMUS / "strong_3072.yaml"), "training": {
        "global_batch": 1536, "micro_batch": 2, "seq_len": 2048, "recompute": "none"}})
    assert model_flops(no_recompute) == pytest.approx(0.75 * model_flops(cfg), rel=0.01)


def _doc(path):
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["cluster"].pop("calibration", None)
    return doc


SMALL = {"cluster": {"gpus": 8, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"}, "encoders": [{"preset": "vit-l-14"}],
         "training": {"global_batch": 16, "micro_batch": 2, "seq_len": 2048}, "llm_plan": {"dp": 1, "pp": 4, "tp": 2}}


def with_recompute(mode):
    return load_config({**SMALL, "training": {**SMALL["training"], "recompute": mode}})


def test_memory_with_and_without_recomputation():
    llm = presets.llm("llama-3-8b")
    assert activation_bytes(llm, 2, 2048, 2) == 34 * 2048 * 2 * llm.hidden / 2
    assert activation_bytes(llm, 2, 2048, 2, "selective") == activation_bytes(llm, 2, 2048, 2)
    assert activation_bytes(llm, 2, 2048, 2, "full") == 2 * 2048 * 2 * llm.hidden / 2  # the layer input
    assert recompute_bytes(llm, 2, 2048, 2, "none") == 0.0
    assert recompute_bytes(llm, 2, 2048, 2, "full") == activation_bytes(llm, 2, 2048, 2)
    layers = llm.layers // 4
    states = 6 * llm.params_per_layer * layers / 2
    in_flight = np.array([4, 3, 2, 1])  # 1F1B on 4 stages
    none, full = LLMStep.of(with_recompute("none")), LLMStep.of(with_recompute("full"))
    assert none.memory == pytest.approx(states + activation_bytes(llm, 2, 2048, 2) * layers * in_flight)
    assert full.memory == pytest.approx(states + activation_bytes(llm, 2, 2048, 2, "full") * layers * in_flight
                                        + recompute_bytes(llm, 2, 2048, 2, "full"))
    assert (full.memory < none.memory).all()


def test_recomputation_lengthens_the_backward_and_the_step():
    none, full = LLMStep.of(with_recompute("none")), LLMStep.of(with_recompute("full"))
    assert full.layer_fwd == none.layer_fwd
    assert full.layer_bwd == pytest.approx(none.layer_bwd + none.layer_fwd, rel=0.05)
    assert full.timeline.step_time > none.timeline.step_time
    assert full.tp_comm[0] > none.tp_comm[0]  # the recomputed forward's collectives open more TP bubbles


def test_encoder_load_is_one_field_read_everywhere():
    cfg = load_config({**SMALL, "encoders": [{"preset": "vit-l-14", "tokens_per_sample": 4 * 257},
                                             {"preset": "siglip-so400m", "tokens_per_sample": 729}]})
    assert [e.images_per_sample for e in cfg.encoders] == [4, 1]
    assert cfg.encoder_images == [8, 2]  # per encoder: the micro batch's images
    one = load_config({**SMALL, "encoders": [{"preset": "vit-l-14", "tokens_per_sample": 257}]})
    four = load_config({**SMALL, "encoders": [{"preset": "vit-l-14", "tokens_per_sample": 4 * 257}]})
    assert model_flops(four) > model_flops(one)
    with pytest.raises(ValueError, match=r"encoders\[0\].tokens_per_sample: 300 is not a whole number of images "
                                         r"of 257 tokens \(vit-l-14\)"):
        load_config({**SMALL, "encoders": [{"preset": "vit-l-14", "tokens_per_sample": 300}]})


def test_config_fields_name_the_key():
    with pytest.raises(ValueError, match="training.recompute: 'all' is not one of none, selective, full"):
        with_recompute("all")
    with pytest.raises(ValueError, match="baselines: 'alpa' is not one of megatron, megatron_balanced"):
        load_config({**SMALL, "baselines": {"alpa": {"vpp": 1}}})
    with pytest.raises(ValueError, match=r"baselines.megatron.dp: 2 differs from llm_plan.dp \(1\)"):
        load_config({**SMALL, "baselines": {"megatron": {"dp": 2, "pp": 2}}})
    with pytest.raises(ValueError, match="baselines.megatron.schedule: '2f2b'"):
        load_config({**SMALL, "baselines": {"megatron": {"schedule": "2f2b"}}})
    with pytest.raises(ValueError, match="cluster.calibration: 3 is not a file name"):
        load_config({**SMALL, "cluster": {**SMALL["cluster"], "calibration": 3}})


def test_a_baseline_runs_on_its_own_plan():
    doc = {**SMALL, "llm_plan": {"dp": 1, "pp": 4, "tp": 2, "vpp": 2, "schedule": "interleaved_1f1b"},
           "baselines": {"megatron": {"vpp": 1, "schedule": "1f1b"}}}
    cfg = load_config(doc)
    assert cfg.baseline_plan("megatron").schedule == "1f1b" and cfg.baseline_plan("megatron").vpp == 1
    assert cfg.baseline_plan("megatron_balanced") == cfg.llm_plan
    report = plan(cfg, workers=1)
    assert report.baselines["megatron"].timeline.chunks == 1 and "1f1b" in report.baselines["megatron"].layout
    assert report.baselines["megatron_balanced"].timeline.chunks == 2
    same = plan(load_config({**doc, "baselines": {}}), workers=1)
    assert same.baselines["megatron"].timeline.chunks == 2
    assert same.baselines["megatron"].step_time != report.baselines["megatron"].step_time


def test_uneven_layer_splits_are_simulated():
    cfg = load_config({**SMALL, "llm_plan": {"dp": 1, "pp": 4, "tp": 2, "vpp": 3, "schedule": "interleaved_1f1b"}})
    step = LLMStep.of(cfg)  # 32 layers over 12 virtual stages: the first 8 hold 3, the rest 2
    assert step.chunk_layers.sum() == 32 and sorted(step.chunk_layers.ravel().tolist()) == [2] * 4 + [3] * 8
    assert step.chunk_layers[:, :2].min() == 3 and step.chunk_layers[:, 2].max() == 2


# ---- the calibration file a config names ------------------------------------------------------

def write_config(tmp_path, calibration):
    import yaml

    doc = {**SMALL, "cluster": {**SMALL["cluster"], "calibration": "cluster.json"}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    if calibration is not None:
        (tmp_path / "cluster.json").write_text(calibration if isinstance(calibration, str) else json.dumps(calibration))
    return path


GOOD = {"format": "pybubble.calibration/1", "hardware": "h100", "compute_factor": 0.5, "comm_factor": 0.8}


def test_the_calibration_file_is_found_beside_the_config_and_scales_the_roofline(tmp_path):
    cfg = load_config(write_config(tmp_path, GOOD))
    assert cfg.cluster.calibration == str(tmp_path / "cluster.json")
    slow, plain = LLMStep.of(cfg), LLMStep.of(load_config(SMALL))
    assert (slow.costs.compute_factor, slow.costs.comm_factor) == (0.5, 0.8)
    gemm = next(k for k in decompose_layer(cfg.llm, 2, 2048, tp=2) if k.kind == "gemm")
    overhead = plain.costs.hardware.efficiency["gemm"].overhead_us
    assert slow.costs.kernel_time(gemm) - overhead == pytest.approx(2 * (plain.costs.kernel_time(gemm) - overhead))
    assert slow.costs.collective_time("all_gather", 1e9, 64) > plain.costs.collective_time("all_gather", 1e9, 64)
    assert slow.timeline.step_time > plain.timeline.step_time


@pytest.mark.parametrize("content,message", [
    (None, "cluster.calibration: .*cluster.json: no such file"),
    ("{not json", "cluster.calibration: .*cluster.json: not valid JSON"),
    ({"format": "pybubble.problem/1"}, "cluster.calibration: .*cluster.json: format: 'pybubble.problem/1' is not"),
    ({"format": "pybubble.calibration/1"}, "calibrates nothing: no kinds, no op_factors and none of compute_factor, comm_factor"),
    ({**GOOD, "compute_factor": 1.5}, "cluster.calibration: .*compute_factor: 1.5 is not in \\(0, 1\\]"),
    ({**GOOD, "comm_factor": "fast"}, "comm_factor: 'fast' is not a number"),
    ({**GOOD, "hardware": "a100-80gb"}, "hardware: 'a100-80gb' is not this cost model's 'h100'"),
])
def test_a_missing_or_malformed_calibration_is_one_clear_error(tmp_path, content, message):
    cfg = load_config(write_config(tmp_path, content))
    with pytest.raises(ValueError, match=message):
        LLMStep.of(cfg)
    # the command line: exit 2 and one error line
    r = subprocess.run([sys.executable, "-m", "pybubble", "plan", str(tmp_path / "c.yaml")], capture_output=True,
                       text=True, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: cluster.calibration: ")


def test_a_bad_calibration_changes_nothing():
    costs = CostModel("h100")
    before = (costs.compute_factor, dict(costs.hardware.efficiency))
    bad = {**GOOD, "kinds": {"gemm": {"compute_efficiency": 2.0, "memory_efficiency": 0.5, "overhead_us": 1.0}}}
    with pytest.raises(ValueError, match="kinds.gemm.compute_efficiency: 2.0"):
        costs.load_calibration(bad)
    assert (costs.compute_factor, dict(costs.hardware.efficiency)) == before


def test_encoder_lane_bytes_with_and_without_recomputation():
    from pybubble.problem.encoder import EncoderPlan, EncoderWork

    vit = presets.encoder("vit-l-14")
    plan = EncoderPlan(pp_enc=2, tp_enc=1, pp_llm=4, tp_llm=2)  # 4 pipelines, 12 layers per stage

    def lanes(mode, partition):
        return EncoderWork(vit, plan=plan, micro_batch=8, costs=CostModel("h100"), recompute=mode).lane_bytes(partition)

    states = 6 * vit.params_per_layer * 12
    held = {mode: activation_bytes(vit, 8, vit.tokens, 1, mode) for mode in ("none", "full")}
    for mode in ("none", "full"):
        got = lanes(mode, [3, 0, 1, 0])
        busy = plan.lane(0, 0)  # pipeline 0's first stage: 3 microbatches held at once
        idle = plan.lane(1, 0)  # pipeline 1 runs none: its weights only
        assert got[busy] == pytest.approx(states + 3 * 12 * held[mode] + recompute_bytes(vit, 8, vit.tokens, 1, mode))
        assert got[idle] == pytest.approx(states)
    assert lanes("full", [3, 0, 1, 0]).max() < lanes("none", [3, 0, 1, 0]).max()
