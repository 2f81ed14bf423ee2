"""The step predicted as data-parallel replicas run it: each replica's plan cut where its
data-parallel collectives meet the other replicas' (placement.step_marks_s), the replicas waiting
for the slowest of each stretch between them (placement.lockstep_s), the collectives' own time
measured (costs.CollectiveHistory, waits.DataParallelWaits.collectives_s). Unit tests of the parts,
then the test trainer on real gloo processes (tiny models, 3 steps): at dp 2 the prediction
counts the collectives and the encoder's gradient sync over the replicas, at dp 1 it does not."""

import math
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pybubble.llm.tables import build_table  # noqa: E402
from pybubble.placement.measured import CollectiveHistory  # noqa: E402
from pybubble.runtime.filler import BubbleFiller  # noqa: E402
from pybubble.placement.marks import lockstep_s, lockstep_waits_s, step_marks_s  # noqa: E402
from pybubble.placement.step_placement import MeasuredCosts, make_placement  # noqa: E402
from pybubble.runtime.waits import DataParallelWaits  # noqa: E402

nan = float("nan")
PLACEMENTS = ("megatron", "coarse", "pybubble")
SKEWED = Path(__file__).resolve().parent / "data" / "skewed_replicas.jsonl"
"""Four samples a step: the first replica's two with 8 tiles each, the second's with 0 and 1."""
MIX_DP2 = ("--dp", 2, "--pp", 1, "--data", "mix", "--microbatches", 4)
MIX_PP2 = ("--ranks", 2, "--data", "mix")
SKEW_DP2 = ("--dp", 2, "--pp", 1, "--data-file", SKEWED)
RUNS = {MIX_DP2: ("megatron", "pybubble"), MIX_PP2: PLACEMENTS, SKEW_DP2: ("megatron", "pybubble")}
TRAINER_RUNS = list(RUNS.items())  # the same runs as test_runtime_varying's: one launch serves both


# -- the replicas' lockstep --------------------------------------------------------------------
def test_one_replica_takes_its_own_compute_whatever_the_meetings():
    marks = [[0.0, 1.0, 3.0, 4.0, 4.5]]  # 3 ops, the last op's end, the compute's end
    assert lockstep_s(marks, [nan] * 4) == 4.5
    assert lockstep_s(marks, [0.0, 0.0, nan, 0.0]) == 4.5
    assert lockstep_s(marks, [nan, 0.25, nan, 0.5]) == 5.25  # the collectives' own time adds


def test_replicas_wait_for_the_slowest_stretch_between_collectives():
    # Two ops each; replica 0's first op is long, replica 1's second: apart they end at 4, but a
    # collective at the second op's start makes each wait for the other once.
    marks = [[0.0, 3.0, 4.0, 4.0], [0.0, 1.0, 4.0, 4.0]]
    assert lockstep_s(marks, [nan, nan, nan]) == 4.0  # they meet at the end only
    assert lockstep_s(marks, [nan, 0.0, nan]) == 6.0  # 3 (replica 0) + 3 (replica 1)
    assert lockstep_s(marks, [0.1, 0.2, 0.3]) == pytest.approx(6.6)
    # the encoder's work after the last op (the drain) differs: the end waits for the longer one
    assert lockstep_s([[0.0, 3.0, 4.0, 5.0], [0.0, 1.0, 4.0, 4.5]], [nan, 0.0, 0.0]) == 7.0
    waits = lockstep_waits_s(marks, [0.1, 0.2, nan])  # who waits how long for the other, where
    assert np.isnan(waits[:, 2]).all() and waits[:, 0].tolist() == [0.0, 0.0]
    assert waits[:, 1].tolist() == [0.0, 2.0]  # replica 1 at op 1 for replica 0's long first op


@pytest.mark.parametrize("marks, meets, message", [
    ([[0.0, 1.0, 2.0]], [nan], r"meets_s: 1 values for 1 ops \(need 2\)"),
    ([[0.0, nan, 2.0]], [nan, nan], r"marks\[0\]\[1\]: nan is not a finite number"),
    ([[0.0, 1.0, 2.0]], [nan, -0.5], r"meets_s\[1\]: -0.5 is not a finite number >= 0"),
    ([0.0, 1.0, 2.0], [nan, nan], r"marks: shape \(3,\) is not one row per replica"),
])
def test_bad_marks_and_meetings_are_refused_naming_the_field(marks, meets, message):
    with pytest.raises(ValueError, match=message):
        lockstep_s(marks, meets)


def costs(**kw) -> MeasuredCosts:
    base = dict(stage_fwd_s=[0.010], stage_bwd_s=[0.020], p2p_s=1e-4, piece_fwd_s=[0.001, 0.002],
                piece_bwd_s=[0.002, 0.004])
    return MeasuredCosts(**{**base, **kw})


