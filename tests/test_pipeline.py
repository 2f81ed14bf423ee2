"""The bubble predictor: schedule tables, the C++ pipeline simulator, closed forms, problems on a
timeline."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pybubble
from pybubble.llm import tables
from pybubble.llm.timeline import BUBBLE_KINDS, simulate_pipeline


def names(table):
    return {r: [None if a is None else str(a) for a in row] for r, row in table.items()}


def compact(table):
    return {r: [str(a) for a in row if a is not None] for r, row in table.items()}


def idle(timeline, stage):
    return sum(timeline.bubble_time()[stage].values())


# ---- tables -------------------------------------------------------------------------------------

def test_golden_1f1b():
    assert names(tables.one_f_one_b(3, 4)) == {
        0: ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"],
        1: ["1F0", "1F1", "1B0", "1F2", "1B1", "1F3", "1B2", "1B3"],
        2: ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"],
    }


def test_golden_interleaved():
    assert names(tables.interleaved_1f1b(2, 4, 2)) == {
        0: ["0F0", "0F1", "2F0", "2F1", "0F2", "2B0", "0F3", "2B1", "2F2", "0B0", "2F3", "0B1",
            "2B2", "2B3", "0B2", "0B3"],
        1: ["1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1F2", "1B0", "1F3", "1B1", "3F2", "3B2",
            "3F3", "3B3", "1B2", "1B3"],
    }


def test_golden_zb_h1():
    assert names(tables.zb_h1(2, 3)) == {
        0: ["0F0", "0F1", "0I0", "0W0", "0F2", "0I1", "0W1", "0I2", "0W2"],
        1: ["1F0", "1I0", "1F1", "1I1", "1W0", "1F2", "1I2", "1W1", "1W2"],
    }


def test_golden_zbv():
    assert names(tables.zbv(2, 3)) == {
        0: ["0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "3I1", "3W1", "0I0", "0W0", "3F2", "3I2", "3W2",
            "0I1", "0W1", "0I2", "0W2"],
        1: [None, "1F0", "2F0", "1F1", "2F1", "2I0", "2W0", "1F2", "1I0", "1W0", "2F2", "2I1", "2W1", "1I1",
            "2I2", "1I2", "1W1", "2W2", "1W2"],
    }


def test_zbv_is_a_v_shape_with_every_action_once():
    p, m = 3, 5
    table = compact(tables.zbv(p, m))
    for r, row in table.items():
        assert {tables.Action.parse(a).stage for a in row} == {r, 2 * p - 1 - r}
        assert len(row) == len(set(row)) == 2 * 3 * m


def _torch_rows(name, p, m, v=None):
    vis = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")
    rows = vis.get_schedule_ops(name, p, m, num_stages_per_rank=v)
    out = {}
    for r, row in enumerate(rows):
        names = [str(a) for a in row if a is not None]
        out[r] = [a for a in names if tables._ACTION.match(a)]  # drop REDUCE_GRAD and comms
    return out


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 7), (4, 6)])
def test_gpipe_and_1f1b_equal_torch(p, m):
    assert compact(tables.gpipe(p, m)) == _torch_rows("GPipe", p, m)
    ours, theirs = compact(tables.one_f_one_b(p, m)), _torch_rows("1F1B", p, m)
    for r in range(p - 1):
        assert ours[r] == theirs[r]
    # torch 2.13's Schedule1F1B._get_pipeline_order numbers the last rank's forwards 1..m (it
    # increments the counter before the first forward when there is no warm-up); same order.
    shifted = []
    for a in theirs[p - 1]:
        g, k, mb = tables.Action.parse(a)
        shifted.append(f"{g}{k}{mb - 1 if k == 'F' else mb}")
    assert ours[p - 1] == shifted


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (3, 6, 4), (4, 12, 2)])
def test_interleaved_equals_torch(p, m, v):
    assert compact(tables.interleaved_1f1b(p, m, v)) == _torch_rows("Interleaved1F1B", p, m, v)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (3, 4), (4, 8), (4, 3), (5, 12)])
def test_zbv_equals_torch(p, m):
    assert compact(tables.zbv(p, m)) == _torch_rows("ZBVZeroBubble", p, m, 2)


def test_table_errors_name_the_field():
    with pytest.raises(ValueError, match="schedule: 'nope'"):
        simulate_pipeline("nope")
    with pytest.raises(ValueError, match=r"schedule\[0\]\[1\]: '0X1'"):
        simulate_pipeline({0: ["0F0", "0X1"]})
    with pytest.raises(ValueError, match=r"warmup\[1\]: -1"):
        simulate_pipeline("interleaved_1f1b", ranks=2, microbatches=4, chunks=2, warmup=[1, -1])
    with pytest.raises(ValueError, match="chunks: 3 is not 1 for 1f1b"):
        simulate_pipeline("1f1b", chunks=3)
    with pytest.raises(ValueError, match="fwd: shape"):
        simulate_pipeline("1f1b", ranks=2, fwd=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="p2p: -1"):
        simulate_pipeline("1f1b", p2p=-1.0)
    with pytest.raises(ValueError, match="table: 0F1 is missing"):
        simulate_pipeline({0: ["0F0", "0B0", "0B1"]})


def test_check_table_names_a_cell_with_two_actions_and_tolerates_spaces():
    with pytest.raises(ValueError, match=r"schedule\[0\]\[0\]: '0F0,0B0'"):
        tables.check_table({0: ["0F0,0B0"]})
    with pytest.raises(ValueError, match=r"schedule\[0\]\[1\]: '0Q1'"):  # an Action's fields: when flattened
        tables.flatten(tables.check_table({0: [tables.Action(0, "F", 0), tables.Action(0, "Q", 1)]}))
    for bad in (tables.Action(0, "F", -1), tables.Action(0.5, "F", 0), tables.Action(0, "FB", 0),
                tables.Action(2**31, "F", 0), tables.Action(0, 7, 0)):
        with pytest.raises(ValueError, match=r"schedule\[1\]\[0\]"):
            tables.flatten(tables.check_table({0: ["0F0", None], 1: [bad]}))
    offset, stage, kind, mb = tables.flatten(tables.check_table({0: [" 0F0", None, "0B0 "], 1: ["1F0", "1I0", "1W0"]}))
    assert offset.tolist() == [0, 2, 5] and stage.tolist() == [0, 0, 1, 1, 1]
    assert kind.tolist() == [0, 1, 0, 2, 3] and mb.tolist() == [0] * 5


def test_deadlocked_table_says_who_waits_on_what():
    table = {0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F1", "1B1", "1F0", "1B0"]}
    table[0] = ["0B0", "0F0", "0F1", "0B1"]
    with pytest.raises(ValueError, match=r"deadlocks: rank 0's 0B0 waits on 0F0"):
        simulate_pipeline(table)


def test_user_table_from_csv(tmp_path):
    path = tmp_path / "t.csv"
    rows = tables.one_f_one_b(2, 3)
    path.write_text("\n".join(",".join(str(a or "") for a in rows[r]) for r in range(2)) + "\n")
    assert tables.load_csv(path) == rows
    assert simulate_pipeline(str(path)).step_time == simulate_pipeline("1f1b", ranks=2, microbatches=3).step_time


# ---- closed forms (uniform costs) ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (4, 8), (8, 32), (5, 3)])
def test_gpipe_1f1b_closed_form(name, p, m):
    F, B = 1.25, 2.5  # binary fractions: every sum is exact
    tl = simulate_pipeline(name, ranks=p, microbatches=m, fwd=F, bwd=B)
    assert tl.step_time == (m + p - 1) * (F + B)
    for s in range(p):
        assert idle(tl, s) == (p - 1) * (F + B)


@pytest.mark.parametrize("F,B", [(0.1, 0.3), (3.7, 7.1)])
def test_closed_form_to_rounding(F, B):
    p, m, a, r = 4, 12, 0.7, 1.3
    tl = simulate_pipeline("1f1b", ranks=p, microbatches=m, fwd=F, bwd=B, dp_allgather=a, dp_reducescatter=r)
    assert math.isclose(tl.step_time, (m + p - 1) * (F + B) + a + r, rel_tol=1e-13)
    assert tl.forward_needed[0] == a
    assert math.isclose(tl.grad_ready[0], a + p * (F + B), rel_tol=1e-13)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 32, 12), (3, 9, 3)])
def test_interleaved_closed_form(p, m, v):
    F, B = 0.5, 1.0
    tl = simulate_pipeline("interleaved_1f1b", ranks=p, microbatches=m, chunks=v, fwd=F, bwd=B)
    assert tl.step_time == (m * v + p - 1) * (F + B)


def test_dp_collectives_add_their_time_and_dependency_points():
    p, m, F, B, a, r = 4, 8, 1.0, 2.0, 5.0, 7.0
    tl = simulate_pipeline("1f1b", ranks=p, microbatches=m, fwd=F, bwd=B, dp_allgather=a, dp_reducescatter=r)
    assert tl.step_time == (m + p - 1) * (F + B) + a + r
    assert tl.forward_needed[0] == a
    assert tl.grad_ready[0] == a + p * (F + B)
    frac = tl.bubble_fraction()
    for s in range(p):
        assert frac[s]["dp_allgather"] * tl.step_time == a
        assert frac[s]["dp_reducescatter"] * tl.step_time == r


def test_zb_h1_has_a_third_of_1f1b_bubble():
    p, m = 4, 8
    one = simulate_pipeline("1f1b", ranks=p, microbatches=m, fwd=1.0, bwd=2.0)
    zb = simulate_pipeline("zb_h1", ranks=p, microbatches=m, fwd=1.0, bwd=2.0, wgrad=1.0)
    for s in range(p):
        assert idle(zb, s) == idle(one, s) / 3
    assert zb.step_time < one.step_time


def test_zbv_beats_1f1b_with_the_same_work():
    p, m = 4, 8
    one = simulate_pipeline("1f1b", ranks=p, microbatches=m, fwd=2.0, bwd=4.0)
    v = simulate_pipeline("zbv", ranks=p, microbatches=m, fwd=1.0, bwd=2.0)
    assert v.chunks == 2
    assert v.step_time < one.step_time


def test_bubble_kinds_and_tp():
    p, m = 4, 8
    tl = simulate_pipeline("1f1b", ranks=p, microbatches=m, fwd=100.0, bwd=200.0, tp_comm=(4, 5.0),
                           dp_allgather=10.0, dp_reducescatter=20.0)
    assert tl.step_time == (m + p - 1) * 300.0 + 30.0
    kinds = {b.kind for b in tl.bubbles}
    assert kinds == set(BUBBLE_KINDS) - {"pp_steady"}  # uniform 1F1B idles only in warm-up and cool-down
    with_p2p = simulate_pipeline("1f1b", ranks=p, microbatches=m, fwd=100.0, bwd=200.0, p2p=3.0)
    assert with_p2p.bubble_time()[0]["pp_steady"] > 0  # p2p latency opens steady-state bubbles
    bt = tl.bubble_time()
    for s in range(p):
        assert bt[s]["tp"] == pytest.approx(2 * m * 4 * 5.0)
        assert bt[s]["pp_warmup"] + bt[s]["pp_steady"] + bt[s]["pp_cooldown"] == pytest.approx((p - 1) * 300.0)
    assert bt[p - 1]["pp_warmup"] == pytest.approx((p - 1) * 100.0)
    # Link: busy only during TP and DP collectives.
    busy = tl.step_time - sum(e - s for s, e in tl.link_free.of(0))
    assert busy == pytest.approx(30.0 + 2 * m * 4 * 5.0)
    for op in tl.ops:
        assert op.end > op.start


# ---- warm-up adjustment (Optimus 4.3) -----------------------------------------------------------

def test_warmup_adjustment_defers_forward_points_without_lengthening_the_step():
    p, m, v = 4, 8, 2
    base = simulate_pipeline("interleaved_1f1b", ranks=p, microbatches=m, chunks=v)
    warm = tables.interleaved_warmup(p, m, v)
    assert warm == [10, 8, 6, 4]
    warm[0] -= 1  # stage 0 runs one warm-up forward fewer
    adjusted = simulate_pipeline("interleaved_1f1b", ranks=p, microbatches=m, chunks=v, warmup=warm)
    assert adjusted.step_time == base.step_time
    assert np.all(adjusted.forward_needed >= base.forward_needed)
    # The last microbatches' forward dependency points move later: room for encoder forwards.
    assert adjusted.forward_needed[6] - base.forward_needed[6] == 6.0
    assert adjusted.forward_needed[7] - base.forward_needed[7] == 3.0
    # Stage 0 is idle in (11, 14) by default and in (10, 14) adjusted: an encoder forward of 4
    # fits before a forward dependency point only after the adjustment (F_6 = 16 > 14).
    assert base.compute_free.of(0)[0] == (11.0, 14.0) and adjusted.compute_free.of(0)[0] == (10.0, 14.0)
    task = [{"lane": 0, "duration": 4.0, "resource": "compute", "phase": "fwd", "microbatch": 6, "after": []}]
    for tl, fits in ((base, False), (adjusted, True)):
        problem = pybubble.Problem.on_timeline(tl, task)
        sched = pybubble.schedule_problem(problem)
        assert pybubble.validate(problem, sched) == []
        assert (sched.step_time == tl.step_time) == fits
    # Too few warm-up forwards deadlock the table, and the error says where.
    warm[0] = 7
    with pytest.raises(ValueError, match="waits on"):
        simulate_pipeline("interleaved_1f1b", ranks=p, microbatches=m, chunks=v, warmup=warm)


# ---- problems on a timeline, trace ---------------------------------------------------------------------------

def _encoder_tasks(p, m, lanes_per_stage, fwd_len, bwd_len):
    tasks = []
    for j in range(m):
        prev = None
        for phase, order, length in (("fwd", range(p), fwd_len), ("bwd", reversed(range(p)), bwd_len)):
            for s in order:
                for res in ("compute", "comm"):
                    tasks.append({"lane": s * lanes_per_stage + j % lanes_per_stage,
                                  "duration": length if res == "compute" else length / 4,
                                  "resource": res, "phase": phase, "microbatch": j,
                                  "after": [] if prev is None else [prev]})
                    prev = len(tasks) - 1
    return tasks


def test_problem_on_timeline_schedules_and_validates():
    p, m = 4, 8
    tl = simulate_pipeline("interleaved_1f1b", ranks=p, microbatches=m, chunks=2, fwd=500.0, bwd=1000.0,
                           p2p=5.0, tp_comm=(3, 20.0), dp_allgather=300.0, dp_reducescatter=600.0)
    problem = pybubble.Problem.on_timeline(tl, _encoder_tasks(p, m, 2, 60.0, 120.0), lanes_per_stage=2)
    assert problem.num_lanes == p * 2 and problem.num_microbatches == m
    assert problem.horizon == tl.step_time
    doc = problem.to_dict()
    assert [mb["forward_needed"] for mb in doc["microbatches"]] == tl.forward_needed.tolist()
    assert doc["lanes"][2]["compute_free"] == doc["lanes"][3]["compute_free"]
    for lane in doc["lanes"]:
        for key in ("compute_free", "link_free"):
            w = lane[key]
            assert all(0 <= s < e <= tl.step_time for s, e in w)
            assert all(w[i][1] < w[i + 1][0] for i in range(len(w) - 1))
    sched = pybubble.schedule_problem(problem)
    assert pybubble.validate(problem, sched) == []


def test_problem_on_timeline_errors():
    tl = simulate_pipeline("1f1b", ranks=2, microbatches=2)
    with pytest.raises(ValueError, match=r"tasks\[0\].after: missing"):
        pybubble.Problem.on_timeline(tl, [{"lane": 0, "duration": 1.0, "resource": "compute", "phase": "fwd", "microbatch": 0}])
    with pytest.raises(ValueError, match=r"tasks\[0\].resource: 'gpu'"):
        pybubble.Problem.on_timeline(tl, [{"lane": 0, "duration": 1.0, "resource": "gpu", "phase": "fwd", "microbatch": 0,
                        "after": []}])
    with pytest.raises(ValueError, match="lanes_per_stage: 0"):
        pybubble.Problem.on_timeline(tl, [], lanes_per_stage=0)


@pytest.mark.parametrize("change,message", [
    ({"lane": "x"}, r"tasks\[1\].lane: 'x' is not an integer"),
    ({"duration": None}, r"tasks\[1\].duration: None is not a number"),
    ({"after": 0}, r"tasks\[1\].after: expected a list, got int"),
    ({"after": [2**70]}, r"tasks\[1\].after\[0\]: 1180591620717411303424 is out of range"),
    ({"after": [1]}, r"tasks\[1\].after\[0\]: 1 is not < 1"),
    ({"id": 5}, r"tasks\[1\].id: 5 is not its index 1"),
    ({"lane": 2}, r"tasks\[1\].lane: 2 is not in \[0, 2\)"),
])
def test_problem_on_timeline_task_errors_name_the_field(change, message):
    tl = simulate_pipeline("1f1b", ranks=2, microbatches=2)
    base = {"lane": 0, "duration": 1.0, "resource": "compute", "phase": "fwd", "microbatch": 0, "after": []}
    with pytest.raises(ValueError, match=message):
        pybubble.Problem.on_timeline(tl, [base, {**base, **change}])


def test_problem_on_timeline_takes_numpy_scalars_and_an_id_equal_to_the_index():
    tl = simulate_pipeline("1f1b", ranks=2, microbatches=2, fwd=10.0, bwd=20.0)
    tasks = [{"id": 0, "lane": np.int64(1), "duration": np.float32(1.5), "resource": "compute", "phase": "fwd",
              "microbatch": np.int32(1), "after": np.array([], np.int64)},
             {"lane": 1, "duration": 2.0, "resource": "comm", "phase": "bwd", "microbatch": 1,
              "after": [np.int64(0)]}]
    doc = pybubble.Problem.on_timeline(tl, tasks).to_dict()
    assert [t["lane"] for t in doc["tasks"]] == [1, 1] and doc["tasks"][1]["after"] == [0]
    assert doc["tasks"][0]["duration"] == 1.5


def test_huge_numbers_in_a_table_are_value_errors():
    with pytest.raises(ValueError, match=r"schedule\[0\]\[2\]: '0F99999999999' has a stage or microbatch of 2\*\*31"):
        simulate_pipeline({0: ["0F0", "0B0", "0F99999999999", "0B1"]})
    # A large microbatch number is rejected by the microbatch limit, or within it by counting
    # actions, without a table per microbatch.
    with pytest.raises(ValueError, match=r"microbatches: 2000000001, more than the limit of 1000000"):
        simulate_pipeline({0: ["0F0", "0B0", "0F2000000000", "0B1"]})
    with pytest.raises(ValueError, match=r"table: 0F1 is missing \(4 actions for 1 stages and 1000000"):
        simulate_pipeline({0: ["0F0", "0B0", "0F999999", "0B1"]})
    with pytest.raises(ValueError, match=r"fwd: 'a' is not a number"):
        simulate_pipeline("1f1b", fwd="a")


@given(st.integers(0, 10_000), st.data())
@settings(max_examples=200, deadline=None)
def test_fuzzed_core_arrays_never_crash(seed, data):
    """The core checks its input: any corruption of one array is a ValueError or a valid timeline."""
    from pybubble import _core

    rng = np.random.default_rng(seed)
    name = ["gpipe", "1f1b", "interleaved_1f1b", "zb_h1"][seed % 4]
    p, v = int(rng.integers(1, 4)), 2 if name == "interleaved_1f1b" else 1
    m = p * int(rng.integers(1, 3))
    offset, stage, kind, mb = tables.flatten(tables.build_table(name, p, m, v))
    args = dict(ranks=p, chunks=v, microbatches=m, row_offset=offset, stage=stage, kind=kind, microbatch=mb,
                fwd=np.full(p * v, 2.0), bwd=np.full(p * v, 4.0), wgrad=np.full(p * v, 1.0), p2p=0.5,
                tp_count=2, tp_duration=0.1, dp_allgather=1.0, dp_reducescatter=2.0)
    key = data.draw(st.sampled_from(sorted(args)))
    old = args[key]
    if isinstance(old, np.ndarray):
        size = data.draw(st.integers(0, old.size + 2))
        if old.dtype.kind == "f":
            values = st.floats(allow_nan=True, allow_infinity=True)
        else:
            info = np.iinfo(old.dtype)
            values = st.integers(max(int(info.min), -(2**31)), min(int(info.max), 2**31 - 1))
        args[key] = np.array(data.draw(st.lists(values, min_size=size, max_size=size)), old.dtype)
    elif isinstance(old, int):
        args[key] = data.draw(st.integers(-(2**31), 2**31 - 1))
    else:
        args[key] = data.draw(st.floats(allow_nan=True, allow_infinity=True))
    try:
        out = _core.simulate_pipeline(**args)
    except ValueError:
        return
    # Ops may round to zero length next to enormous costs (2 + 6e15 == 6e15), never run backwards.
    assert np.all(out["op_end"] >= out["op_start"]) and math.isfinite(out["step_time"])
    assert np.all(out["bubble_end"] > out["bubble_start"])


def test_trace_is_chrome_json(tmp_path):
    tl = simulate_pipeline("1f1b", ranks=2, microbatches=3, tp_comm=(2, 0.1))
    path = tmp_path / "trace.json"
    pybubble.save_trace(tl, path)
    doc = json.loads(path.read_text())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len([e for e in slices if e["cat"] == "op"]) == len(tl.ops) == 12
    assert len([e for e in slices if e["cat"] == "bubble"]) == len(tl.bubbles)
    assert all(e["dur"] > 0 and {"ts", "pid", "tid", "name"} <= e.keys() for e in slices)



def test_trace_names_ops_by_their_table_action(tmp_path):
    p, m = 3, 4
    tl = simulate_pipeline("zbv", ranks=p, microbatches=m)
    path = tmp_path / "trace.json"
    pybubble.save_trace(tl, path)
    ops = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "op"]
    table = compact(tables.zbv(p, m))
    for r in range(p):  # each rank's track lists its table row in order (V shape: stages r, 2p-1-r)
        assert [e["name"] for e in ops if e["pid"] == r] == table[r]


# ---- invariants over random costs (hypothesis) ---------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv"]), p=st.integers(1, 5),
       rounds=st.integers(1, 3), seed=st.integers(0, 2**32 - 1), p2p=st.sampled_from([0.0, 0.25]),
       tp=st.sampled_from([None, (2, 0.05)]), a=st.sampled_from([0.0, 1.5]), r=st.sampled_from([0.0, 2.5]))
def test_timeline_invariants(name, p, rounds, seed, p2p, tp, a, r):
    rng = np.random.default_rng(seed)
    v = {"interleaved_1f1b": 2, "zbv": 2}.get(name, 1)
    m = p * rounds
    fwd = rng.uniform(1.0, 3.0, (p, v))
    bwd = rng.uniform(2.0, 6.0, (p, v))
    tl = simulate_pipeline(name, ranks=p, microbatches=m, chunks=v if name == "interleaved_1f1b" else 1,
                           fwd=fwd, bwd=bwd, p2p=p2p, tp_comm=tp, dp_allgather=a, dp_reducescatter=r)
    ops = tl.ops
    assert len(ops) == p * v * m * (3 if name in ("zb_h1", "zbv") else 2)
    end = {}
    for o in ops:
        assert a <= o.start < o.end <= tl.step_time - r + 1e-9
        end[(o.rank, o.chunk, o.kind, o.microbatch)] = o.end
    for s in range(p):
        mine = [o for o in ops if o.rank == s]
        for x, y in zip(mine, mine[1:]):
            assert y.start >= x.end  # one op at a time, in table order
        # Ops (less their TP collectives) and bubbles tile [0, step_time] exactly.
        busy = sum(o.end - o.start for o in mine)
        bt = tl.bubble_time()[s]
        assert busy - bt["tp"] + sum(bt.values()) == pytest.approx(tl.step_time, rel=1e-12)
        windows = tl.compute_free.of(s)
        assert all(x[1] < y[0] for x, y in zip(windows, windows[1:]))
    assert np.all(np.diff(tl.forward_needed) > 0) and np.all(tl.grad_ready > tl.forward_needed)


def test_tp_collectives_must_leave_compute():
    with pytest.raises(ValueError, match=r"tp_comm: 4 collectives of 2 leave no compute in an op of 10 "):
        simulate_pipeline("1f1b", ranks=2, microbatches=2, fwd=10.0, bwd=20.0, tp_comm=(4, 2.0))
    with pytest.raises(ValueError, match=r"tp_comm.count: 1.5"):
        simulate_pipeline("1f1b", tp_comm=(1.5, 0.1))


def test_nvlink_free_is_the_step_less_its_tp_collectives():
    tl = simulate_pipeline("interleaved_1f1b", ranks=3, microbatches=3, chunks=2, fwd=10.0, bwd=20.0,
                           tp_comm=(2, 1.0), dp_allgather=3.0, dp_reducescatter=4.0)
    free = tl.nvlink_free
    assert free.lanes == tl.ranks
    for r in range(tl.ranks):
        tp = sorted((b.start, b.end) for b in tl.bubbles if b.rank == r and b.kind == "tp")
        windows = free.of(r)
        # the windows and the TP collectives tile [0, step] in turn: window, collective, window, ...
        edges = [x for w, c in zip(windows, tp + [None]) for x in (w, c) if x is not None]
        assert edges[0][0] == 0.0 and edges[-1][1] == tl.step_time
        assert all(a[1] == pytest.approx(b[0]) for a, b in zip(edges, edges[1:]))
        # the DP collectives leave the links inside the node free (they cross nodes)
        assert windows[0][1] > 3.0 and windows[-1][0] < tl.step_time - 4.0
    assert len(simulate_pipeline("1f1b", ranks=2, microbatches=2).nvlink_free.of(0)) == 1  # no TP: one window
