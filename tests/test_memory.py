"""Memory per GPU: activations held on the simulated timeline, model states, the encoder's share."""

import numpy as np
import pytest

from pybubble.config.schema import load_config
from pybubble.costs.roofline import CostModel
from pybubble.llm.step import LLMStep, activation_peak
from pybubble.llm.timeline import simulate_pipeline
from pybubble.problem.encoder import EncoderPlan, EncoderWork


@pytest.mark.parametrize(("schedule", "expected"), [("gpipe", [6, 6, 6, 6]), ("1f1b", [4, 3, 2, 1])])
def test_activation_peak_counts_microbatches_in_flight(schedule, expected):
    tl = simulate_pipeline(schedule, ranks=4, microbatches=6)
    assert activation_peak(tl, np.ones((4, 1))).tolist() == expected


def test_zero_bubble_frees_at_the_weight_gradient():
    tl = simulate_pipeline("zb_h1", ranks=4, microbatches=8)
    peak = activation_peak(tl, np.ones((4, 1)))
    assert peak[0] >= 4 and np.all(peak >= 1)


CFG = {"cluster": {"gpus": 8, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"}, "encoders": [{"preset": "vit-l-14"}],
       "training": {"global_batch": 16, "micro_batch": 2, "seq_len": 2048}, "llm_plan": {"dp": 1, "pp": 4, "tp": 2}}


def test_llm_stage_bytes_match_the_formula():
    cfg = load_config(CFG)
    step = LLMStep.of(cfg)
    llm = cfg.llm
    layers = llm.layers // 4
    states = 6 * llm.params_per_layer * layers / 2
    act = 34 * 2048 * 2 * llm.hidden / 2 * layers
    assert step.memory == pytest.approx(states + act * np.array([4, 3, 2, 1]))
    assert step.stage_memory(step.timeline) == pytest.approx(step.memory)


def test_encoder_lane_bytes_grow_with_the_partition_and_frozen_keeps_weights_only():
    cfg = load_config(CFG)
    plan = EncoderPlan(pp_enc=2, tp_enc=1, pp_llm=4, tp_llm=2)  # 4 pipelines

    def work(config):
        return EncoderWork([e.model for e in config.encoders], plan=plan, micro_batch=config.encoder_images,
                           costs=CostModel("h100"), frozen=[e.frozen for e in config.encoders])

    few, many = work(cfg).lane_bytes([1, 1, 1, 1]), work(cfg).lane_bytes([4, 0, 0, 0])
    assert many.max() > few.max() and few.sum() == pytest.approx(many.sum())  # same work, piled up
    frozen = work(load_config({**CFG, "encoders": [{"preset": "vit-l-14", "frozen": True}]}))
    a, b = frozen.lane_bytes([1, 1, 1, 1]), frozen.lane_bytes([4, 0, 0, 0])
    assert a.sum() == pytest.approx(b.sum())  # no activations kept
    enc = cfg.encoders[0].model
    assert a.sum() == pytest.approx(2 * enc.params_per_layer * enc.layers * 4)  # 2 bytes x 4 pipelines' copies


def _peak_by_hand(timeline, held):
    """The peak per rank walked op by op in Python: F takes, the op that frees (W where the table
    splits one off, else B or I) gives back; at equal times the frees first."""
    split = {(o.rank, o.chunk, o.microbatch) for o in timeline.ops if o.kind == "W"}
    events = {r: [] for r in range(timeline.ranks)}
    for o in timeline.ops:
        w = float(held[o.rank, o.chunk])
        if o.kind == "F":
            events[o.rank].append((o.start, w))
        elif o.kind == "W" or (o.kind in ("B", "I") and (o.rank, o.chunk, o.microbatch) not in split):
            events[o.rank].append((o.end, -w))
    peak = np.zeros(timeline.ranks)
    for r, ev in events.items():
        now = 0.0
        for _, delta in sorted(ev):
            now += delta
            peak[r] = max(peak[r], now)
    return peak


@pytest.mark.parametrize("schedule,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1),
                                             ("zbv", 2)])
def test_activation_peak_equals_a_walk_by_hand(schedule, chunks):
    rng = np.random.default_rng(7)
    tl = simulate_pipeline(schedule, ranks=4, microbatches=8, chunks=chunks, fwd=1.0, bwd=2.0,
                           wgrad=1.0 if schedule in ("zb_h1", "zbv") else None)
    held = rng.uniform(1.0, 3.0, (4, chunks))
    assert np.array_equal(activation_peak(tl, held), _peak_by_hand(tl, held))
