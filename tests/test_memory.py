"""Memory per GPU: activations held on the simulated timeline, model states, the encoder's share."""

import numpy as np
import pytest

from pybubble import memory
from pybubble.config import load_config
from pybubble.encoder_plan import EncoderPlan
from pybubble.planner import llm_timeline
from pybubble.timeline import simulate_pipeline


@pytest.mark.parametrize(("schedule", "expected"), [("gpipe", [6, 6, 6, 6]), ("1f1b", [4, 3, 2, 1])])
def test_activation_peak_counts_microbatches_in_flight(schedule, expected):
    tl = simulate_pipeline(schedule, stages=4, microbatches=6)
    assert memory.activation_peak(tl, np.ones((4, 1))).tolist() == expected


def test_zero_bubble_frees_at_the_weight_gradient():
    tl = simulate_pipeline("zb_h1", stages=4, microbatches=8)
    peak = memory.activation_peak(tl, np.ones((4, 1)))
    assert peak[0] >= 4 and np.all(peak >= 1)


CFG = {"cluster": {"gpus": 8, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"}, "encoders": [{"preset": "vit-l-14"}],
       "training": {"global_batch": 16, "micro_batch": 2, "seq_len": 2048}, "llm_plan": {"dp": 1, "pp": 4, "tp": 2}}


def test_llm_stage_bytes_match_the_formula():
    cfg = load_config(CFG)
    tl = llm_timeline(cfg)
    llm = cfg.llm
    layers = llm.layers // 4
    states = 6 * llm.params_per_layer * layers / 2
    act = 34 * 2048 * 2 * llm.hidden / 2 * layers
    assert memory.stage_bytes(cfg, tl) == pytest.approx(states + act * np.array([4, 3, 2, 1]))


def test_encoder_lane_bytes_grow_with_the_partition_and_frozen_keeps_weights_only():
    cfg = load_config(CFG)
    plan = EncoderPlan(pp_enc=2, tp_enc=1, pp_llm=4, tp_llm=2)  # 4 pipelines
    few, many = memory.encoder_lane_bytes(cfg, plan, [1, 1, 1, 1]), memory.encoder_lane_bytes(cfg, plan, [4, 0, 0, 0])
    assert many.max() > few.max() and few.sum() == pytest.approx(many.sum())  # same work, piled up
    frozen = load_config({**CFG, "encoders": [{"preset": "vit-l-14", "frozen": True}]})
    a, b = memory.encoder_lane_bytes(frozen, plan, [1, 1, 1, 1]), memory.encoder_lane_bytes(frozen, plan, [4, 0, 0, 0])
    assert a.sum() == pytest.approx(b.sum())  # no activations kept
    enc = cfg.encoders[0].model
    assert a.sum() == pytest.approx(2 * enc.params_per_layer * enc.layers * 4)  # 2 bytes x 4 pipelines' copies
