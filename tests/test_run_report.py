"""The run report (pybubble.runtime_report/3) and the layout of a step's samples over the slots, as the
runtime makes them, without torch: a report made from step records reads back, a file of another
format or without its fields is refused by name; a layout keeps every sample once and the choice
takes the layout predicted shortest."""

import json

import numpy as np
import pytest

from pybubble.placement.measured import MeasuredCosts
from pybubble.placement.records import FillerStats, LayoutFigures, StepRecord, TPWaitStats, WaitFigures
from pybubble.placement.run_report import REPORT_FORMAT, rank_figures, read_report, run_report
from pybubble.placement.slots import GIVEN, SlotLayout, choose_layout

COSTS = MeasuredCosts(stage_fwd_s=[0.01, 0.01], stage_bwd_s=[0.02, 0.02], p2p_s=0.001, piece_fwd_s=[0.002],
                      piece_bwd_s=[0.004])


def record(step: int, rank: int) -> StepRecord:
    return StepRecord(predicted_s=0.1 + step / 100, start=10.0 * step + rank, plan_s=0.001, sync_s=0.0,
                      filler=FillerStats(filled=step), tp=TPWaitStats(), waits={"pp": WaitFigures(0.01, 0.02),
                                                                                "dp": None, "tp": None},
                      tiles=[3, 1], chunks=[1, 1], layout=LayoutFigures("given", [3, 1], [3, 1]))


def figures(rank: int, steps: int = 4) -> dict:
    return rank_figures([record(s, rank) for s in range(steps)], COSTS, ends=[10.0 * s + 1.5 + rank for s in range(steps)],
                        checksum=1.0 + rank, host="h")


def test_a_report_of_step_records_reads_back(tmp_path):
    report = run_report([figures(0), figures(1)], {"mode": "pybubble", "pp": 2}, chunk_tiles=8)
    assert report["format"] == REPORT_FORMAT and report["mode"] == "pybubble" and report["steps"] == 4
    assert report["step_times_s"] == pytest.approx([1.5 + 1.0, 10.0, 10.0, 10.0])  # the last rank's ends
    assert report["settled_steps"] == [2, 3] and report["param_checksum"] == 3.0
    assert report["data"]["layout"] == ["given"] * 4 and report["data"]["chunk_tiles"] == 8
    assert report["waits"][0]["pp"] == {"waited_s": pytest.approx(0.02), "filled_s": pytest.approx(0.04)}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    (got,) = read_report(path).values()
    assert got.mode == "pybubble" and got.settled_s() == [10.0, 10.0] and got.costs() == COSTS
    path.write_text(json.dumps({"megatron": {**report, "mode": "megatron"}, "pybubble": report}))
    assert list(read_report(path)) == ["megatron", "pybubble"]


@pytest.mark.parametrize("doc, message", [
    ({"format": "pybubble.runtime_report/2"}, "format: 'pybubble.runtime_report/2' is not 'pybubble.runtime_report/3'"),
    ({"format": REPORT_FORMAT, "mode": "coarse"}, "steps: missing"),
    ([1, 2], "expected a report or a dict of reports by mode"),
    ({"pybubble": 3}, "pybubble: expected a JSON object, got int"),
])
def test_a_file_that_is_no_report_is_refused_by_name(tmp_path, doc, message):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message):
        read_report(path)


def test_the_ends_must_be_one_per_recorded_step():
    with pytest.raises(ValueError, match="ends: 3 steps, the runtime recorded 4"):
        rank_figures([record(s, 0) for s in range(4)], COSTS, ends=[1.0, 2.0, 3.0])


def test_a_layout_runs_every_sample_once_slot_by_slot():
    tiles = np.array([5, 0, 2, 7, 1, 1])
    given = SlotLayout.as_given(tiles, 3)
    assert given.name == GIVEN and given.rows == 2 and given.order.tolist() == list(range(6))
    assert given.slot_tiles == given.given_tiles == [5, 9, 2]
    chosen = choose_layout(tiles, 3, predict=lambda per_slot: float(np.max(per_slot)))
    assert sorted(chosen.order.tolist()) == list(range(6)) and chosen.given_tiles == [5, 9, 2]
    assert max(chosen.slot_tiles) == 7 and sum(chosen.slot_tiles) == 16  # the most even slots predict shortest
    assert [len(s) for s in chosen.per_slot(list("abcdef"))] == [2, 2, 2]
    with pytest.raises(ValueError, match="tiles: 5 samples do not fill 3 slots with the same rows"):
        SlotLayout.as_given(tiles[:5], 3)
    with pytest.raises(ValueError, match="per_sample: 2 entries for 6 samples"):
        given.take([1, 2])
