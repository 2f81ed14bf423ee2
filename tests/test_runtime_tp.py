"""Tensor parallelism in the runtime: the trainer's LLM tensor-parallel over the mesh's "tp"
dimension (real gloo processes, tiny models, a few steps), the filler inside the waits of real
functional collectives (two processes), and TP gaps in the predicted step."""

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")

from pybubble.runtime import MeasuredCosts, consumer_delays, make_placement, predict_step_s  # noqa: E402

PLACEMENTS = ("megatron", "coarse", "pybubble")
TP_ALONE = ("--tp", 2)
PP_TP = ("--pp", 2, "--tp", 2)
PP_TP_INTERLEAVED = ("--pp", 2, "--tp", 2, "--schedule", "interleaved_1f1b", "--chunks", 2)
TRAINER_RUNS = [(TP_ALONE, PLACEMENTS), (PP_TP, PLACEMENTS), (PP_TP_INTERLEAVED, ("pybubble",))]
"""The example's configurations these tests train (trainer_reports trains those of one world size
in one launch)."""


def test_tp_alone_three_modes_reach_the_single_process_parameters(trainer_reports):
    # 2 processes: one pipeline stage, tensor-parallel over 2 ranks; the reference is the same model
    # unsplit in one process.
    reports = trainer_reports(*TP_ALONE, timeout=300)
    reference = reports["megatron"]["reference_checksum"]
    for mode, rep in reports.items():
        assert rep["tp"] == 2 and len(rep["tp_waits"]["per_rank"]) == 2
        assert rep["param_checksum"] == pytest.approx(reference, rel=1e-5), mode
        assert rep["param_checksum"] == pytest.approx(reports["megatron"]["param_checksum"], rel=1e-5), mode
        # tiny: 2 microbatches x (F + B) x 2 layers x 2 collectives, one settled step
        assert [r["waits"] for r in rep["tp_waits"]["per_rank"]] == [16, 16], mode
        assert rep["costs"]["tp_count"] == 4 and rep["costs"]["tp_gap_s"] > 0, mode
    assert all(r["filled"] == 0 for m in ("megatron", "coarse") for r in reports[m]["tp_waits"]["per_rank"])


def test_pp_and_tp_three_modes_agree_with_tp_1(pp2_reports, trainer_reports):
    # 4 processes on 2 cores: a correctness run. tp 1: the 2-rank pipeline (pp 2) of the same GPT.
    base = pp2_reports["pybubble"]
    reports = trainer_reports(*PP_TP, timeout=300)
    for mode in PLACEMENTS:
        rep = reports[mode]
        assert rep["param_checksum"] == pytest.approx(base["param_checksum"], rel=1e-5), mode
        assert rep["param_checksum"] == pytest.approx(base["reference_checksum"], rel=1e-5), mode
        assert [r["waits"] for r in rep["tp_waits"]["per_rank"]] == [16] * 4, mode
    # two stages per rank (interleaved 1F1B), each tensor-parallel: 1 block per stage
    rep = trainer_reports(*PP_TP_INTERLEAVED, modes=("pybubble",), timeout=300)["pybubble"]
    assert rep["param_checksum"] == pytest.approx(base["param_checksum"], rel=1e-5)
    assert [r["waits"] for r in rep["tp_waits"]["per_rank"]] == [16] * 4
    assert rep["costs"]["tp_count"] == 2


WORKER = textwrap.dedent("""
    import json, sys, time, datetime
    import torch, torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from pybubble.runtime import (BubbleFiller, FillTask, PipelineWaits, TensorParallelWaits, exit_rank,
                                  fill_tp_waits)
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    t = time.perf_counter()
    sum(range(1_000_000))
    HOG = int(0.6 / (time.perf_counter() - t) * 1_000_000)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    group = dist.new_group([0, 1])
    w = torch.ones(64, 64, requires_grad=True)
    x = torch.randn(256, 64)
    grads = []

    def honest(i):  # torch ops, which release the GIL: about 0.1 s, measured at 0.1 s
        def run():
            t = time.perf_counter()
            while time.perf_counter() - t < 0.1:
                (x @ (w * i)).sum().backward()  # a piece records autograd graphs in the wait
            grads.append(i)
        return FillTask(name=f"t{i}", duration_s=0.1, planned_start_s=0.001 * i, run=run)

    def hog():  # holds the GIL for about 0.6 s in one C call, measured at 10 ms
        def run():
            sum(range(HOG))
            grads.append(0)
        return FillTask(name="t0", duration_s=0.01, planned_start_s=0.0, run=run)

    # Rank 0 fills; rank 1 launches the first collective 0.15 s late and the second 1 s after it.
    tasks = [hog()] + [honest(i) for i in range(1, 16)] if rank == 0 else []
    # Warm-up: the first functional collective (and pybubble.runtime's modules, imported when first
    # used) load their lazy imports here, not inside the op measured below.
    import pybubble.runtime.encoder_runtime
    float((funcol.all_reduce(torch.ones(4), "sum", group) + 0).sum())
    # Both ranks here before the op begins: a wait for the other rank outside the op's collectives
    # would count as the op's own time (under load rank 1 can reach a barrier inside the op 0.3 s late).
    dist.barrier()
    filler = BubbleFiller.with_gaps(tasks, [0.0, 0.0], [("F", 0)], horizon_s=10.0, fill=rank == 0)
    filler.record_trace()
    filler.progress.begin_step()
    filler.progress.op_begin()
    waits = TensorParallelWaits(filler, gap_s=0.5, op_idle_s=2.0)
    values = []
    with fill_tp_waits(waits):
        for late in (0.15, 1.0):
            if rank == 1:
                time.sleep(late)
            r = funcol.all_reduce(torch.ones(4), "sum", group)
            values.append(float((r + 0).sum()))  # the first use: the wait
    filler.progress.op_end()
    filler.progress.end_pipeline()
    filler.drain()
    s = waits.finish()
    print(json.dumps({"values": values, "launched": s.launched_s, "resumed": s.resumed_s,
                      "in_flight": s.in_flight_s, "gaps": s.gaps_s, "filled": s.filled, "filled_s": s.filled_s,
                      "pieces": s.pieces, "per_op": s.per_op, "grads": grads, "busy": filler.progress.op_busy_s,
                      "trace": filler.trace, "remaining": filler.remaining}))
    dist.destroy_process_group()
    # Functional collectives' works can outlive destroy_process_group into the interpreter's
    # finalization and abort the process there (exit -6 now and then): end without it.
    exit_rank(0)
""")


