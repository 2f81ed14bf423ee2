"""Encoder tasks for a plan: lane mapping, dependency structure, and a full problem that the core
loads, schedules and validates."""

import pytest

import pybubble
from pybubble import presets
from pybubble.costs.roofline import CostModel
from pybubble.problem.encoder import EncoderPlan, encoder_tasks
from pybubble.config.models import EncoderConfig

SMALL = EncoderConfig(name="tiny", layers=4, hidden=256, heads=4, tokens=64)


def test_plan_validation():
    with pytest.raises(ValueError, match="pp_enc: 3 does not divide pp_llm"):
        EncoderPlan(pp_enc=3, tp_enc=1, pp_llm=4, tp_llm=1)
    with pytest.raises(ValueError, match="tp_enc: 3 does not divide tp_llm"):
        EncoderPlan(pp_enc=1, tp_enc=3, pp_llm=4, tp_llm=4)
    with pytest.raises(ValueError, match="tp_llm: 0"):
        EncoderPlan(pp_enc=1, tp_enc=1, pp_llm=1, tp_llm=0)


def test_lane_mapping_tiles_the_llm_stages():
    plan = EncoderPlan(pp_enc=2, tp_enc=2, pp_llm=4, tp_llm=4)
    assert (plan.lanes_per_stage, plan.pipelines) == (2, 4)
    lanes = [plan.lane(i, e) for i in range(plan.pipelines) for e in range(plan.pp_enc)]
    assert sorted(lanes) == list(range(plan.pp_llm * plan.lanes_per_stage))  # one stage per lane
    assert plan.lane(0, 0) == 0 and plan.lane(0, 1) == 4 and plan.lane(3, 1) == 7
    assert plan.stage_layers(5) == [3, 2]


def check_structure(tasks, frozen=False):
    for i, t in enumerate(tasks):
        for a in t["after"]:
            assert a < i and tasks[a]["microbatch"] == t["microbatch"]
            assert not (tasks[a]["phase"] == "bwd" and t["phase"] == "fwd")
    assert all(t["phase"] == "fwd" for t in tasks) == frozen


def test_tasks_follow_the_pipeline_forward_then_backward():
    plan = EncoderPlan(pp_enc=2, tp_enc=1, pp_llm=2, tp_llm=1)
    tasks = encoder_tasks(SMALL, plan=plan, partition=[3], micro_batch=2, costs=CostModel("h100"))
    check_structure(tasks)
    assert {t["microbatch"] for t in tasks} == {0, 1, 2}
    j0 = [t for t in tasks if t["microbatch"] == 0]
    fwd_kernels = len(pybubble.decompose_layer(SMALL, 2, 64))
    bwd_kernels = len(pybubble.decompose_layer(SMALL, 2, 64, phase="bwd"))
    # forward: stage 0 -> 1 send, then the output back to LLM stage 0 (the last encoder stage sits on
    # LLM stage 1); backward: the gradient from LLM stage 0, then the stage 1 -> 0 gradient send
    assert len(j0) == 4 * (fwd_kernels + bwd_kernels) + 4
    assert [(t["lane"], t["phase"]) for t in j0 if t["resource"] == "comm"] == [
        (0, "fwd"), (1, "fwd"), (0, "bwd"), (1, "bwd")]
    frozen = encoder_tasks(SMALL, plan=plan, partition=[3], micro_batch=2, costs=CostModel("h100"), frozen=True)
    check_structure(frozen, frozen=True)
    assert len(frozen) == 3 * (4 * fwd_kernels + 2)


