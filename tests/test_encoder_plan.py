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


def work_of(encoders, plan, images, frozen=False):
    from pybubble.problem.encoder import EncoderWork
    return EncoderWork(encoders, plan=plan, micro_batch=images, costs=CostModel("h100"), frozen=frozen)


def test_split_images_gives_whole_images_in_proportion():
    plan = EncoderPlan(pp_enc=1, tp_enc=1, pp_llm=4, tp_llm=2)  # 8 pipelines
    work = work_of([SMALL, SMALL], plan, [13, 3])
    even = work.split_images([1] * 8)
    assert [sum(p[e] for p in even) for e in (0, 1)] == [13, 3]
    assert sorted(p[0] for p in even) == [1, 1, 1, 2, 2, 2, 2, 2]  # as even as whole images go
    assert even[-1] == (2, 1) and even[0][1] == 0  # ties go to the last pipelines
    lopsided = work.split_images([0, 0, 0, 0, 0, 0, 1, 3])
    assert [p[0] for p in lopsided] == [0] * 6 + [3, 10] and [p[1] for p in lopsided] == [0] * 6 + [1, 2]
    with pytest.raises(ValueError, match=r"share: .* gives the microbatch to no pipeline"):
        work.split_images([0] * 8)
    with pytest.raises(ValueError, match=r"share\[2\]: -1"):
        work.split_images([1, 1, -1, 1, 1, 1, 1, 1])


@pytest.mark.parametrize("pp_enc, tp_enc", [(1, 1), (2, 1), (1, 2)])
def test_whole_placements_are_the_partition_and_spread_ones_split_every_piece(pp_enc, tp_enc):
    plan = EncoderPlan(pp_enc=pp_enc, tp_enc=tp_enc, pp_llm=4, tp_llm=2)
    work = work_of(SMALL, plan, 6)
    m = plan.pipelines
    partition = [2] * m
    whole = work.layout_tasks([i for i in range(m) for _ in range(2)])
    same = work.tasks(partition)
    for key in ("lane", "duration", "resource", "phase", "microbatch", "after_offset", "after"):
        assert (getattr(whole, key) == getattr(same, key)).all(), key
    assert (work.layout_bytes([i for i in range(m) for _ in range(2)]) == work.lane_bytes(partition)).all()
    share = [1] * m
    spread = work.layout_tasks([share, 0, share])
    tasks = spread.to_dicts()
    check_structure(tasks)
    pieces = [images for images in work.split_images(share) if images[0]]
    one = [work.microbatch_tasks(i, images) for i, images in enumerate(work.split_images(share)) if images[0]]
    assert sum(t["microbatch"] == 0 for t in tasks) == sum(len(t) for t in one) and len(pieces) == min(m, 6)
    # every piece on its own pipeline's lanes, with its own images' durations
    lanes = {plan.lane(i, e) for i, images in enumerate(work.split_images(share)) if images[0] for e in range(pp_enc)}
    assert {t["lane"] for t in tasks if t["microbatch"] == 0 and t["resource"] == "compute"} == lanes
    assert sum(t["duration"] for t in tasks if t["microbatch"] == 0) == pytest.approx(sum(t.duration.sum() for t in one))
    # merged fraction by fraction: the first forward tasks are the first kernels of every piece
    fwd = [t for t in tasks if t["microbatch"] == 0 and t["phase"] == "fwd"]
    assert {t["lane"] for t in fwd[:len(pieces)]} == {plan.lane(i, 0) for i, im in enumerate(work.split_images(share)) if im[0]}
    # a spread microbatch holds its share of the activations on each pipeline
    states = work.lane_bytes([0] * m)
    one = (work.lane_bytes([1] + [0] * (m - 1)) - states).sum()  # one whole microbatch's activations
    held = work.layout_bytes([share] * 6) - states
    assert held.sum() == pytest.approx(6 * one, rel=1e-9) and held.max() < 6 * one
    problem = pybubble.Problem.from_arrays(pybubble.problem.problem.ProblemArrays(
        horizon=1e5, compute_free=pybubble.Windows.whole(plan.pp_llm * plan.lanes_per_stage, 0, 1e5),
        link_free=pybubble.Windows.whole(plan.pp_llm * plan.lanes_per_stage, 0, 1e5),
        forward_needed=[1e4, 2e4, 3e4], grad_ready=[5e4, 6e4, 7e4], tasks=spread))
    assert pybubble.validate(problem, pybubble.schedule_problem(problem)) == []
    with pytest.raises(ValueError, match=r"layout\[1\]: .* is neither a pipeline nor a share"):
        work.layout_tasks([0, [1, 2]])
    with pytest.raises(ValueError, match=r"layout\[0\]: 99"):
        work.layout_tasks([99])


def test_a_frozen_encoder_spread_has_no_backward():
    plan = EncoderPlan(pp_enc=1, tp_enc=1, pp_llm=2, tp_llm=2)
    work = work_of(SMALL, plan, 4, frozen=True)
    assert (work.layout_tasks([[1, 1, 1, 1], [0, 0, 1, 1]]).phase == 0).all()


def test_piece_images_are_checked():
    plan = EncoderPlan(pp_enc=1, tp_enc=1, pp_llm=2, tp_llm=1)
    work = work_of([SMALL, SMALL], plan, [4, 2])
    one_encoder, both, whole = (work.microbatch_tasks(0, images) for images in ([1, 0], [1, 1], None))
    assert len(one_encoder) * 2 == len(both) == len(whole)  # a chain per encoder with images
    assert one_encoder.duration.sum() < both.duration.sum() < whole.duration.sum()
    with pytest.raises(ValueError, match=r"images: \[1\] is not one image count for each of the 2 encoders"):
        work.microbatch_tasks(0, [1])
    with pytest.raises(ValueError, match=r"images\[1\]: 3"):
        work.microbatch_tasks(0, [1, 3])
    with pytest.raises(ValueError, match="holds no image"):
        work.microbatch_tasks(0, [0, 0])
