"""bench/runtime_modes.py's work bound of a step: every rank of the busiest replica busy the whole
step with its share of the LLM's stages and of its replica's encoder chunks, plus the work after the
pipeline, from a launch's report."""

import pytest


@pytest.fixture(scope="module")
def runtime_modes(bench_script):
    return bench_script("runtime_modes")


def report(mode="pybubble", pp=2, tp=1, chunks=((3, 1, 0, 2), (3, 1, 0, 2))):
    """A launch's report as the trainer writes it, with only what the bound reads: 2 stages of
    F 10 ms and B 20 ms, a chunk's pieces 4 + 8 ms forward and 6 + 12 ms backward."""
    return {"mode": mode, "pp": pp, "tp": tp, "data": {"chunks": [[list(c)] for c in chunks]},
            "costs": {"stage_fwd_s": [0.010] * 2, "stage_bwd_s": [0.020] * 2, "piece_fwd_s": [0.004, 0.008],
                      "piece_bwd_s": [0.006, 0.012], "grad_sync_s": 0.005, "optimizer_s": 0.003}}


def test_the_bound_shares_the_llm_and_the_chunks_over_the_pipeline(runtime_modes):
    # 4 slots x 2 stages x 30 ms of LLM and 6 chunks x 30 ms of encoder over 2 ranks, then 8 ms
    assert runtime_modes.work_bound_s(report(), 0) == pytest.approx((0.240 + 0.180) / 2 + 0.008)


def test_the_busiest_replica_sets_the_bound(runtime_modes):
    one = report(pp=1, chunks=((3, 1, 0, 2), (1, 1, 0, 0)))
    heavier = report(pp=1, chunks=((3, 1, 0, 2), (4, 1, 0, 2)))
    assert runtime_modes.work_bound_s(heavier, 0) - runtime_modes.work_bound_s(one, 0) == pytest.approx(0.030)


def test_megatron_has_no_encoder_gradient_sum(runtime_modes):
    assert runtime_modes.work_bound_s(report(), 0) - runtime_modes.work_bound_s(report("megatron"), 0) \
        == pytest.approx(0.005)


def test_no_bound_without_varying_data_or_with_tensor_parallelism(runtime_modes):
    assert runtime_modes.work_bound_s({**report(), "data": None}, 0) is None
    assert runtime_modes.work_bound_s(report(tp=2), 0) is None
