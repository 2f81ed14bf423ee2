"""Planner building blocks: the LLM step of a config and the encoder's problems in its bubbles."""

import pytest

import pybubble
from pybubble.config import load_config
from pybubble.planner import best_plan, candidates, encoder_problem, even_partition, llm_timeline

SMALL = {"cluster": {"gpus": 16, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"},
         "encoders": [{"preset": "vit-l-14"}],
         "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 2048},
         "llm_plan": {"dp": 2, "pp": 4, "tp": 2}}


def test_llm_timeline_follows_the_config():
    cfg = load_config(SMALL)
    tl = llm_timeline(cfg)
    assert tl.stages == 4 and tl.microbatches == cfg.microbatches == 8
    kinds = {b.kind for b in tl.bubbles}
    assert {"pp_warmup", "pp_cooldown", "tp", "dp_allgather", "dp_reducescatter"} <= kinds
    # More microbatches per step: a longer step.
    bigger = load_config({**SMALL, "training": {**SMALL["training"], "global_batch": 64}})
    assert llm_timeline(bigger).step_time > tl.step_time


def test_every_candidate_problem_schedules_validly_and_greedy_beats_coarse():
    cfg = load_config(SMALL)
    tl = llm_timeline(cfg)
    plans = candidates(cfg)
    assert {(p.pp_enc, p.tp_enc) for p in plans} == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)}
    for plan in plans:
        problem = encoder_problem(cfg, tl, plan, even_partition(cfg.microbatches, plan.pipelines))
        greedy, coarse = pybubble.schedule(problem), pybubble.schedule(problem, "coarse")
        assert pybubble.validate(problem, greedy) == []
        assert greedy.step_time <= coarse.step_time
        assert problem.horizon == tl.step_time


def test_best_plan_hides_most_of_a_small_encoder():
    cfg = load_config(SMALL)
    best = best_plan(cfg)
    assert best.schedule.hidden_fraction(best.problem) > 0.5
    assert best.step_time < pybubble.schedule(best.problem, "coarse").step_time


def test_even_partition():
    assert even_partition(8, 3) == [3, 3, 2]
    assert sum(even_partition(16, 16)) == 16


def test_frozen_encoders_have_no_backward_tasks():
    cfg = load_config({**SMALL, "encoders": [{"preset": "vit-l-14", "frozen": True}]})
    best = best_plan(cfg)
    assert (best.problem.arrays()["phase"] == 0).all()