def test_megatron_marks_carry_each_microbatchs_own_encoder_work():
    # One stage (pp 1), 1F1B over 3 microbatches: F0 B0 F1 B1 F2 B2; chunks 3, 1, 2 (mean 2).
    c, table = costs(), build_table("1f1b", 1, 3)
    plan = make_placement("megatron", c, 3, table, chunks=[3, 1, 2])
    marks = step_marks_s(plan, 0, c)
    enc_f, enc_b = 0.003, 0.006
    own = [0.010 + 3 * enc_f, 0.020 + 3 * enc_b, 0.010 + enc_f, 0.020 + enc_b, 0.010 + 2 * enc_f, 0.020 + 2 * enc_b]
    assert np.diff(marks[:7]) == pytest.approx(own)  # each op with its own microbatch's chunks
    assert marks[-1] == pytest.approx(plan.timeline.step_time / 1e6)  # the same step as the mean's
    assert marks[6] == marks[7]


@pytest.mark.parametrize("mode", ["coarse", "pybubble"])
def test_filling_modes_mark_the_ops_after_the_front_and_end_with_the_schedule(mode):
    c, table = costs(), build_table("1f1b", 1, 3)
    plan = make_placement(mode, c, 3, table, chunks=[3, 1, 2])
    marks = step_marks_s(plan, 0, c)
    front = plan.schedule.shift_front / 1e6
    starts = [op.start / 1e6 for op in plan.timeline.ops]
    assert marks[:6] == pytest.approx([front + s for s in starts])
    assert marks[6] == pytest.approx(front + plan.timeline.step_time / 1e6)  # the last op's end
    assert marks[7] == pytest.approx(plan.schedule.step_time / 1e6) and marks[7] > marks[6]  # the drain after it
    with pytest.raises(ValueError, match="rank: 1 runs no op"):
        step_marks_s(plan, 1, c)


# -- the collectives' own time ------------------------------------------------------------------
def test_collective_history_takes_what_the_replicas_waited_beyond_the_plan():
    h = CollectiveHistory(keep=3)
    assert all(math.isnan(v) for v in h.meets_s(0, 2))  # nothing seen yet
    h.add(0, [[0.001, nan, 0.004], [0.050, nan, 0.005]])  # a step whose plan predicted nothing
    assert h.meets_s(0, 2)[0] == 0.0 and math.isnan(h.meets_s(0, 2)[1])  # the places count, no time yet
    for late in (0.001, 0.003, 0.002, 0.010):  # the first falls out of the last 3
        # The plan had replica 1 wait 40 ms for replica 0 at op 0; it waited 50: 10 ms beyond,
        # replica 0 `late` beyond its none. After the last op neither was to wait.
        h.expect(0, [[0.0, nan, 0.0], [0.040, nan, 0.0]])
        h.add(0, [[late, nan, 0.004], [0.050, nan, 0.006]])
    got = h.meets_s(0, 2)
    assert got[0] == pytest.approx((0.010 + 0.003) / 2) and math.isnan(got[1])  # the mean, median over steps
    assert got[2] == pytest.approx(0.005)
    h.expect(1, [[nan, 0.0, nan, nan]])
    h.add(1, [[nan, 0.002, nan, nan]])  # another pipeline rank keeps its own
    assert h.meets_s(1, 3)[1] == 0.002 and h.meets_s(0, 2)[0] == pytest.approx(0.0065)
    h.expect(0, [[0.020, nan, 0.0], [0.0, nan, 0.0]])
    h.add(0, [[0.001, nan, 0.004], [0.001, nan, 0.004]])  # waited less than planned: counts as nothing
    assert h.meets_s(0, 2)[0] == pytest.approx(0.006)  # median of 6, 10 and 0 ms (the last 3)
    h.add(0, [[nan, nan, 0.004], [nan, nan, 0.004]])  # the last step had no collective at op 0
    assert math.isnan(h.meets_s(0, 2)[0])
    with pytest.raises(ValueError, match="waits: 2 columns for pipeline rank 0, the last step had 3"):
        h.add(0, [[0.0, 0.0]])
    with pytest.raises(ValueError, match="ops: 4 for pipeline rank 0"):
        h.meets_s(0, 4)
    with pytest.raises(ValueError, match="keep: 0"):
        CollectiveHistory(keep=0)


def test_one_disturbed_step_does_not_move_the_collectives_time():
    h = CollectiveHistory(keep=5)
    h.expect(0, [[0.0, 0.0], [0.0, 0.0]])
    h.add(0, [[0.004, 0.002], [0.006, 0.002]])  # 5 ms at op 0: the collective, a little lateness
    h.expect(0, [[0.0, 0.0], [0.030, 0.0]])
    h.add(0, [[0.004, 0.002], [0.250, 0.002]])  # replica 0 ran its op 220 ms late (the machine's load)
    assert h.meets_s(0, 1)[0] == pytest.approx(0.005)  # of two steps the smaller
    h.expect(0, [[0.0, 0.0], [0.0, 0.0]])
    h.add(0, [[0.005, 0.002], [0.007, 0.002]])
    assert h.meets_s(0, 1)[0] == pytest.approx(0.006)  # the median of three


