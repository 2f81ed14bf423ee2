"""bench/plan_ceiling.py: a step's plan against the exact optimum of its problem and against every
producer and chain split, from a launch's report."""

import json

import pytest

pytest.importorskip("ortools.sat.python.cp_model")


@pytest.fixture(scope="module")
def ceiling(bench_script):
    return bench_script("plan_ceiling")


def report(mode="pybubble", dp=1, chunks=(3, 1, 0, 2)):
    """A launch's report with what the ceiling reads: 2 stages of F 10 ms and B 20 ms, a chunk's
    pieces 4 + 8 ms forward and 6 + 12 ms backward, one settled step."""
    return {"mode": mode, "pp": 2, "dp": dp, "tp": 1, "schedule": "1f1b", "chunks": 1,
            "data": {"chunks": [[list(chunks)]]}, "step_times_s": [0.5], "predicted_steps_s": [0.5],
            "settled_steps": [0],
            "costs": {"stage_fwd_s": [0.010] * 2, "stage_bwd_s": [0.020] * 2, "p2p_s": 0.0005,
                      "piece_fwd_s": [0.004, 0.008], "piece_bwd_s": [0.006, 0.012], "grad_sync_s": 0.005,
                      "optimizer_s": 0.003}}


def test_a_chain_is_whole_on_a_rank_or_split_at_a_chunk_boundary(ceiling):
    choices = ceiling.split_runs([3, 0, 1], 2)
    assert len(choices[0]) == 2 + 2 * 2  # whole on 0 or 1; 1 | 2 or 2 | 1 chunks either way round
    assert ((0, 1, 0), (1, 2, 1)) in choices[0] and choices[1] == [()] and len(choices[2]) == 2


def test_an_image_across_chunks_is_never_split_over_two_ranks(ceiling):
    """A span (an image across several chunks) stays on one rank: chain [1, 2] of 3 chunks splits
    only after its first chunk, and each run keeps its spans."""
    choices = ceiling.split_runs([3], 2, [[1, 2]])
    assert len(choices[0]) == 2 + 2 and ((0, 1, 0), (1, 2, 1)) in choices[0]
    assert not any(len(c) == 2 and c[0][1] == 2 for c in choices[0])
    assert ceiling.run_spans([1, 2], 1, 0) == [1] and ceiling.run_spans([1, 2], 2, 1) == [2]
    assert ceiling.run_spans([1, 2], 3, 0) == [1, 2] and ceiling.run_spans(None, 2, 1) == [1, 1]
    r = report(chunks=(3, 1, 0, 2))
    r["data"]["spans"] = [[[[1, 2], [1], [], [2]]]]
    x = ceiling.step_figures(r, 0, 5.0)
    assert x["exact_s"] <= x["greedy_s"] + 1e-9 and all(
        len(chain) <= 1 or chain[0][1] == 1 for chain in x["split"])  # chain 0 cut after its first chunk only
    assert all(sum(c for _, c, _ in runs) == 3 for runs in choices[0])


def test_no_plan_beats_the_optimum_and_the_search_holds_the_plan(ceiling):
    x = ceiling.step_figures(report(), 0, budget=100.0)
    assert x["exact_optimal"]
    assert x["exact_s"] <= x["greedy_s"] + 1e-6  # times rounded to 1 us: within a few us of exact
    assert x["split_s"] <= x["greedy_s"] + 1e-9  # the plan's own producers are among the choices
    assert x["coarse_plan_s"] >= x["greedy_s"]  # coarse leaves every bubble empty
    assert [sum(c for _, c, _ in chain) for chain in x["split"]] == [3, 1, 0, 2]  # every chunk placed


def test_reports_it_cannot_plan_are_refused_with_one_line(ceiling, tmp_path, capsys):
    path = tmp_path / "modes.json"
    path.write_text(json.dumps({"reports": {"coarse": [report("coarse", dp=2)], "pybubble": [report(dp=2)]}}))
    assert ceiling.main(["--reports", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: reports: dp 2")


def test_a_report_file_prints_the_ratios(ceiling, tmp_path, capsys):
    path = tmp_path / "modes.json"
    path.write_text(json.dumps({"reports": {"coarse": [report("coarse")], "pybubble": [report()]}}))
    assert ceiling.main(["--reports", str(path), "--out", str(tmp_path / "out.json")]) == 0
    assert "at the exact optimum" in capsys.readouterr().out
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["coarse_measured_s"] == 0.5 and len(out["steps"]) == 1


def test_with_replicas_the_busiest_replica_is_held_against_the_fewest_chunks(ceiling, tmp_path, capsys):
    def replicas(chunks, tiles, variant_steps=(0.4,)):
        r = report(dp=2)
        r["data"] = {"chunks": [[list(c)] for c in chunks], "tiles": [[list(t)] for t in tiles], "chunk_tiles": 8}
        r["step_times_s"] = list(variant_steps)
        return r
    # 40 + 22 tiles over 2 replicas: 4 chunks of 8 tiles at least for the busiest (62 / 16 rounded up)
    balanced = replicas([(2, 2), (2, 2)], [(16, 15), (16, 15)])
    uneven = replicas([(3, 2), (1, 1)], [(24, 16), (8, 14)], (0.5,))
    x = ceiling.balance_figures(balanced, 0)
    assert (x["tiles"], x["busiest_chunks"], x["fewest_chunks"]) == (62, 4, 4)
    assert ceiling.balance_figures(uneven, 0)["busiest_chunks"] == 5
    path = tmp_path / "modes.json"
    path.write_text(json.dumps({"reports": {"coarse": [], "pybubble": [balanced], "unbalanced": [uneven]}}))
    assert ceiling.main(["--reports", str(path)]) == 0
    out = capsys.readouterr().out
    assert "pybubble   busiest replica at the fewest chunks in 1 of 1 steps, 0 chunk(s)" in out
    assert "unbalanced busiest replica at the fewest chunks in 0 of 1 steps, 1 chunk(s)" in out
