"""The lower bound on the step (pybubble.planner.bound): its terms on a pipeline worked out by hand,
never above a schedule of any layout, and the cost-model property it rests on."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pybubble
from pybubble.config.schema import load_config
from pybubble.costs.roofline import CostModel
from pybubble.llm.step import LLMStep
from pybubble.llm.timeline import simulate_pipeline
from pybubble.planner import search as planner
from pybubble.planner.bound import StepBound, EncoderLoad, _longest_paths, encoder_load, layout_bound, step_bound
from pybubble.planner.space import PlanSpace
from pybubble.problem.encoder import EncoderPlan, EncoderWork
from pybubble.problem.arrays import Tasks
from pybubble.problem.generated import random_problem, synthetic

SMALL = {"cluster": {"gpus": 16, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"},
         "encoders": [{"preset": "vit-l-14", "tokens_per_sample": 4 * 257}],
         "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 2048},
         "llm_plan": {"dp": 2, "pp": 4, "tp": 2}}


def load(fwd, bwd, paths=(0.0, 0.0, 0.0, 0.0), stages=((1.0,), (1.0,))):
    return EncoderLoad(forward=np.array(fwd, float), backward=np.array(bwd, float), forward_path=paths[0],
                       backward_path=paths[1], forward_compute=paths[2], backward_compute=paths[3],
                       stage_forward=stages[0], stage_backward=stages[1])


def test_terms_by_hand_on_a_two_stage_pipeline():
    # 1F1B, 2 ranks, 2 microbatches: F = [0, 10], B = [60, 90], horizon 90; rank 0 idles [20, 40] and
    # [60, 70], rank 1 [0, 10] and [70, 90]; one GPU per rank.
    tl = simulate_pipeline("1f1b", ranks=2, microbatches=2, fwd=10, bwd=20)
    assert list(tl.forward_needed) == [0, 10] and list(tl.grad_ready) == [60, 90] and tl.step_time == 90
    b = step_bound(tl, load([8, 8], [16, 16]), gpus_per_rank=1)
    # front: the first forward (8) has no free time before 0 -> 8 / 2 GPUs; both (16) have rank 1's
    # [0, 10] before 10 -> (16 - 10) / 2 = 3. back: the last backward after 90 -> 16 / 2; both after
    # 60 have 30 -> (32 - 30) / 2 = 1. total: 48 of work, 60 free -> 0.
    assert (b.front, b.back, b.work) == (4.0, 8.0, 0.0)
    assert b.step_time == 102.0 and b.gap == pytest.approx(12 / 90)
    # one image's chain: 6 of forward cannot end by F_0 = 0 unless the step grows by 6 before it;
    # 12 of backward after B_1 = 90, the horizon
    chained = step_bound(tl, load([8, 8], [16, 16], (6.0, 12.0, 5.0, 11.0)), gpus_per_rank=1)
    assert (chained.front, chained.back) == (6.0, 12.0) and chained.step_time == 108.0
    # two GPUs per rank: twice the free time and twice the GPUs
    assert step_bound(tl, load([8, 8], [16, 16]), gpus_per_rank=2).front == 2.0
    # the total alone: work far beyond the bubbles
    heavy = step_bound(tl, load([40, 40], [40, 40]), gpus_per_rank=1)
    assert heavy.work == (160 - 60) / 2 and heavy.step_time == 90 + max(heavy.front + heavy.back, heavy.work)
    # prefetch: the first forward runs in the previous step, needed by the horizon only; the second still
    # needs 8 - 10 of free time before 10 -> nothing; both: nothing before 0 at all
    assert step_bound(tl, load([8, 8], [0, 0]), gpus_per_rank=1, prefetch=1).front == 0.0
    assert step_bound(tl, load([8, 8], [0, 0]), gpus_per_rank=1, prefetch=0).front == 4.0
    assert step_bound(tl, load([30, 30], [0, 0]), gpus_per_rank=1, prefetch=1).front == (30 - 10) / 2


def test_each_encoder_stage_counts_on_its_own_ranks():
    # the pipeline above; an encoder of two stages, one per rank: its forward all on stage 0 (rank 0,
    # idle only from 20), its backward all on stage 1 (rank 1, idle [0, 10] and [70, 90])
    tl = simulate_pipeline("1f1b", ranks=2, microbatches=2, fwd=10, bwd=20)
    b = step_bound(tl, load([8, 8], [16, 16], stages=((1.0, 0.0), (0.0, 1.0))), gpus_per_rank=1)
    # front: both forwards (16) on rank 0 before 10, where it has no free time -> 16 (the fluid over
    # both ranks: 3); back: the last backward (16) after 90 -> 16, both (32) after 60 on rank 1's 20 -> 12
    assert (b.front, b.back, b.work) == (16.0, 16.0, 2.0) and b.step_time == 90 + 32
    # one stage over both ranks is the fluid of the first test
    assert step_bound(tl, load([8, 8], [16, 16]), gpus_per_rank=1).step_time == 102.0
    with pytest.raises(ValueError, match="load: 3 encoder stages do not split the 2 ranks"):
        step_bound(tl, load([8], [8], stages=((0.5, 0.25, 0.25), (0.5, 0.25, 0.25))), gpus_per_rank=1)


def test_stage_shares_follow_the_plan():
    step = LLMStep.of(load_config(SMALL))
    for plan in planner.encoder_plans(step.config):
        one = encoder_load(planner.encoder_work(step, plan), microbatches=8)
        assert len(one.stage_forward) == len(one.stage_backward) == plan.pp_enc
        assert sum(one.stage_forward) == pytest.approx(1.0) and sum(one.stage_backward) == pytest.approx(1.0)
        assert min(one.stage_forward) > 0  # every stage holds layers


def test_varying_loads_take_the_lightest_first_and_last():
    tl = simulate_pipeline("1f1b", ranks=2, microbatches=2, fwd=10, bwd=20)
    # loads 2 and 14: the lightest can feed the first deadline and be the last backward
    b = step_bound(tl, load([14, 2], [2, 30]), gpus_per_rank=1)
    assert b.front == max(2 / 2, (16 - 10) / 2) and b.back == max(2 / 2, (32 - 30) / 2)


@pytest.fixture(scope="module")
def spaces(bench_script):
    out = []
    # and bench/plan_gap.py's instance of the A100 setting's shape: 16 images per microbatch, whose
    # whole images tighten the bound of the plans of one encoder stage
    # and its dual instance: two encoders of 8 images each per sample, split alike
    for cfg in (SMALL, bench_script("plan_gap").instance("a100"), bench_script("plan_gap").instance("dual")):
        step = LLMStep.of(load_config(cfg))
        out += [PlanSpace(step, p, step.encoder_windows(p.lanes_per_stage)) for p in planner.encoder_plans(step.config)]
    return out


def test_whole_images_tighten_the_one_stage_plans_of_the_dual_shape(spaces):
    dual = [s for s in spaces if len(s.work.images) == 2 and s.plan.pp_enc == 1]
    assert dual and all(tuple(s.work.images) == (16, 16) for s in dual)  # 8 images a sample, 2 samples, each encoder
    # a piece holds k images of both encoders (a layout splits them alike), its fixed costs paid per piece
    assert all(s.whole_image_bound().step_time > s.step_bound.step_time for s in dual)


def test_piece_costs_from_one_layer_are_those_of_the_pieces_tasks(spaces):
    from dataclasses import replace as _replace
    from pybubble.planner.bound import image_piece_tasks, piece_costs

    # every plan of the three shapes (one encoder, several stages; two encoders), and the dual shape
    # with its second encoder frozen (no backward for it): the sums of EncoderWork.piece_compute,
    # which the dual settings' whole-image bound reads instead of building a piece's tasks per count
    frozen = [s for s in spaces if len(s.work.images) == 2][0]
    cfg = _replace(frozen.step.config, encoders=[frozen.step.config.encoders[0],
                                                 _replace(frozen.step.config.encoders[1], frozen=True)])
    step = LLMStep.of(cfg)
    one = next(p for p in planner.encoder_plans(cfg) if p == frozen.plan)
    assert piece_costs(PlanSpace(step, one).work)[:, 1, -1].sum() < piece_costs(frozen.work)[:, 1, -1].sum()
    for space in spaces + [PlanSpace(step, p) for p in planner.encoder_plans(cfg)]:
        fast, slow = piece_costs(space.work), piece_costs(space.work, image_piece_tasks(space.work))
        np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-9)
        assert fast[:, 1, 1:].min() > 0  # the first encoder's backward is there, frozen or not


def test_whole_images_tighten_the_one_stage_plans_of_the_a100_shape(spaces):
    a100 = [s for s in spaces if s.step.config.llm_plan.vpp == 2 and s.step.config.llm_plan.tp == 2]
    tighter = {(s.plan.pp_enc, s.plan.tp_enc) for s in a100 if s.whole_image_bound().step_time > s.step_bound.step_time}
    # PP_enc 1: 16 images over 2 or 4 pipelines, a piece's fixed costs paid per piece; PP_enc 2: the
    # LLM's TP gaps (88.9 us) too short for its long kernels, and each stage waiting for the next
    assert tighter == {(1, 1), (1, 2), (2, 1), (2, 2)}


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_bound_is_never_above_a_schedule_of_any_layout(spaces, data):
    space = data.draw(st.sampled_from(spaces))
    m, total = space.plan.pipelines, space.step.config.microbatches
    head = data.draw(st.integers(0, total))
    tail = data.draw(st.integers(0, total - head))
    cand = space.layout_candidate(space.spread_layout(head, tail), (head, tail))
    cuts = data.draw(st.lists(st.integers(0, total), min_size=m, max_size=m))
    partition = list(np.diff(np.concatenate([[0], np.sort(cuts)[:-1], [total]]))) if m > 1 else [total]
    # any layout: each microbatch's images over the pipelines, drawn image by image
    n = space.work.images[0]
    drawn = [np.bincount(data.draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n)), minlength=m)
             for _ in range(total)]
    layout = [int(np.argmax(c)) if c.max() == n else tuple(int(x) for x in c) for c in drawn]
    shaped = [space.layout_candidate(layout, (0, 0), policy=policy) for policy in ("greedy", "holes")]
    whole = space.whole_image_bound()
    assert whole.step_time >= space.step_bound.step_time
    for c in (cand, space.candidate(partition), space.candidate(partition, coarse=True), *shaped):
        assert pybubble.validate(c.problem, c.schedule) == []
        assert space.step_bound.step_time <= c.step_time * (1 + 1e-12)
        assert space.plan_bound(total) <= c.step_time * (1 + 1e-12)
        assert whole.step_time <= c.step_time * (1 + 1e-12)


def test_whole_images_count_each_pieces_cost_lane_by_lane():
    from pybubble.llm.timeline import Windows
    from pybubble.planner.bound import _growth, least_costs, whole_image_bound

    # pieces of at most 2 images: 1 image costs 3, 2 cost 5; so 4 images at least 10, 3 at least 8
    costs = np.array([[[0.0, 3.0, 5.0], [0.0, 6.0, 10.0]]])  # one stage; forward, backward
    least = least_costs(costs, 2)
    assert least[0, 0].tolist() == [0.0, 3.0, 5.0, 8.0, 10.0]
    assert least[0, 2].tolist() == [0.0, 9.0, 15.0, 24.0, 30.0]  # forward and backward of each piece
    # lanes with 4 and 0 free: lane 0 holds 1 image, both once it has 1 more; lane 1 one image at 3
    assert _growth(least[0, 0], 2, np.array([4.0, 0.0])) == 1.0
    assert _growth(least[0, 0], 1, np.array([4.0, 0.0])) == 0.0
    assert _growth(least[0, 0], 3, np.array([4.0, 0.0])) == 3.0  # 2 on lane 0 (5 <= 4 + 3), 1 on lane 1 (3 <= 3)
    # one microbatch of 2 images, needed at 4 and ready at 6 of a horizon of 10; lane 0 free in
    # [0, 4] and [6, 10], lane 1 never
    windows = Windows(offset=np.array([0, 2, 2]), start=np.array([0.0, 6.0]), end=np.array([4.0, 10.0]))
    fluid = StepBound(step_time=10.0, horizon=10.0, front=0.0, back=0.0, work=0.0)
    got = whole_image_bound(fluid, least_costs(costs, 1), 2, windows, np.array([4.0]), np.array([6.0]),
                            [np.array([0, 1])])
    # forward: lane 0 holds both with 1 more (5 <= 4 + 1); backward, 4 free after 6 on lane 0: both
    # there (10 <= 4 + 6) or one on each (6 <= 0 + 6), 6 either way; in all, both on lane 0 (15 <= 8 + 7)
    assert (got.front, got.back, got.work, got.step_time) == (1.0, 6.0, 7.0, 17.0)


@pytest.mark.parametrize("preset", ["vit-l-14", "internvit-300m", "vit-22b"])
def test_a_kernels_time_per_image_never_grows_with_its_images(preset):
    # what makes the whole microbatch's work a lower bound for any split of it into pieces
    enc = pybubble.presets.encoder(preset)
    costs = CostModel("h100")
    for tp in (1, 4):
        work = EncoderWork(enc, plan=EncoderPlan(pp_enc=1, tp_enc=tp, pp_llm=1, tp_llm=4), micro_batch=16, costs=costs)
        per_image = []
        for n in range(1, 17):
            t = work.microbatch_tasks(0, [n])
            per_image.append(float(t.duration[t.resource == 0].sum()) / n)
        assert all(a >= b * (1 - 1e-12) for a, b in zip(per_image, per_image[1:]))


@pytest.mark.parametrize("preset", ["vit-l-14", "internvit-300m", "vit-22b"])
def test_a_pieces_paths_never_shrink_as_it_gains_images(preset):
    # what makes the largest piece's path a lower bound for any split of a microbatch
    enc = pybubble.presets.encoder(preset)
    for tp, pp in ((1, 1), (4, 2)):
        work = EncoderWork(enc, plan=EncoderPlan(pp_enc=pp, tp_enc=tp, pp_llm=2, tp_llm=4), micro_batch=16,
                           costs=CostModel("h100"))
        paths = [_longest_paths(work.microbatch_tasks(0, [n])) for n in range(1, 17)]
        assert all(b[i] >= a[i] for a, b in zip(paths, paths[1:]) for i in range(4))


def test_encoder_load_follows_the_plan_and_the_scale():
    step = LLMStep.of(load_config(SMALL))
    plan = EncoderPlan(pp_enc=1, tp_enc=2, pp_llm=4, tp_llm=2)
    work = planner.encoder_work(step, plan)
    one = encoder_load(work, microbatches=8)
    t = work.microbatch_tasks(0)
    assert one.forward.tolist() == [2 * float(t.duration[(t.resource == 0) & (t.phase == 0)].sum())] * 8
    assert 0 < one.forward_compute <= one.forward_path <= t.duration[t.phase == 0].sum()
    # microbatches alike: some pipeline holds ceil(images / pipelines) of each one's images
    (n,), pipes = work.images, plan.pipelines
    assert pipes > 1 and (one.forward_path, one.backward_path) == _longest_paths(work.microbatch_tasks(0, [-(-n // pipes)]))[:2]
    scaled = encoder_load(work, scale=np.array([0.5, 2.0]))  # microbatches that vary: one image
    assert scaled.backward.tolist() == [one.backward[0] * 0.5, one.backward[0] * 2.0]
    assert scaled.forward_path == pytest.approx(_longest_paths(work.microbatch_tasks(0, [1]))[0] * 0.5)
    with pytest.raises(ValueError, match="microbatches"):
        encoder_load(work)


def test_free_before_counts_whole_and_open_windows():
    from pybubble.llm.timeline import Windows

    w = Windows(offset=np.array([0, 2, 2, 3]), start=np.array([1.0, 5.0, 0.0]), end=np.array([3.0, 9.0, 10.0]))
    got = w.free_before(np.array([0.0, 2.0, 4.0, 6.0, 20.0]))
    assert got.tolist() == [[0, 1, 2, 3, 6], [0, 0, 0, 0, 0], [0, 2, 4, 6, 10]]
    assert (w.free_before(np.array([1e9]))[:, 0] == w.free_time()).all()


def _paths_by_hand(t) -> tuple[float, float, float, float]:
    """The longest forward and backward paths (all tasks, then compute tasks only), walked in Python."""
    full, comp, best = {}, {}, [0.0, 0.0, 0.0, 0.0]
    for i in range(len(t)):
        ph = int(t.phase[i])
        preds = [int(p) for p in t.after[t.after_offset[i]:t.after_offset[i + 1]] if t.phase[p] == ph]
        full[i] = max((full[p] for p in preds), default=0.0) + float(t.duration[i])
        comp[i] = max((comp[p] for p in preds), default=0.0) + (float(t.duration[i]) if t.resource[i] == 0 else 0.0)
        best[ph], best[2 + ph] = max(best[ph], full[i]), max(best[2 + ph], comp[i])
    return tuple(best)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_the_cores_longest_paths_equal_a_walk_by_hand(spaces, data):
    space = data.draw(st.sampled_from(spaces))
    images = [data.draw(st.integers(1, n)) for n in space.work.images]
    t = space.work.microbatch_tasks(data.draw(st.integers(0, space.plan.pipelines - 1)), images)
    assert _longest_paths(t) == pytest.approx(_paths_by_hand(t), rel=1e-12)


_layout_problems = st.one_of(
    st.builds(random_problem, st.integers(0, 2**32 - 1), lanes=st.integers(1, 3), microbatches=st.integers(1, 4),
              max_windows=st.integers(0, 4), max_fwd=st.integers(1, 4), max_bwd=st.integers(0, 4),
              horizon=st.sampled_from([10, 100, 1000]), max_duration=st.integers(0, 30)),
    st.builds(synthetic, stages=st.integers(1, 4), lanes_per_stage=st.integers(1, 2), microbatches=st.integers(1, 6),
              encoder_layers=st.just(4), kernels_per_layer=st.integers(1, 6), tp_gaps_per_op=st.integers(0, 3),
              encoder_scale=st.floats(0.0, 8.0), jitter=st.floats(0.0, 0.5), seed=st.integers(0, 1000)))


@settings(max_examples=150, deadline=None)
@given(_layout_problems)
def test_layout_bound_is_never_above_a_schedule_of_its_problem(problem):
    bound = layout_bound(problem)
    assert bound.horizon == problem.horizon and bound.step_time >= problem.horizon
    assert bound.step_time == problem.horizon + max(bound.front + bound.back, bound.work)
    for policy in ("greedy", "coarse", "holes"):
        sched = pybubble.schedule_problem(problem, policy)
        own = layout_bound(problem, sched.assignment)  # every schedule with that assignment
        tol = 1e-9 * (1 + problem.horizon)  # the same sums in another order
        assert own.step_time >= bound.step_time - tol and own.front >= bound.front - tol and own.back >= bound.back - tol
        for b in (bound, own):
            assert b.front <= sched.shift_front + 1e-9 * (1 + problem.horizon)
            assert b.back <= sched.shift_back + 1e-9 * (1 + problem.horizon)
            assert b.step_time <= sched.step_time * (1 + 1e-12) + 1e-9


def test_layout_bound_by_hand_on_one_lane():
    # one lane, compute windows [0, 10) and [20, 30); two microbatches needed at 15 and 40, their
    # gradients ready at 50 and 45, horizon 60: forwards 8 and 12, backwards 5 and 9
    doc = {"format": "pybubble.problem/1", "horizon": 60.0,
           "lanes": [{"name": "l", "compute_free": [[0.0, 10.0], [20.0, 30.0]], "link_free": []}],
           "microbatches": [{"forward_needed": 15.0, "grad_ready": 50.0}, {"forward_needed": 40.0, "grad_ready": 45.0}],
           "tasks": [{"id": i, "lane": 0, "duration": d, "resource": "compute", "phase": ph, "microbatch": j,
                      "after": []} for i, (d, ph, j) in enumerate([(8.0, "fwd", 0), (12.0, "fwd", 1),
                                                                    (5.0, "bwd", 0), (9.0, "bwd", 1)])]}
    b = layout_bound(pybubble.load_problem(doc))
    # forward: the lighter (8) by 15 with 10 free, both (20) by 40 with 20 free: 0 before 0
    # backward: the lighter (5) after 50 with 0 free, both (14) after 45 with 0 free: 14 after
    # total: 34 work in 20 free: 14
    assert (b.front, b.back, b.work, b.step_time) == (0.0, 14.0, 14.0, 74.0)
    assert layout_bound(pybubble.load_problem(doc), [0, 1]) == b
    # encoder microbatch 1 (forward 12, backward 9) feeding LLM microbatch 0: 12 by 15 with 10 free
    # grows the step 2 before 0; its 9 after 50 with 0 free, both after 45: 14 after
    swapped = layout_bound(pybubble.load_problem(doc), [1, 0])
    assert (swapped.front, swapped.back, swapped.work, swapped.step_time) == (2.0, 14.0, 14.0, 76.0)
    with pytest.raises(ValueError, match="assignment"):
        layout_bound(pybubble.load_problem(doc), [0, 0])


def test_a_pieces_spine_is_its_path_from_its_last_task_and_a_long_kernel_ends_a_run():
    from pybubble.planner.short_windows import _path_to_last

    # forward 0 -> 1 -> 2; backward 3 (after 2) -> 4 -> 6, with 5 hanging off 3 (a weight gradient)
    after = [[], [0], [1], [2], [3], [3], [4]]
    t = Tasks(lane=np.zeros(7, np.int64), microbatch=np.zeros(7, np.int64),
              duration=np.array([1.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0]), resource=np.zeros(7, np.int64),
              phase=np.array([0, 0, 0, 1, 1, 1, 1]), after_offset=np.cumsum([0] + [len(a) for a in after]),
              after=np.array([p for a in after for p in a], np.int64))
    assert np.nonzero(_path_to_last(t, 0))[0].tolist() == [0, 1, 2]
    assert np.nonzero(_path_to_last(t, 1))[0].tolist() == [3, 4, 6]  # 5 is off the spine


def test_short_windows_by_hand_on_one_lane():
    from pybubble.llm.timeline import Windows
    from pybubble.planner.short_windows import short_window_bound, stretches

    # one lane, free in three windows of 1 us and one of 3 before the deadline 13 (one stretch of
    # short windows); a microbatch of 2 images: a piece of 1 costs 4, all of it in kernels of at
    # most 1 us along its spine, a piece of 2 costs 6, none of it short
    windows = Windows(offset=np.array([0, 4]), start=np.array([0.0, 2.0, 4.0, 10.0]), end=np.array([1.0, 3.0, 5.0, 13.0]))
    assert stretches(windows, 1.0).tolist() == [1]
    costs = np.array([[[0.0, 4.0, 6.0], [0.0, 0.0, 0.0]]])
    runs = np.zeros((1, 2, 3, 3))
    runs[0, 0, :, 1] = [4.0, 4.0, 0.0]  # short in all, its longest short run, short off the spine
    none = StepBound(step_time=20.0, horizon=20.0, front=0.0, back=0.0, work=0.0)
    got = short_window_bound(none, costs, runs, 1.0, windows, np.array([13.0]), np.array([13.0]), [np.array([0])])
    # one piece of 2: 6 of long windows or before 0, 3 too many; two of 1: 8 of the 6 free, 2 too
    # many; so the step grows by 2. The bound's multipliers lam give, for the piece of 2, 3 - 3 lam,
    # and for two of 1, 5 lam - 3: at least min of the two, 0.6 at lam = 0.8 (the whole-image bound:
    # 0, 6 fits in the 6 free)
    assert got.front == pytest.approx(0.6) and got.front <= 2.0 and got.back == 0.0


def test_short_windows_tighten_the_a100_settings_one_stage_plan_below_its_schedules():
    from pybubble.planner.bound import whole_image_bound
    from pybubble.planner.refill import share_out

    step = LLMStep.of(load_config(Path(__file__).resolve().parent.parent / "examples" / "optimus" / "a100_vit3b_gpt11b.yaml"))
    space = PlanSpace(step, EncoderPlan(pp_enc=1, tp_enc=1, pp_llm=4, tp_llm=2))
    short = space.whole_image_bound()
    lanes = [np.arange(space.plan.pipelines)]
    whole = whole_image_bound(space.step_bound, space._pieces[0][1], space.work.images[0], space.windows[0],
                              space.forward_needed, space.grad_ready, lanes)
    # the TP gaps of 88.9 us hold no kernel of a piece of 3 images or more: the front grows by 1.2 ms
    assert short.front > whole.front + 1000.0 and short.back >= whole.back
    rng = np.random.default_rng(0)
    n, m = space.work.images[0], space.plan.pipelines
    layouts = [share_out(space)[0], space.spread_layout(8, 0)]
    layouts += [[tuple(int(x) for x in np.bincount(rng.integers(0, m, n), minlength=m)) for _ in range(8)] for _ in range(2)]
    for layout in layouts:
        for policy in ("greedy", "holes"):
            cand = space.layout_candidate(layout, (0, 0), policy=policy)
            assert short.step_time <= cand.step_time


def test_a_stages_latest_start_and_earliest_end_by_hand():
    from pybubble.llm.timeline import Windows
    from pybubble.planner.stage_waits import earliest_ends, latest_starts

    # one rank free in [2, 4] and [6, 10] of a step of 10; 3 us of work
    w = Windows(offset=np.array([0, 2]), start=np.array([2.0, 6.0]), end=np.array([4.0, 10.0]))
    # by 10: [7, 10]; by 7: 1 in [6, 7] and 2 in [2, 4], from 2; by 5: 2 in [2, 4], 1 before 0;
    # by 4.5 (after a window's end) the same
    assert latest_starts(w, 0, 3.0, np.array([10.0, 7.0, 5.0, 4.5])).tolist() == [7.0, 2.0, -1.0, -1.0]
    assert latest_starts(w, 0, 0.0, np.array([5.0])).tolist() == [5.0]  # no work: the deadline itself
    # from 0: [2, 4] and 1 of [6, 10]; from 5: [6, 9]; from 9: 1 in [9, 10], 2 after the horizon
    assert earliest_ends(w, 0, 3.0, np.array([0.0, 5.0, 9.0]), 10.0).tolist() == [7.0, 9.0, 12.0]


def test_a_later_stage_moves_the_first_stages_deadline():
    from pybubble.llm.timeline import Windows
    from pybubble.planner.stage_waits import staged_bound

    # two stages on one rank each (1 GPU), a microbatch needed at 10 and ready at 10, step 20; both
    # ranks free in [0, 10] and [10, 20] is LLM work; a one-image piece computes 4 forward and 4
    # backward on stage 1; the microbatch's forward is 12 of GPU time, 6 on each stage
    w = Windows(offset=np.array([0, 1, 2]), start=np.array([0.0, 0.0]), end=np.array([10.0, 10.0]))
    load = EncoderLoad(forward=np.array([12.0]), backward=np.array([0.0]), forward_path=0.0, backward_path=0.0,
                       forward_compute=0.0, backward_compute=0.0, stage_forward=(0.5, 0.5), stage_backward=(0.5, 0.5))
    chains = np.zeros((2, 2, 2))
    chains[1, 0, 0] = 4.0
    none = StepBound(step_time=20.0, horizon=20.0, front=0.0, back=0.0, work=0.0)
    got = staged_bound(none, load, chains, w, w, np.array([10.0]), np.array([10.0]), 1)
    # stage 0 must end by 6 (stage 1's one-image forward of 4 in [6, 10]): its 6 fit in [0, 6];
    # the fluid alone lets both stages use [0, 10]: no growth either way
    assert got.front == 0.0
    load = dataclasses.replace(load, forward=np.array([16.0]))  # 8 on each stage: 2 before 0
    assert staged_bound(none, load, chains, w, w, np.array([10.0]), np.array([10.0]), 1).front == 2.0


@pytest.fixture(scope="module")
def staged_spaces(bench_script):
    """The plans of two encoder stages of bench/plan_gap.py's GPT-175B-shaped instance (TP 8 gaps,
    interleaved 1F1B) and of its two-encoder one."""
    out = []
    for shape in ("gpt", "dual"):
        step = LLMStep.of(load_config(bench_script("plan_gap").instance(shape)))
        out += [PlanSpace(step, p) for p in planner.encoder_plans(step.config) if p.pp_enc == 2]
    return out


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_the_stages_waits_never_lift_the_bound_above_a_schedule(staged_spaces, data):
    space = data.draw(st.sampled_from(staged_spaces))
    m, total = space.plan.pipelines, space.step.config.microbatches
    n = space.work.images[0]  # with two encoders, as many images of each: split alike
    drawn = [np.bincount(data.draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n)), minlength=m)
             for _ in range(total)]
    layout = [int(np.argmax(c)) if c.max() == n else tuple(int(x) for x in c) for c in drawn]
    bound = space.whole_image_bound()
    assert bound.step_time >= space.step_bound.step_time
    for policy in ("greedy", "holes"):
        cand = space.layout_candidate(layout, (0, 0), policy=policy)
        assert pybubble.validate(cand.problem, cand.schedule) == []
        assert bound.step_time <= cand.step_time * (1 + 1e-12)


def test_the_stages_waits_lift_the_dual_shapes_two_stage_bounds(staged_spaces):
    dual = [s for s in staged_spaces if len(s.work.images) == 2]
    # the second stage's one-image chain through its rank's TP gaps before each deadline
    assert all(s.whole_image_bound().step_time > s.step_bound.step_time for s in dual)