def test_the_collectives_before_the_step_count_as_the_last_rank_to_reach_them_saw_them():
    from pybubble.placement.measured import CostHistory, StepSample

    initial = MeasuredCosts(stage_fwd_s=[1.0, 1.0], stage_bwd_s=[2.0, 2.0], p2p_s=0.0, piece_fwd_s=[0.1],
                            piece_bwd_s=[0.2])
    history = CostHistory(initial, keep=3)

    def sample(outside, agree):
        return StepSample(stage_fwd=[1.0, nan], stage_bwd=[2.0, nan], stage_wgrad=[1.0, nan], lead=0.001, sync=nan,
                          outside=outside, plan=0.002, piece_fwd=[0.1], piece_bwd=[0.2], agree=agree).vector()

    # rank 1 finished early and waited for rank 0 at the collectives before the next step: its
    # agree holds that wait, rank 0's only the collectives themselves
    history.add(np.stack([sample(0.010, 0.003), sample(0.004, 0.090)]))
    assert history.costs().optimizer_s == pytest.approx(0.013 + 0.003)
    history.add(np.stack([sample(0.010, nan), sample(0.004, nan)]))  # not measured (the profiling step): none
    history.add(np.stack([sample(0.012, 0.005), sample(0.004, 0.080)]))
    assert history.costs().optimizer_s == pytest.approx(0.016)  # median of 0.016, 0.013, 0.020


class DoneWork:
    """A collective's work that completes ``after_s`` after its wait is called."""

    def __init__(self, after_s):
        self.after_s = after_s

    def wait(self):
        time.sleep(self.after_s)
        return True


def test_data_parallel_waits_say_where_the_last_completed_step_met():
    waits = DataParallelWaits()
    assert all(math.isnan(v) for v in waits.collectives_s(2))  # no step completed
    filler = BubbleFiller.with_gaps([], [0.0, 0.0, 0.0], [("F", 0), ("B", 0)], horizon_s=1.0, fill=False)
    waits.begin_step(filler)
    filler.progress.op_begin()
    waits([DoneWork(0.02)])  # inside F0: an all-gather
    filler.progress.op_end()
    filler.progress.op_begin()
    filler.progress.op_end()
    waits([DoneWork(0.01)])  # after the last op: a reduce-scatter
    waits([DoneWork(0.01)])
    waits.end_step(completed=True)
    got = waits.collectives_s(2)
    assert got[0] == pytest.approx(0.02, abs=0.015) and math.isnan(got[1])
    assert got[2] == pytest.approx(0.02, abs=0.02) and got[2] >= 0.02
    assert filler.stats.dp_waits == 3
    waits.begin_step(filler)
    waits([DoneWork(0.0)])
    waits.end_step(completed=False)  # a failed step leaves the last one's
    assert waits.collectives_s(2)[2] == got[2]


# -- the test trainer on real processes --------------------------------------------------------
def test_the_prediction_at_dp_2_counts_the_collectives_and_the_encoders_sync_over_the_replicas(trainer_reports):
    dp2 = trainer_reports(*MIX_DP2, modes=RUNS[MIX_DP2])
    for mode, report in dp2.items():
        for rank in report["predicted_dp_s"]:  # FSDP2's all-gathers and reduce-scatters, measured
            assert rank["collectives_s"] > 0 and rank["replicas_s"] >= 0, mode
        # the encoder's gradient averaged over the replicas, megatron's too (its one copy per replica)
        assert report["costs"]["grad_sync_s"] > 0, mode
        step = report["settled_steps"][-1]
        assert report["predicted_steps_s"][step] > max(r["collectives_s"] for r in report["predicted_dp_s"])
    pp2 = trainer_reports(*MIX_PP2, modes=RUNS[MIX_PP2])
    for mode, report in pp2.items():  # one replica: nothing to meet
        assert report["predicted_dp_s"] == [{"collectives_s": 0.0, "replicas_s": 0.0}] * 2, mode
    assert pp2["megatron"]["costs"]["grad_sync_s"] == 0.0  # the encoder on one rank, one replica: no sync


def test_a_light_replica_is_predicted_to_wait_for_the_heavy_one(trainer_reports):
    # megatron keeps each replica's samples: 16 tiles on replica 0, 1 on replica 1 (pp 1: rank r is
    # replica r). Replica 1 waits for replica 0 at every collective.
    report = trainer_reports(*SKEW_DP2, modes=RUNS[SKEW_DP2])["megatron"]
    heavy, light = report["predicted_dp_s"]
    assert light["replicas_s"] > 0 and light["replicas_s"] > heavy["replicas_s"] + 1e-4
