"""The layouts pybubble is compared with: Megatron's encoder on stage 0, the balanced layer split,
and their memory."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner import layouts as baselines

SMALL = {"cluster": {"gpus": 16, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"},
         "encoders": [{"preset": "vit-h-14", "tokens_per_sample": 1028}],
         "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 2048},
         "llm_plan": {"dp": 2, "pp": 4, "tp": 2, "vpp": 2, "schedule": "interleaved_1f1b"}}


def _best_bottleneck(costs, parts):
    n = len(costs)
    best = np.inf
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(costs[a:b].sum() for a, b in zip(bounds, bounds[1:])))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=9), st.integers(1, 9))
def test_balanced_cuts_reach_the_brute_force_bottleneck(values, parts):
    costs = np.array(values)
    if parts > len(costs):
        with pytest.raises(ValueError, match="parts"):
            baselines.balanced_cuts(costs, parts)
        return
    ends = baselines.balanced_cuts(costs, parts)
    assert ends[0] == 0 and ends[-1] == len(costs) and len(ends) == parts + 1
    assert np.all(np.diff(ends) >= 1)  # every piece holds a layer
    got = max(costs[a:b].sum() for a, b in zip(ends, ends[1:]))
    assert got == pytest.approx(_best_bottleneck(costs, parts), rel=1e-9)


def test_megatron_slows_the_step_by_a_part_of_the_encoder_work_on_stage_0():
    cfg = load_config(SMALL)
    step = LLMStep.of(cfg)
    alone = step.timeline.step_time
    meg = baselines.megatron(step)
    (layers, f, b), = baselines.encoder_layer_times(step)
    # stage 0 runs the encoder for every microbatch on top of its own work: the pipeline's
    # warm-up and cool-down hide a part of it, never all, and never add more than all
    work = cfg.microbatches * layers * (f + b)
    assert alone + 0.25 * work <= meg.step_time <= alone + work
    frozen = baselines.megatron(LLMStep.of(load_config({**SMALL, "encoders": [{**SMALL["encoders"][0], "frozen": True}]})))
    assert alone < frozen.step_time < meg.step_time


def test_balancing_beats_stage_0_and_spreads_the_encoder():
    step = LLMStep.of(load_config(SMALL))
    meg, bal = baselines.megatron(step), baselines.megatron_balanced(step)
    assert bal.step_time < meg.step_time
    assert bal.memory_bytes < meg.memory_bytes  # the encoder's weights no longer all on stage 0


def test_encoder_tp_falls_back_to_a_divisor_that_splits_the_heads():
    cfg = load_config({**SMALL, "encoders": [{"preset": "vit-3b"}], "llm_plan": {"dp": 1, "pp": 2, "tp": 8},
                       "cluster": {"gpus": 16}})
    assert baselines.encoder_tp(cfg) == 2  # 18 heads
    assert baselines.encoder_tp(load_config(SMALL)) == 2