def test_output_goes_to_llm_stage_0_only_from_other_stages():
    plan = EncoderPlan(pp_enc=1, tp_enc=1, pp_llm=2, tp_llm=2)  # 4 pipelines: two on each LLM stage
    assert [plan.llm_rank(i, 0) for i in range(4)] == [0, 0, 1, 1]
    tasks = encoder_tasks(SMALL, plan=plan, partition=[1, 1, 1, 1], micro_batch=1, costs=CostModel("h100"))
    check_structure(tasks)
    comm = {j: [(t["lane"], t["phase"]) for t in tasks if t["microbatch"] == j and t["resource"] == "comm"]
            for j in range(4)}
    assert comm[0] == [] and comm[1] == []  # already on LLM stage 0, TP 1: no sends at all
    assert comm[2] == [(2, "fwd"), (0, "bwd")] and comm[3] == [(3, "fwd"), (1, "bwd")]
    send = [t for t in tasks if t["resource"] == "comm"][0]
    assert send["duration"] == pytest.approx(CostModel("h100").p2p_time(2.0 * 64 * 256))


def test_several_encoders_give_parallel_chains():
    plan = EncoderPlan(pp_enc=1, tp_enc=1, pp_llm=1, tp_llm=1)
    other = EncoderConfig(name="audio", layers=2, hidden=128, heads=2, tokens=32)
    tasks = encoder_tasks([SMALL, other], plan=plan, partition=[1], micro_batch=1, costs=CostModel("h100"),
                          frozen=[False, True])
    check_structure(tasks)
    roots = [i for i, t in enumerate(tasks) if not t["after"]]
    assert len(roots) == 2  # two independent forward chains
    with pytest.raises(ValueError, match="frozen: 1 flags for 2 encoders"):
        encoder_tasks([SMALL, other], plan=plan, partition=[1], micro_batch=1, costs=CostModel("h100"),
                      frozen=[True])
    with pytest.raises(ValueError, match="partition: 2 entries"):
        encoder_tasks(SMALL, plan=plan, partition=[1, 1], micro_batch=1, costs=CostModel("h100"))


def windows(horizon, period, busy):
    """Free windows of `period` with `busy` of each taken by the LLM."""
    out, t = [], 0.0
    while t + period <= horizon:
        out.append([t + busy, t + period])
        t += period
    return out


@pytest.mark.parametrize(("pp_enc", "tp_enc", "frozen"), [(1, 2, False), (2, 1, False), (2, 2, [False, True])])
def test_full_problem_loads_schedules_and_validates(pp_enc, tp_enc, frozen):
    plan = EncoderPlan(pp_enc=pp_enc, tp_enc=tp_enc, pp_llm=2, tp_llm=4)
    costs = CostModel("h100")
    encoders = presets.encoder("vit-l-14") if isinstance(frozen, bool) else [presets.encoder("vit-l-14"), SMALL]
    partition = [1] * plan.pipelines
    partition[0] += 4 - sum(partition)  # four encoder microbatches for the four LLM microbatches
    tasks = encoder_tasks(encoders, plan=plan, partition=partition, micro_batch=2, costs=costs, frozen=frozen)
    check_structure(tasks)
    assert {t["lane"] for t in tasks} == set(range(plan.pp_llm * plan.lanes_per_stage))
    horizon = 200_000.0
    lanes = [{"name": f"pp{s}.tp{k}", "compute_free": windows(horizon, 2000.0, 1200.0),
              "link_free": [[w[0] - 1200.0, w[0]] for w in windows(horizon, 2000.0, 1200.0)]}
             for s in range(plan.pp_llm) for k in range(plan.lanes_per_stage)]
    microbatches = [{"forward_needed": 20_000.0 * (k + 1), "grad_ready": 100_000.0 + 20_000.0 * k}
                    for k in range(4)]
    doc = {"format": "pybubble.problem/1", "horizon": horizon, "lanes": lanes, "microbatches": microbatches,
           "tasks": [dict(t, id=i) for i, t in enumerate(tasks)]}
    problem = pybubble.load_problem(doc)
    assert problem.num_tasks == len(tasks) and problem.num_lanes == plan.pp_llm * plan.lanes_per_stage
    sched = pybubble.schedule_problem(problem)
    assert pybubble.validate(problem, sched) == []
    assert sched.step_time >= horizon
