"""From measured costs to plans and predicted step times (no processes)."""

import pytest

pytest.importorskip("torch")

import pybubble  # noqa: E402
from pybubble.runtime import MeasuredCosts, make_placement, predict_step_s  # noqa: E402
from pybubble.placement.plan import RankPlan, rank_plan  # noqa: E402
from pybubble.placement.step_placement import chain_steps, piece_tasks, step_weights  # noqa: E402


def costs(**kw):
    base = dict(stage_fwd_s=[0.02, 0.02], stage_bwd_s=[0.04, 0.04], p2p_s=0.001,
                piece_fwd_s=[0.002] * 10, piece_bwd_s=[0.004] * 10, optimizer_s=0.003, grad_sync_s=0.01)
    base.update(kw)
    return MeasuredCosts(**base)


def test_megatron_puts_the_encoder_inside_stage_0():
    c = costs()
    plan = make_placement("megatron", c, 4)
    assert plan.producer == [0, 0, 0, 0] and plan.schedule is None
    # Stage 0 does (0.02 + 0.02) + (0.04 + 0.04) per microbatch: the straggler.
    assert predict_step_s("megatron", c, 4) == pytest.approx(plan.timeline.step_time / 1e6 + 0.003)
    assert plan.timeline.step_time / 1e6 > 4 * 0.12


@pytest.mark.parametrize("mode", ["coarse", "pybubble"])
def test_spread_modes_schedule_valid_plans(mode):
    c = costs()
    plan = make_placement(mode, c, 4)
    assert plan.producer == [0, 1, 0, 1]
    assert pybubble.validate(plan.problem, plan.schedule) == []
    assert predict_step_s(mode, c, 4) == pytest.approx(plan.schedule.step_time / 1e6 + 0.013)


def test_pybubble_predicts_a_shorter_step_than_coarse_and_megatron():
    c = costs()
    p = {m: predict_step_s(m, c, 4) for m in ("megatron", "coarse", "pybubble")}
    assert p["pybubble"] <= p["coarse"] < p["megatron"]


def test_piece_tasks_chain_forward_then_backward():
    a = piece_tasks(costs(piece_fwd_s=[1.0, 2.0], piece_bwd_s=[3.0, 4.0]), [1, 0])
    assert a.phase.tolist() == [0, 0, 1, 1] * 2  # fwd, fwd, bwd, bwd
    assert a.duration.tolist() == [1e6, 2e6, 4e6, 3e6] * 2
    assert a.predecessors() == [[], [0], [1], [2], [], [4], [5], [6]]
    assert a.lane.tolist() == [1] * 4 + [0] * 4 and a.microbatch.tolist() == [0] * 4 + [1] * 4


NAMES = [f"p{i}" for i in range(10)]


def test_a_spans_chunks_run_piece_by_piece(tmp_path):
    """An image across several chunks (a span) needs every chunk's piece before the next one's
    attention: its chunks' tasks alternate piece by piece, in the problem and in each rank's plan."""
    assert chain_steps(2, [1, 2], "fwd") == [(0, 0), (0, 1), (1, 0), (2, 0), (1, 1), (2, 1)]
    assert chain_steps(2, [1, 2], "bwd") == [(0, 1), (0, 0), (1, 1), (2, 1), (1, 0), (2, 0)]
    a = piece_tasks(costs(piece_fwd_s=[1.0, 2.0], piece_bwd_s=[3.0, 4.0]), [0], [3], [[1, 2]])
    assert a.duration.tolist() == [x * 1e6 for x in (1, 2, 1, 1, 2, 2, 4, 3, 4, 4, 3, 3)]
    assert a.predecessors() == [[]] + [[i] for i in range(11)]
    c, chunks, spans = costs(), [1, 3, 0, 2], [[1], [1, 2], [], [2]]
    for mode in ("megatron", "coarse", "pybubble"):
        plan = make_placement(mode, c, 4, chunks=chunks, spans=spans)
        assert plan.problem is None or pybubble.validate(plan.problem, plan.schedule) == []
        for r in (0, 1):
            mine = rank_plan(plan, r, c, NAMES)
            assert mine.spans == ((1,), (1, 2), (), (2,))
            for j in (j for j, p in enumerate(plan.producer) if p == r):
                for phase in ("fwd", "bwd"):
                    order = [(t.chunk, t.piece) for t in mine.tasks if t.chain == j and t.phase == phase]
                    assert order == chain_steps(10, spans[j], phase), (mode, j, phase)
            mine.write(tmp_path / "plan.json")
            assert RankPlan.read(tmp_path / "plan.json") == mine
    with pytest.raises(ValueError, match=r"spans: \[\[1\], \[1\]\] do not split each microbatch's chunks \[2, 1\]"):
        make_placement("pybubble", c, 2, chunks=[2, 1], spans=[[1], [1]])


