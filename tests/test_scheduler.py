"""Invariants of every schedule (hypothesis), the differential test against the pure-Python
reference, and the validator catching broken schedules."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pybubble
from pybubble.problem.generated import random_problem, synthetic
from pybubble.schedule.scheduler import justified
from pybubble.testing.holes import ORDERS, Holes, orders, reference_holes
from pybubble.testing.justify import reference_justified
from pybubble.testing.reference import reference_schedule

random_problems = st.builds(
    random_problem, st.integers(0, 2**32 - 1), lanes=st.integers(1, 3), microbatches=st.integers(1, 4),
    max_windows=st.integers(0, 4), max_fwd=st.integers(1, 4), max_bwd=st.integers(0, 4),
    horizon=st.sampled_from([10, 100, 1000]), max_duration=st.integers(0, 30), pieces=st.integers(1, 3))

generated_problems = st.builds(
    synthetic, stages=st.integers(1, 4), lanes_per_stage=st.integers(1, 2), twin_lanes=st.integers(1, 3),
    microbatches=st.integers(1, 6),
    encoder_layers=st.just(4), kernels_per_layer=st.integers(1, 6), tp_gaps_per_op=st.integers(0, 3),
    encoder_scale=st.floats(0.0, 8.0), jitter=st.floats(0.0, 0.5), seed=st.integers(0, 1000))

problems = st.one_of(random_problems, generated_problems)
settings.register_profile("pybubble", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pybubble")


@given(problems, st.sampled_from(["greedy", "coarse", "holes"]))
@settings(max_examples=150)
def test_every_schedule_is_valid(problem, policy):
    sched = pybubble.schedule_problem(problem, policy)
    assert pybubble.validate(problem, sched) == []
    assert sched.step_time >= problem.horizon
    assert sched.shift_front >= 0 and sched.shift_back >= 0
    assert sorted(sched.assignment.tolist()) == list(range(problem.num_microbatches))


@given(problems)
@settings(max_examples=150)
def test_greedy_is_never_worse_than_coarse(problem):
    assert pybubble.schedule_problem(problem).step_time <= pybubble.schedule_problem(problem, "coarse").step_time


@given(problems, st.sampled_from(["greedy", "coarse", "holes"]))
@settings(max_examples=150)
def test_core_equals_reference(problem, policy):
    core = pybubble.schedule_problem(problem, policy)
    ref = reference_holes(problem) if policy == "holes" else reference_schedule(problem, policy)
    np.testing.assert_array_equal(core.start, ref.start)
    np.testing.assert_array_equal(core.assignment, ref.assignment)
    assert core.step_time == ref.step_time
    assert core.shift_front == ref.shift_front and core.shift_back == ref.shift_back


@given(problems)
@settings(max_examples=100)
def test_holes_is_the_best_of_its_orders_and_never_worse_than_coarse(problem):
    holes = pybubble.schedule_problem(problem, "holes")
    steps = [Holes(problem).run(*order).step_time for order in orders(problem)]
    assert holes.step_time == min(steps)
    assert holes.step_time <= pybubble.schedule_problem(problem, "coarse").step_time


@given(problems, st.sets(st.integers(0, 4), min_size=1))
@settings(max_examples=100)
def test_holes_tries_the_orders_it_is_given_and_says_which_gave_its_schedule(problem, picked):
    applies = orders(problem)
    ran = {o if ORDERS[o] in applies else 2 for o in picked}  # an order that does not apply runs as order 2
    steps = {o: Holes(problem).run(*ORDERS[o]).step_time for o in ran}
    sched = pybubble.schedule_problem(problem, "holes", orders=sorted(picked))
    assert sched.step_time == min(steps.values())
    assert pybubble.validate(problem, sched) == []
    whole, order = pybubble.schedule.scheduler.holes_schedule(problem)
    alone = pybubble.schedule_problem(problem, "holes", orders=[order])
    np.testing.assert_array_equal(whole.start, pybubble.schedule_problem(problem, "holes").start)
    np.testing.assert_array_equal(whole.start, alone.start)
    assert whole.step_time == reference_holes(problem).step_time and ORDERS[order] in applies


@pytest.mark.parametrize("orders_, message", [([], "orders: empty"), ([5], "orders"), ([-1], "orders"),
                                              ("3", "orders: expected a list"), ([1.5], "orders")])
def test_holes_orders_that_are_not_orders_are_refused(orders_, message):
    problem = random_problem(3, lanes=2, microbatches=2)
    with pytest.raises(ValueError, match=message):
        pybubble.schedule_problem(problem, "holes", orders=orders_)
    for mask in (0, 32, -1):
        with pytest.raises(ValueError, match=f"orders: {mask} is not a mask"):
            pybubble._core.Scheduler(problem.core).run("holes", orders=mask)
    with pytest.raises(ValueError, match="orders"):
        pybubble._core.Scheduler(problem.core).run("holes", orders="3")
    assert pybubble._core.Scheduler(problem.core).holes_order == -1  # no run yet


@given(problems, st.floats(0.0, 3.0))
@settings(max_examples=60)
def test_holes_takes_new_durations(problem, scale):
    durations = problem.arrays().tasks.duration * scale
    core = pybubble._core.Scheduler(problem.core)
    sched = pybubble.schedule.scheduler.from_core(core.run("holes", durations))
    with_durations = pybubble.load_problem({**problem.to_dict(), "tasks": [
        {**t, "duration": float(d)} for t, d in zip(problem.to_dict()["tasks"], durations)]})
    assert pybubble.validate(with_durations, sched) == []


@given(problems)
@settings(max_examples=60)
def test_coarse_keeps_forward_before_and_backward_after_the_step(problem):
    sched = pybubble.schedule_problem(problem, "coarse")
    a = problem.arrays()
    fwd = a.tasks.phase == 0
    assert np.all(sched.start[fwd] + a.tasks.duration[fwd] <= 1e-9)
    assert np.all(sched.start[~fwd] >= problem.horizon)


@given(problems)
@settings(max_examples=60)
def test_schedule_round_trips_through_json(problem):
    sched = pybubble.schedule_problem(problem)
    again = pybubble.load_schedule(sched.to_dict())
    np.testing.assert_array_equal(again.start, sched.start)
    assert pybubble.validate(pybubble.load_problem(problem.to_dict()), again) == []


def test_greedy_hides_encoder_work_on_a_pipeline():
    problem = synthetic(stages=4, microbatches=8, encoder_layers=8, encoder_scale=2.0)
    greedy, coarse = pybubble.schedule_problem(problem), pybubble.schedule_problem(problem, "coarse")
    assert coarse.hidden_fraction(problem) == 0.0
    assert greedy.hidden_fraction(problem) > 0.3
    assert greedy.step_time < coarse.step_time


def test_comm_tasks_never_go_into_compute_only_windows():
    # One lane whose only window is a compute window: the comm task must stay outside the step.
    doc = {"format": "pybubble.problem/1", "horizon": 100.0,
           "lanes": [{"name": "l", "compute_free": [[10.0, 90.0]], "link_free": []}],
           "microbatches": [{"forward_needed": 100.0, "grad_ready": 100.0}],
           "tasks": [{"id": 0, "lane": 0, "duration": 5.0, "resource": "compute", "phase": "fwd",
                      "microbatch": 0, "after": []},
                     {"id": 1, "lane": 0, "duration": 5.0, "resource": "comm", "phase": "fwd",
                      "microbatch": 0, "after": [0]}]}
    problem = pybubble.load_problem(doc)
    sched = pybubble.schedule_problem(problem)
    assert pybubble.validate(problem, sched) == []
    assert sched.start[1] + 5.0 <= 0.0  # the comm task runs before the step...
    assert sched.start[0] + 5.0 <= sched.start[1]  # ...and so does its predecessor
    doc["lanes"][0]["link_free"] = [[50.0, 60.0]]
    sched = pybubble.schedule_problem(pybubble.load_problem(doc))
    assert sched.step_time == 100.0 and 50.0 <= sched.start[1] <= 55.0


def shifted(sched, start=None, **changes):
    d = sched.to_dict()
    if start is not None:
        d["start"] = [float(x) for x in start]
    d.update(changes)
    return pybubble.load_schedule(d)


def test_validator_reports_each_kind_of_violation():
    problem = synthetic(stages=2, microbatches=4, encoder_layers=2, kernels_per_layer=3)
    sched = pybubble.schedule_problem(problem)
    a = problem.arrays()
    # A task moved before its predecessor.
    t = int(np.nonzero(a.tasks.after_offset[1:] - a.tasks.after_offset[:-1])[0][0])
    start = sched.start.copy()
    start[t] -= 1e6
    assert any("before its predecessor" in v for v in pybubble.validate(problem, shifted(sched, start)))
    # Two tasks of one lane and resource at once, inside a window.
    start = sched.start.copy()
    same = np.nonzero((a.tasks.lane == a.tasks.lane[0]) & (a.tasks.resource == a.tasks.resource[0]) & (a.tasks.duration > 0))[0]
    start[same[1]] = start[same[0]]
    assert any("overlap" in v for v in pybubble.validate(problem, shifted(sched, start)))
    # A task in the middle of the step where no window is.
    start = sched.start.copy()
    assert a.tasks.resource[0] == 0
    # Just after the first compute window of task 0's lane, the LLM computes.
    start[0] = a.compute_free.end[a.compute_free.offset[a.tasks.lane[0]]] + 1.0
    assert any("outside every free" in v for v in pybubble.validate(problem, shifted(sched, start)))
    # A wrong step time, a non-permutation.
    assert any("step_time" in v for v in pybubble.validate(problem, shifted(sched, step_time=1.0)))
    bad = sched.assignment.copy()
    bad[0] = bad[1]
    assert any("already fed" in v for v in pybubble.validate(problem, shifted(sched, assignment=bad.tolist())))


def test_validator_reports_missed_forward_needed():
    problem = synthetic(stages=2, microbatches=4, encoder_layers=2, kernels_per_layer=3)
    sched = pybubble.schedule_problem(problem)
    # Swap the assignment so an encoder microbatch feeds an LLM microbatch too early for it.
    late = int(np.argmax(sched.assignment))
    early = int(np.argmin(sched.assignment))
    a = sched.assignment.copy()
    a[late], a[early] = a[early], a[late]
    v = pybubble.validate(problem, shifted(sched, assignment=a.tolist()))
    assert v == [] or any("needs it at" in x or "gradient at" in x for x in v)


def test_validate_rejects_schedules_of_the_wrong_shape():
    problem = synthetic(stages=2, microbatches=2, encoder_layers=2, kernels_per_layer=2)
    sched = pybubble.schedule_problem(problem)
    with pytest.raises(ValueError, match="start: 3 entries"):
        pybubble.validate(problem, shifted(sched, start=[0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="assignment: 1 entries"):
        pybubble.validate(problem, shifted(sched, assignment=[0]))


def test_scheduler_reruns_with_new_durations():
    from pybubble import _core

    problem = synthetic(stages=2, microbatches=4, encoder_layers=2)
    core = _core.Scheduler(problem.core)
    d = problem.arrays().tasks.duration * 1.5
    start, assignment, step, front, back = core.run("greedy", d)
    ref = pybubble.schedule_problem(problem.with_durations(d))
    np.testing.assert_array_equal(start, ref.start)
    assert step == ref.step_time
    with pytest.raises(ValueError, match=r"durations\[0\]"):
        core.run("greedy", np.full(problem.num_tasks, -1.0))
    with pytest.raises(ValueError, match="policy"):
        pybubble.schedule_problem(problem, "best")


def test_saved_schedules_have_no_negative_zero(tmp_path):
    from pybubble.problem.generated import random_problem
    from pybubble.schedule.scheduler import Schedule

    made = Schedule(step_time=5.0, shift_front=-0.0, shift_back=-0.0, start=np.array([-0.0, 1.0]),
                    assignment=np.array([0]))
    sched = pybubble.schedule_problem(random_problem(31))  # the core gives shift_front = -0.0 here
    for s in (made, sched):
        s.save(tmp_path / "s.json")
        assert "-0.0" not in (tmp_path / "s.json").read_text()


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_holes_interleaves_microbatches_outside_the_step(phase):
    # one lane, no free time inside the step (horizon 10); two microbatches, each a chain kernel 6 ->
    # collective 4 -> kernel 6 -> collective 4, needed at 0 (forward) or ready at the horizon
    # (backward). One chain after the other (the first three orders: the second's kernels do not fit
    # in the 4 us the first's collectives leave) grows the step by 36; interleaved, each
    # microbatch's kernels run during the other's collectives: by 28.
    chain = [(6.0, "compute"), (4.0, "comm"), (6.0, "compute"), (4.0, "comm")]
    tasks = [{"id": 4 * j + i, "lane": 0, "duration": d, "resource": res, "phase": phase, "microbatch": j,
              "after": [4 * j + i - 1] if i else []} for j in range(2) for i, (d, res) in enumerate(chain)]
    doc = {"format": "pybubble.problem/1", "horizon": 10.0, "lanes": [{"name": "l", "compute_free": [], "link_free": []}],
           "microbatches": [{"forward_needed": 0.0, "grad_ready": 10.0}] * 2, "tasks": tasks}
    problem = pybubble.load_problem(doc)
    assert orders(problem) == ORDERS[:4]  # a kernel after its lane's own collective; one chain per microbatch
    assert [Holes(problem).run(*order).step_time for order in ORDERS[:4]] == [46.0, 46.0, 46.0, 38.0]
    sched = pybubble.schedule_problem(problem, "holes")
    assert sched.step_time == 38.0 and pybubble.validate(problem, sched) == []
    assert sched.start.tolist() == ([10.0, 16.0, 22.0, 28.0, 16.0, 22.0, 28.0, 34.0] if phase == "bwd" else
                                    [-28.0, -20.0, -16.0, -8.0, -22.0, -14.0, -10.0, -4.0])


def test_holes_interleaves_only_where_a_kernel_follows_its_lanes_collective():
    # the chain of the test above with its collectives on another lane (sends, not collectives):
    # nothing to overlap on a lane, the fourth order is not run
    tasks = [{"id": 2 * j + i, "lane": i, "duration": 4.0, "resource": ("compute", "comm")[i], "phase": "bwd",
              "microbatch": j, "after": [2 * j] if i else []} for j in range(2) for i in range(2)]
    doc = {"format": "pybubble.problem/1", "horizon": 10.0,
           "lanes": [{"name": n, "compute_free": [], "link_free": []} for n in ("a", "b")],
           "microbatches": [{"forward_needed": 0.0, "grad_ready": 10.0}] * 2, "tasks": tasks}
    problem = pybubble.load_problem(doc)
    assert orders(problem) == ORDERS[:3]
    assert pybubble.schedule_problem(problem, "holes").start.tolist() == reference_holes(problem).start.tolist()


def test_holes_by_pieces_wins_where_a_microbatchs_pieces_would_wait_for_one_another():
    # a random problem whose microbatches hold one to three independent chains (pieces) on three
    # lanes: the order by pieces, where a chain that does not fit leaves the microbatch's other
    # pieces inside the step at their microbatch's turn, is shorter than every other order (on
    # 19 of 1,500 such problems it is; on none of the problems of one chain per microbatch does it run)
    problem = random_problem(7, lanes=3, microbatches=3, pieces=3)
    assert orders(problem) == ORDERS[:3] + ORDERS[4:]
    steps = [Holes(problem).run(*order).step_time for order in orders(problem)]
    assert steps[-1] < min(steps[:-1])
    sched = pybubble.schedule_problem(problem, "holes")
    assert sched.step_time == steps[-1] and pybubble.validate(problem, sched) == []
    assert sched.start.tolist() == reference_holes(problem).start.tolist()
    assert ORDERS[4] not in orders(random_problem(7, lanes=3, microbatches=3))


@given(problems, st.sampled_from(["greedy", "coarse", "holes"]))
@settings(max_examples=150)
def test_justified_is_valid_never_longer_and_equals_its_reference(problem, policy):
    sched = pybubble.schedule_problem(problem, policy)
    got = justified(problem, sched)
    assert pybubble.validate(problem, got) == []
    assert got.step_time <= sched.step_time
    assert got.shift_front <= sched.shift_front and got.shift_back <= sched.shift_back  # each phase on its own end
    np.testing.assert_array_equal(got.assignment, sched.assignment)
    ref = reference_justified(problem, sched)
    np.testing.assert_array_equal(got.start, ref.start)
    assert (got.step_time, got.shift_front, got.shift_back) == (ref.step_time, ref.shift_front, ref.shift_back)


def _chains(chains, phase):
    """One lane, no free time inside the step (horizon 10), a microbatch per chain of (duration,
    resource), needed at 0 (forward) or ready at the horizon (backward)."""
    tasks, i = [], 0
    for j, chain in enumerate(chains):
        for c, (d, res) in enumerate(chain):
            tasks.append({"id": i, "lane": 0, "duration": d, "resource": res, "phase": phase, "microbatch": j,
                          "after": [i - 1] if c else []})
            i += 1
    return pybubble.load_problem({"format": "pybubble.problem/1", "horizon": 10.0,
                                  "lanes": [{"name": "l", "compute_free": [], "link_free": []}],
                                  "microbatches": [{"forward_needed": 0.0, "grad_ready": 10.0}] * len(chains),
                                  "tasks": tasks})


def test_justified_packs_a_short_chain_into_a_long_ones_collectives():
    # a long chain (kernel 3 -> collective 1, four times) and a short one (kernel 1 -> collective 1,
    # three times) before the step: the greedy runs one after the other (31), the holes filler's
    # interleaved order lets the short chain's kernels take times the long one then waits for (27,
    # its other orders 31). Justified, every kernel of the short chain runs in the long one's
    # collectives: 26, the horizon and the long chain's path (16), the least any schedule reaches.
    long_, short = [(3.0, "compute"), (1.0, "comm")] * 4, [(1.0, "compute"), (1.0, "comm")] * 3
    problem = _chains([long_, short], "fwd")
    assert [Holes(problem).run(*order).step_time for order in ORDERS[:4]] == [31.0, 31.0, 31.0, 27.0]
    for policy, before in (("greedy", 31.0), ("holes", 27.0)):
        sched = pybubble.schedule_problem(problem, policy)
        got = justified(problem, sched)
        assert (sched.step_time, got.step_time) == (before, 26.0) and pybubble.validate(problem, got) == []
        assert got.start.tolist() == reference_justified(problem, sched).start.tolist()
    # after the step the greedy's backward of the same chains (31) closes the same way
    backward = _chains([long_, short], "bwd")
    sched = pybubble.schedule_problem(backward)
    assert (sched.step_time, justified(backward, sched).step_time) == (31.0, 26.0)


def test_justified_refuses_schedules_that_are_not_valid():
    problem = _chains([[(3.0, "compute"), (1.0, "comm")]], "fwd")
    sched = pybubble.schedule_problem(problem)
    late = pybubble.Schedule(step_time=sched.step_time, shift_front=sched.shift_front, shift_back=sched.shift_back,
                             start=sched.start + 1.0, assignment=sched.assignment)  # past forward_needed
    with pytest.raises(ValueError, match="schedule: not valid for the problem: "):
        justified(problem, late)
    with pytest.raises(ValueError, match="schedule: not valid for the problem: "):
        reference_justified(problem, late)
    short = pybubble.Schedule(step_time=sched.step_time, shift_front=sched.shift_front, shift_back=sched.shift_back,
                              start=sched.start[:1], assignment=sched.assignment)
    with pytest.raises(ValueError, match="start"):
        justified(problem, short)
