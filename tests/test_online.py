"""Online rescheduling with new durations, in the foreground and on a background thread."""

import numpy as np
import pytest

import pybubble
from pybubble.problem.generated import synthetic


def test_reschedule_equals_a_fresh_schedule_of_the_changed_problem():
    problem = synthetic(stages=3, microbatches=6, encoder_layers=6, encoder_scale=2.0)
    rng = np.random.default_rng(0)
    with pybubble.OnlineScheduler(problem) as online:
        for _ in range(5):
            d = problem.arrays().tasks.duration * rng.uniform(0.5, 1.5, problem.num_tasks)
            got = online.reschedule(d)
            changed = problem.with_durations(d)
            want = pybubble.schedule_problem(changed)
            np.testing.assert_array_equal(got.start, want.start)
            assert pybubble.validate(changed, got) == []


def test_submit_runs_in_the_background_and_reports_errors():
    problem = synthetic(stages=2, microbatches=4, encoder_layers=2)
    d = problem.arrays().tasks.duration
    with pybubble.OnlineScheduler(problem, policy="coarse") as online:
        futures = [online.submit(d * k) for k in (1.0, 2.0, 3.0)]
        steps = [f.result(timeout=30).step_time for f in futures]
        assert steps[0] < steps[1] < steps[2]
        bad = d.copy()
        bad[0] = np.nan
        with pytest.raises(ValueError, match=r"durations\[0\]"):
            online.submit(bad).result(timeout=30)
        with pytest.raises(ValueError, match="durations: shape"):
            online.reschedule(d[:-1])


def test_scaled_durations_scale_each_encoder_microbatch():
    problem = synthetic(stages=2, microbatches=4, encoder_layers=2)
    a = problem.arrays()
    with pybubble.OnlineScheduler(problem) as online:
        scale = np.array([0.5, 1.0, 2.0, 0.0])
        np.testing.assert_array_equal(online.scaled_durations(scale), a.tasks.duration * scale[a.tasks.microbatch])
        with pytest.raises(ValueError, match=r"scale: shape \(3,\)"):
            online.scaled_durations(scale[:3])
        with pytest.raises(ValueError, match=r"scale\[1\]: -1.0"):
            online.scaled_durations(np.array([1.0, -1.0, 1.0, 1.0]))


# ---- per-batch plan choice ---------------------------------------------------------------------