def test_a_span_runs_its_joint_pieces_in_its_first_chunks_task(tmp_path):
    """A piece whose attention spans the span's chunks runs all of them in the first chunk's task:
    that task takes the span's chunks' cost, the others none, in the problem and in each rank's plan."""
    # piece 1 holds an attention; microbatch 0 is one chunk and a span of two
    a = piece_tasks(costs(piece_fwd_s=[1.0, 2.0], piece_bwd_s=[3.0, 4.0]), [0], [3], [[1, 2]], [False, True])
    assert a.duration.tolist() == [x * 1e6 for x in (1, 2, 1, 1, 4, 0, 4, 3, 8, 0, 3, 3)]
    assert step_weights(chain_steps(2, [3], "bwd"), [3], [True, False]).tolist() == [1, 1, 1, 3, 0, 0]
    c, chunks, spans = costs(), [1, 3, 2], [[1], [1, 2], [2]]
    joint = [i % 3 == 1 for i in range(10)]
    with pytest.raises(ValueError, match="joint: 2 entries for 10 pieces"):
        make_placement("pybubble", c, 3, chunks=chunks, spans=spans, joint=[True, False])
    for mode in ("coarse", "pybubble"):
        plan, alone = (make_placement(mode, c, 3, chunks=chunks, spans=spans, joint=x) for x in (joint, None))
        assert pybubble.validate(plan.problem, plan.schedule) == []
        # the same work in all: moved between the tasks of a span
        assert plan.problem.arrays().tasks.duration.sum() == pytest.approx(alone.problem.arrays().tasks.duration.sum())
        span_of = {(1, 0): (0, 1), (1, 1): (1, 2), (1, 2): (1, 2), (2, 0): (0, 2), (2, 1): (0, 2), (0, 0): (0, 1)}
        for r in (0, 1):
            for t in rank_plan(plan, r, c, NAMES).tasks:
                per = (c.piece_fwd_s if t.phase == "fwd" else c.piece_bwd_s)[t.piece]
                first, g = span_of[t.chain, t.chunk]
                want = per if not joint[t.piece] or g == 1 else g * per * (t.chunk == first)
                assert type(t.duration_s) is float and t.duration_s == pytest.approx(want), (mode, t)  # counters add it


def test_rank_plan_gaps_follow_the_timeline():
    plan = make_placement("pybubble", costs(), 4)
    f1 = rank_plan(plan, 1, costs(), NAMES)
    assert len(f1.gaps_s) == 9 and f1.ops[0].key == ("F", 0)
    assert f1.gaps_s[0] == pytest.approx(0.021)  # stage 0's first forward and one p2p
    assert f1.gaps_s[-1] > 0.0  # cool-down
    # The last stage's backward follows its forward without a receive: a wait before F_k must
    # produce what the first stage needs until that B_k ends.
    ops = sorted((op for op in plan.timeline.ops if op.stage == 1), key=lambda op: op.start)
    front = plan.schedule.shift_front / 1e6
    assert f1.ops[0].force_until_s == pytest.approx(front + ops[1].end / 1e6)
    # Stage 0's forwards take no receive: before F0, until F1 ends (B0 waits for a gradient).
    ops0 = sorted((op for op in plan.timeline.ops if op.stage == 0), key=lambda op: op.start)
    assert rank_plan(plan, 0, costs(), NAMES).ops[0].force_until_s == pytest.approx(front + ops0[1].end / 1e6)


def test_rank_plan_holds_each_task_once_and_loads_back_equal(tmp_path):
    c = costs()
    plan = make_placement("pybubble", c, 4)
    ranks = [rank_plan(plan, r, c, NAMES) for r in (0, 1)]
    # every piece of every encoder microbatch, forward and backward, on the rank that produces it
    seen = sorted((t.chain, t.phase, t.piece) for r in ranks for t in r.tasks)
    assert seen == sorted((j, ph, i) for j in range(4) for ph in ("fwd", "bwd") for i in range(10))
    for r in ranks:
        assert all(plan.producer[t.chain] == r.rank for t in r.tasks)
        starts = [t.planned_start_s for t in r.tasks]
        assert starts == sorted(starts)  # plan order
        assert [t.needed_by for t in r.tasks if t.phase == "fwd"] == [plan.assignment[t.chain] for t in r.tasks
                                                                     if t.phase == "fwd"]
        assert sum(t.after_grad for t in r.tasks) == sum(p == r.rank for p in plan.producer)
        r.write(tmp_path / f"rank{r.rank}.json")
        assert RankPlan.read(tmp_path / f"rank{r.rank}.json") == r
    with pytest.raises(ValueError, match="format: 'x' is not 'pybubble.rank_plan/1'"):
        RankPlan.from_json({"format": "x"})
    with pytest.raises(ValueError, match="piece_names: 2 names for 10 pieces"):
        rank_plan(plan, 0, c, ["a", "b"])