def test_idle_worker_fills_tp_waits_and_a_consumer_waits_for_no_piece(two_ranks):
    outs = [json.loads(o) for o, _ in two_ranks(WORKER, timeout=120)]
    mine, late = outs
    assert mine["values"] == [8.0, 8.0] and late["values"] == [8.0, 8.0]  # the collectives' results
    assert mine["per_op"] == [2] and mine["remaining"] == 0
    assert mine["grads"] == list(range(16))  # every piece ran, in plan order
    assert mine["filled"] == 16 and len(mine["pieces"]) == 16  # launched at the first wait (op_idle_s: room)
    assert all(p[1] > 0.0 for p in mine["pieces"])  # a piece's time: the worker's CPU time in it
    # The worker ran inside the waits (its CPU time there).
    assert 0.1 < mine["filled_s"] <= sum(mine["gaps"])
    # Lag: from the group's last launch of a collective to the consumer's resumption.
    lags = [r - max(a, b) for r, a, b in zip(mine["resumed"], mine["launched"], late["launched"])]
    # 1. The GIL hog (0.6 s in one C call, measured at 10 ms) was running when the first collective
    #    completed (0.15 s): the consumer resumed when it let go of the GIL, an overrun ...
    assert lags[0] > 0.2
    # 2. ... honest pieces (torch ops, measured at 0.1 s) were running in the second: the consumer
    #    took its core and the GIL back at once, within one piece's measured duration.
    assert mine["in_flight"][1] == 0.1 and lags[1] < 0.1
    delays = consumer_delays([mine["launched"], late["launched"]], [mine["resumed"], late["resumed"]],
                             [mine["in_flight"], late["in_flight"]])
    assert delays[0]["overruns"] >= 1 and delays[0]["waits"] == 2 and delays[1]["delays"] == 0
    assert mine["busy"][0] < 0.1  # the op's own time leaves the waits out


def test_consumer_delays_against_the_group_s_last_launch():
    nan = float("nan")
    launched = [[0.0, 1.0, 2.0, 3.0, 4.0, nan], [0.5, 1.0, 2.5, 3.0, 4.0, 5.0]]
    # rank 0 resumes 1 ms after each last launch, except wait 3 (+20 ms, a 5 ms piece in flight) and
    # wait 4 (+3 ms, a 5 ms piece in flight); wait 5 is unmeasured (a launch before the hooks)
    resumed = [[0.501, 1.001, 2.501, 3.020, 4.003, 5.5], [0.501, 1.001, 2.501, 3.001, 4.001, 5.5]]
    in_flight = [[0.0, 0.0, 0.005, 0.005, 0.005, 0.005], [0.0] * 6]
    d = consumer_delays(launched, resumed, in_flight)
    assert d[0]["waits"] == d[1]["waits"] == 5
    assert d[0]["delays"] == 2 and d[0]["overruns"] == 1  # 19 ms > 5 ms; 2 ms is within the piece
    assert d[0]["delay_s"] == pytest.approx(0.019 + 0.002) and d[0]["delay_max_s"] == pytest.approx(0.019)
    assert d[0]["lag_free_s"] == pytest.approx([0.001, 0.001, 0.001])
    assert d[0]["lag_s"][0] == pytest.approx(0.003) and d[0]["lag_s"][2] == pytest.approx(0.020)
    assert d[1] == {"waits": 5, "delays": 0, "delay_s": 0.0, "delay_max_s": 0.0, "overruns": 0, "lag_s": [],
                    "lag_free_s": pytest.approx([0.001, 0.001, 0.001])}
    with pytest.raises(ValueError, match="consumer_delays: the ranks' waits differ in number"):
        consumer_delays([[0.0], [0.0, 1.0]], [[0.0], [0.0, 1.0]], [[0.0], [0.0, 1.0]])