SMALL = {"cluster": {"gpus": 16, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"},
         "encoders": [{"preset": "vit-l-14"}], "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 2048},
         "llm_plan": {"dp": 2, "pp": 4, "tp": 2}}


@pytest.fixture(scope="module")
def ranked():
    from pybubble.config.schema import load_config
    from pybubble.planner.dynamic import ranked_candidates

    return ranked_candidates(pybubble.LLMStep.of(load_config(SMALL)), 4)


def test_ranked_candidates_are_the_best_plans_on_the_mean_batch(ranked):
    from pybubble.config.schema import load_config
    from pybubble.planner.search import encoder_plans, encoder_problem
    from pybubble.llm.step import even_split

    config = load_config(SMALL)
    step = pybubble.LLMStep.of(config)
    even = {(p.pp_enc, p.tp_enc): pybubble.schedule_problem(encoder_problem(
        step, p, even_split(config.microbatches, p.pipelines))).step_time for p in encoder_plans(config)}
    assert len(even) > 4
    steps = [c.step_time for c in ranked]
    assert len(ranked) == 4 and steps == sorted(steps)
    # each plan's searched partition is no worse than its even one, and the best beats every even one
    assert all(c.step_time <= even[(c.plan.pp_enc, c.plan.tp_enc)] for c in ranked)
    assert steps[0] <= min(even.values())
    assert len({(c.plan.pp_enc, c.plan.tp_enc) for c in ranked}) == 4  # four different plans
    assert {c.problem.num_microbatches for c in ranked} == {config.microbatches}
    assert all(sum(c.partition) + sum(c.spread) == config.microbatches for c in ranked)


def test_choice_is_the_best_reschedule_when_the_budget_allows_all(ranked):
    from pybubble.planner.dynamic import PlanChooser

    rng = np.random.default_rng(1)
    chooser = PlanChooser(ranked, budget=10.0)
    refs = [pybubble.OnlineScheduler(c.problem) for c in ranked]
    picked = set()
    for _ in range(40):  # the best plan on the mean batch (spread, more warm-up) wins most batches
        scale = rng.lognormal(0.0, 0.8, ranked[0].problem.num_microbatches)
        got = chooser.choose(scale)
        steps = [r.reschedule(r.scaled_durations(scale)).step_time for r in refs]
        assert got.evaluated == len(ranked)
        assert got.schedule.step_time == min(steps)
        assert steps[got.index] == min(steps)
        changed = ranked[got.index].problem.with_durations(refs[got.index].scaled_durations(scale))
        assert pybubble.validate(changed, got.schedule) == []
        picked.add(got.index)
    assert len(picked) > 1  # the batches do call for different plans
    chooser.close()


def test_choice_stops_when_the_budget_is_spent(ranked):
    from pybubble.planner.dynamic import PlanChooser

    scale = np.ones(ranked[0].problem.num_microbatches)
    chooser = PlanChooser(ranked, budget=0.0)
    for _ in range(3):
        got = chooser.choose(scale)
        assert got.evaluated == 1 and got.index == 0
        assert got.schedule.step_time == ranked[0].step_time  # the mean batch: scale 1
    with pytest.raises(ValueError, match="budget: -1"):
        PlanChooser(ranked, budget=-1)
    with pytest.raises(ValueError, match="candidates: empty"):
        PlanChooser([])


def test_replicas_wait_for_the_slowest_so_an_imbalanced_step_costs_more():
    from pybubble.schedule.online import ReplicaScheduler, data_parallel_step

    # an encoder too large for the bubbles: more work on a replica lengthens its step
    problem = synthetic(stages=3, microbatches=6, encoder_layers=6, encoder_scale=2.0)
    balanced = np.ones((2, 6))
    imbalanced = np.array([[1.6] * 6, [0.4] * 6])  # the same encoder work in all
    with ReplicaScheduler(problem) as each:
        even = [s.step_time for s in each.reschedule(balanced)]
        uneven = [s.step_time for s in each.reschedule(imbalanced)]
        assert each.took.shape == (2,) and (each.took > 0).all()
    assert data_parallel_step(uneven) == max(uneven) > np.mean(uneven)  # the light replica waits
    assert data_parallel_step(uneven) > data_parallel_step(even)
    assert data_parallel_step(even) == even[0] == even[1]
    for bad, message in (([], "step_times: no replicas"), ([1.0, -2.0], r"step_times\[1\]")):
        with pytest.raises(ValueError, match=message):
            data_parallel_step(bad)


def test_replicas_split_over_threads_give_the_same_valid_schedules():
    from pybubble.schedule.online import ReplicaScheduler

    problem = synthetic(stages=3, microbatches=6, encoder_layers=6, encoder_scale=2.0)
    scale = np.random.default_rng(2).uniform(0.2, 2.0, (5, 6))
    with ReplicaScheduler(problem) as one, ReplicaScheduler(problem, threads=2) as two:
        got, want = two.reschedule(scale), one.reschedule(scale)
        for k, (a, b) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(a.start, b.start)
            assert a.assignment.tolist() == list(range(6))  # microbatch j's data feeds LLM microbatch j
            assert pybubble.validate(problem.with_durations(two.durations(scale[k])), a) == []
        with pytest.raises(ValueError, match=r"scale: shape \(5, 5\), expected \(replicas, 6\)"):
            two.reschedule(scale[:, :5])
        with pytest.raises(ValueError, match="scale"):
            two.reschedule(-scale)
    with pytest.raises(ValueError, match="threads: 0"):
        ReplicaScheduler(problem, threads=0)


# ---- every replica in one call ------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pybubble.problem.generated import random_problem  # noqa: E402

replica_problems = st.one_of(
    st.builds(random_problem, st.integers(0, 2**32 - 1), lanes=st.integers(1, 3), microbatches=st.integers(1, 4),
              max_windows=st.integers(0, 4), max_fwd=st.integers(1, 4), max_bwd=st.integers(0, 4),
              horizon=st.sampled_from([10, 100, 1000]), max_duration=st.integers(0, 30)),
    st.builds(synthetic, stages=st.integers(1, 4), lanes_per_stage=st.integers(1, 2), twin_lanes=st.integers(1, 4),
              microbatches=st.integers(1, 6), encoder_layers=st.just(4), kernels_per_layer=st.integers(1, 6),
              tp_gaps_per_op=st.integers(0, 3), encoder_scale=st.floats(0.0, 8.0), seed=st.integers(0, 1000)))


@given(replica_problems, st.integers(0, 2**32 - 1), st.integers(1, 3), st.sampled_from(["greedy", "coarse"]),
       st.booleans())
@settings(max_examples=80)
def test_every_replica_in_one_call_is_the_online_schedule_of_its_durations(problem, seed, threads, policy, fixed):
    """ReplicaScheduler.run (one core call, the replicas over threads, twin lanes scheduled as one
    copy) gives each replica exactly OnlineScheduler's schedule of its scaled durations."""
    from pybubble.schedule.online import ReplicaScheduler

    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.0, 3.0, (4, problem.num_microbatches)) * (rng.random((4, problem.num_microbatches)) < 0.9)
    with ReplicaScheduler(problem, threads=threads, policy=policy, fixed_assignment=fixed) as each, \
            pybubble.OnlineScheduler(problem, policy, fixed_assignment=fixed) as online:
        plans = each.run(scale)
        assert len(plans) == 4 and plans.start.shape == (4, problem.num_tasks // plans.copies)
        np.testing.assert_array_equal(plans.took, each.took)
        for k in range(4):
            want = online.reschedule(each.durations(scale[k]))
            got = plans.schedule(k)
            np.testing.assert_array_equal(got.start, want.start)
            np.testing.assert_array_equal(got.assignment, want.assignment)
            assert (got.step_time, got.shift_front, got.shift_back) == \
                (want.step_time, want.shift_front, want.shift_back)
            assert plans.step_time[k] == want.step_time
            assert pybubble.validate(problem.with_durations(each.durations(scale[k])), got) == []


def test_twin_lanes_are_scheduled_as_one_copy():
    from pybubble import _core
    from pybubble.schedule.online import ReplicaScheduler

    twins = synthetic(stages=2, twin_lanes=4, microbatches=4, encoder_layers=4, encoder_scale=3.0)
    plain = synthetic(stages=2, microbatches=4, encoder_layers=4, encoder_scale=3.0)
    assert twins.num_lanes == 4 * plain.num_lanes and twins.num_tasks == 4 * plain.num_tasks
    assert twins.lane_names[:5] == ["pp0.enc0.twin0", "pp0.enc0.twin1", "pp0.enc0.twin2", "pp0.enc0.twin3",
                                "pp0.enc1.twin0"]
    assert _core.twin_copies(twins.core) == 4 and _core.twin_copies(plain.core) == 1
    scale = np.array([[0.5, 1.0, 2.0, 0.0], [3.0, 1.0, 1.0, 1.0]])
    with ReplicaScheduler(twins, threads=2) as a, ReplicaScheduler(plain) as b:
        assert (a.copies, b.copies) == (4, 1)
        x, y = a.run(scale), b.run(scale)
        # the plain problem's tasks are the twins' copy 0: the same rows
        np.testing.assert_array_equal(x.start, y.start)
        np.testing.assert_array_equal(x.schedule(1).start, np.repeat(y.start[1], 4))
        assert x.step_time.tolist() == y.step_time.tolist()
    # one copy of one task changed: no twins, the same schedules as each replica's alone
    a = twins.arrays()
    a.tasks.duration[1] *= 1.5
    changed = pybubble.Problem.from_arrays(a)
    with ReplicaScheduler(changed) as c, pybubble.OnlineScheduler(changed, fixed_assignment=True) as online:
        assert c.copies == 1
        np.testing.assert_array_equal(c.run(scale).schedule(0).start, online.reschedule(c.durations(scale[0])).start)
    with pytest.raises(ValueError, match="twin_lanes: 0 is < 1"):
        synthetic(twin_lanes=0)


def test_one_call_refuses_bad_input_naming_the_field():
    from pybubble import _core
    from pybubble.schedule.online import ReplicaScheduler

    problem = synthetic(stages=2, microbatches=3, encoder_layers=2, twin_lanes=2)
    with ReplicaScheduler(problem) as each:
        scale = np.ones((2, 3))
        for bad, message in ((np.ones((2, 4)), r"scale: shape \(2, 4\), expected \(replicas, 3\)"),
                             (np.ones(3), r"scale: shape \(3,\) is not 2-dimensional"),
                             (np.array([[1.0, np.nan, 1.0]]), r"scale\[0, 1\]: nan is not a finite number >= 0"),
                             (np.array([[1.0, 1.0, -2.0]]), r"scale\[0, 2\]: -2.0 is not a finite number >= 0"),
                             ([["a", 1, 1]], "scale: .* is not an array of numbers")):
            with pytest.raises(ValueError, match=message):
                each.run(bad)
        plans = each.run(scale)
        with pytest.raises(ValueError, match="replica: 2"):
            plans.schedule(2)
        assert len(each.run(np.zeros((0, 3)))) == 0
    core = _core.ReplicaScheduler(problem.core, 2)
    for bad, message in ((np.ones((2, 4)), "scale: expected an N x 3 array, got 4 columns"),
                         (np.array([[1.0, 1e300, 1.0]]), r"scale\[0, 1\]: 1e\+300 makes a task of encoder microbatch 1 "
                                                        r"last .* above the largest time"),
                         (np.array([[1.0, -1.0, 1.0]]), r"scale\[0, 1\]: -1 is not a finite number >= 0"),
                         (np.array([[True, False, True]]), "scale: dtype bool")):
        with pytest.raises(ValueError, match=message):
            core.run(bad)
    for kwargs, message in (({"threads": 0}, "threads: 0"), ({"policy": "fast"}, "policy: 'fast'"),
                            ({"threads": 1.5}, "threads: 1.5 is not an integer")):
        with pytest.raises(ValueError, match=message):
            _core.ReplicaScheduler(problem.core, **kwargs)
    with pytest.raises(ValueError, match="problem: .* is not a _core.Problem"):
        _core.ReplicaScheduler(problem)


def test_the_planners_problems_in_one_call(ranked):
    """The planner's encoder problems: the encoder pipelines of one LLM stage that share every
    microbatch evenly are twin lanes (here two per stage, the LLM's TP 2 over an encoder of TP 1);
    each replica's schedule is the online scheduler's all the same."""
    from pybubble.schedule.online import ReplicaScheduler

    copies = set()
    scale = np.random.default_rng(4).uniform(0.3, 2.5, (3, ranked[0].problem.num_microbatches))
    for c in ranked:
        with ReplicaScheduler(c.problem, threads=2) as each, \
                pybubble.OnlineScheduler(c.problem, fixed_assignment=True) as online:
            copies.add(each.copies)
            plans = each.run(scale)
            for k in range(len(scale)):
                np.testing.assert_array_equal(plans.schedule(k).start, online.reschedule(each.durations(scale[k])).start)
    assert 1 in copies and max(copies) > 1


def test_rows_of_a_kept_result_are_never_overwritten_and_released_ones_are_reused():
    from pybubble.schedule.online import ReplicaScheduler

    problem = synthetic(stages=2, microbatches=3, encoder_layers=2, twin_lanes=2, encoder_scale=3.0)
    s1, s2 = np.full((3, 3), 0.5), np.full((3, 3), 2.0)
    with ReplicaScheduler(problem) as each:
        a = each.run(s1)
        kept = a.start.copy()
        address = a.start.ctypes.data
        b = each.run(s2)
        assert b.start.ctypes.data != address and not np.array_equal(b.start, kept)
        np.testing.assert_array_equal(a.start, kept)  # the second run wrote elsewhere
        del a
        c = each.run(s1)
        assert c.start.ctypes.data == address  # the released rows, written again
        np.testing.assert_array_equal(c.start, kept)