def test_the_placement_package_loads_without_torch(tmp_path):
    import subprocess
    import sys

    code = ("import sys, pkgutil, importlib, pybubble.placement as p; "
            "[importlib.import_module(m.name) for m in pkgutil.iter_modules(p.__path__, 'pybubble.placement.')]; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_bad_costs_name_the_field():
    with pytest.raises(ValueError, match=r"piece_bwd_s\[1\]: -1.0 is not a finite number >= 0"):
        costs(piece_bwd_s=[0.1, -1.0] + [0.1] * 8)
    with pytest.raises(ValueError, match="p2p_s: nan"):
        costs(p2p_s=float("nan"))
    with pytest.raises(ValueError, match="mode: 'fast' is not one of megatron, coarse, pybubble"):
        make_placement("fast", costs(), 4)


def torch_schedule(cls_name, rank, ranks, stage_ids, stages, microbatches):
    """A torch.distributed.pipelining schedule over stand-in stages (its action table needs no
    process group)."""
    from types import SimpleNamespace

    from torch.distributed import pipelining

    fake = [SimpleNamespace(group_size=ranks, group_rank=rank, num_stages=stages, stage_index=i, submod=None,
                            is_first=i == 0, is_last=i == stages - 1) for i in stage_ids]
    cls = getattr(pipelining, cls_name)
    return cls(fake[0] if len(fake) == 1 else fake, microbatches)


@pytest.mark.parametrize("cls_name, stage_ids, name, chunks", [
    ("Schedule1F1B", [0], "1f1b", 1),
    ("ScheduleGPipe", [0], "gpipe", 1),
    ("ScheduleInterleaved1F1B", [0, 2], "interleaved_1f1b", 2),
    ("ScheduleZBVZeroBubble", [0, 3], "zbv", 2),
])
def test_schedule_table_reads_the_order_torch_runs(cls_name, stage_ids, name, chunks):
    from pybubble.llm.tables import build_table
    from pybubble.runtime.pipelining import schedule_table

    table = schedule_table(torch_schedule(cls_name, 0, 2, stage_ids, 2 * chunks, 4))
    expected = build_table(name, 2, 4, chunks)
    assert table == {r: [a for a in row if a is not None] for r, row in expected.items()}  # idle steps dropped


def test_zero_bubble_tables_keep_their_split_backwards():
    from pybubble.runtime.pipelining import schedule_table

    table = schedule_table(torch_schedule("ScheduleInterleavedZeroBubble", 0, 2, [0, 2], 4, 4))
    kinds = {a.kind for row in table.values() for a in row}
    assert kinds == {"F", "I", "W"} and all(len(row) == 4 * 2 * 3 for row in table.values())
    with pytest.raises(ValueError, match="schedule: object has no pipeline_order"):
        schedule_table(object())


def test_a_multi_stage_plan_follows_the_schedule_table():
    from pybubble.llm.tables import build_table

    table = build_table("zbv", 2, 4)  # rank 0 holds stages 0 and 3, rank 1 stages 1 and 2
    c = costs(stage_fwd_s=[0.01, 0.02, 0.03, 0.04], stage_bwd_s=[0.02, 0.04, 0.06, 0.08],
              stage_wgrad_s=[0.02, 0.01, 0.03, 0.04])
    plan = make_placement("pybubble", c, 4, table)
    assert plan.timeline.chunks == 2 and plan.first_stage == 0 and plan.producer == [0, 1, 0, 1]
    ops = {(op.stage, op.kind): op.end - op.start for op in plan.timeline.ops}
    assert ops[3, "F"] == pytest.approx(40_000) and ops[3, "W"] == pytest.approx(40_000)
    assert ops[2, "I"] == pytest.approx(30_000)  # I: the backward less its W
    assert ops[0, "I"] == pytest.approx(0.02, abs=1e-3)  # torch's first stage: its whole backward in W
    f1 = rank_plan(plan, 1, c, [f"p{i}" for i in range(len(c.piece_fwd_s))])
    assert [str(op.action) for op in f1.ops] == [str(a) for a in table[1] if a]
    mega = make_placement("megatron", c, 4, table)
    assert mega.producer == [0] * 4
    fwd0 = [op for op in mega.timeline.ops if op.stage == 0 and op.kind == "F"][0]
    assert fwd0.end - fwd0.start == pytest.approx(10_000 + 20_000)  # stage 0's forward holds the encoder's
    assert predict_step_s("pybubble", c, 4, table) < predict_step_s("megatron", c, 4, table)
    with pytest.raises(ValueError, match=r"table: stages \[0, 1, 2, 3\] are not the 2 stages of the costs"):
        make_placement("pybubble", costs(), 4, table)