def test_tp_gaps_in_the_prediction_take_pieces():
    # One stage, tensor-parallel: the only bubbles are the TP gaps inside the ops.
    costs = MeasuredCosts(stage_fwd_s=[0.01], stage_bwd_s=[0.02], p2p_s=0.0, piece_fwd_s=[1e-4] * 6,
                          piece_bwd_s=[1.5e-4] * 6, tp_count=4, tp_gap_s=5e-4)
    plan = make_placement("pybubble", costs, 4)
    tp = [b for b in plan.timeline.bubbles if b.kind == "tp"]
    assert len(tp) == 4 * 2 * 4 and all(b.end - b.start == pytest.approx(500.0) for b in tp)
    # the ops keep their measured compute and gain the gaps
    assert plan.timeline.step_time == pytest.approx(4 * (0.01 + 0.02 + 2 * 4 * 5e-4) * 1e6)
    starts = plan.start_s * 1e6
    inside = sum(any(b.start - 1e-6 <= s and s + 100.0 <= b.end + 1e-6 for b in tp) for s in starts)
    assert inside >= len(starts) // 2  # most pieces go into TP gaps
    coarse = predict_step_s("coarse", costs, 4)
    assert predict_step_s("pybubble", costs, 4) < coarse - 0.5 * sum(costs.piece_fwd_s + costs.piece_bwd_s) * 4
    no_tp = MeasuredCosts(stage_fwd_s=[0.01], stage_bwd_s=[0.02], p2p_s=0.0, piece_fwd_s=[1e-4] * 6,
                          piece_bwd_s=[1.5e-4] * 6)
    assert predict_step_s("pybubble", no_tp, 4) == pytest.approx(predict_step_s("coarse", no_tp, 4))
    # Heavy-tailed gaps: the ops wait count x mean in all, the free windows are gaps of the median.
    tail = MeasuredCosts(stage_fwd_s=[0.01], stage_bwd_s=[0.02], p2p_s=0.0, piece_fwd_s=[1e-4] * 6,
                         piece_bwd_s=[1.5e-4] * 6, tp_count=4, tp_gap_s=5e-4, tp_wait_s=2e-3)
    timeline = make_placement("coarse", tail, 4).timeline
    assert timeline.step_time == pytest.approx(4 * (0.01 + 0.02 + 2 * 4 * 2e-3) * 1e6)
    assert all(b.end - b.start == pytest.approx(500.0) for b in timeline.bubbles if b.kind == "tp")


def test_tp_gaps_in_a_multi_stage_prediction_and_split_backwards_refused():
    from pybubble.llm.tables import build_table

    # interleaved 1F1B, 2 ranks x 2 stages: every F and B of every stage holds the TP gaps
    costs = MeasuredCosts(stage_fwd_s=[0.01] * 4, stage_bwd_s=[0.02] * 4, p2p_s=0.0, piece_fwd_s=[1e-4] * 6,
                          piece_bwd_s=[1.5e-4] * 6, tp_count=2, tp_gap_s=5e-4)
    table = build_table("interleaved_1f1b", 2, 4, 2)
    plan = make_placement("pybubble", costs, 4, table)
    tp = [b for b in plan.timeline.bubbles if b.kind == "tp"]
    assert len(tp) == 2 * 4 * 2 * 2 * 2  # ranks x microbatches x stages per rank x (F, B) x count
    ops = {(op.stage, op.kind): op.end - op.start for op in plan.timeline.ops}
    assert ops[3, "F"] == pytest.approx((0.01 + 2 * 5e-4) * 1e6) and ops[0, "B"] == pytest.approx((0.02 + 1e-3) * 1e6)
    assert predict_step_s("pybubble", costs, 4, table) <= predict_step_s("coarse", costs, 4, table)
    # a table that splits backwards (I, W): how TP waits fall on them is not measured
    with pytest.raises(ValueError, match="tp_count: 2 TP collectives per op, but the table splits backwards"):
        make_placement("pybubble", costs, 4, build_table("zbv", 2, 4))


def test_tp_costs_are_checked():
    with pytest.raises(ValueError, match="tp_count: -1 is not an integer >= 0"):
        MeasuredCosts(stage_fwd_s=[1.0], stage_bwd_s=[1.0], p2p_s=0.0, piece_fwd_s=[1.0], piece_bwd_s=[1.0],
                      tp_count=-1)
    with pytest.raises(ValueError, match="tp_gap_s"):
        MeasuredCosts(stage_fwd_s=[1.0], stage_bwd_s=[1.0], p2p_s=0.0, piece_fwd_s=[1.0], piece_bwd_s=[1.0],
                      tp_gap_s=float("nan"))
