"""Loading pybubble.problem/1: every malformed field is rejected with a ValueError naming it, and
no input crashes the core."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pybubble
from pybubble.problem.arrays import TASK_FIELDS
from pybubble.problem.generated import random_problem


def base():
    return {"format": "pybubble.problem/1", "horizon": 100.0,
            "lanes": [{"name": "pp0.tp0", "compute_free": [[0.0, 10.0], [20.0, 30.0]], "link_free": [[10.0, 20.0]]},
                      {"name": "pp1.tp0", "compute_free": [], "link_free": []}],
            "microbatches": [{"forward_needed": 10.0, "grad_ready": 80.0},
                             {"forward_needed": 20.0, "grad_ready": 90.0}],
            "tasks": [{"id": 0, "lane": 0, "duration": 5.0, "resource": "compute", "phase": "fwd",
                       "microbatch": 0, "after": []},
                      {"id": 1, "lane": 1, "duration": 5.0, "resource": "comm", "phase": "fwd",
                       "microbatch": 0, "after": [0]},
                      {"id": 2, "lane": 1, "duration": 5.0, "resource": "compute", "phase": "bwd",
                       "microbatch": 0, "after": [1]},
                      {"id": 3, "lane": 0, "duration": 5.0, "resource": "compute", "phase": "fwd",
                       "microbatch": 1, "after": []}]}


def test_valid_problem_loads_and_round_trips(tmp_path):
    p = pybubble.load_problem(base())
    assert (p.num_lanes, p.num_microbatches, p.num_tasks) == (2, 2, 4)
    assert p.to_dict() == base()
    path = tmp_path / "p.json"
    p.save(path)
    assert pybubble.load_problem(path).to_dict() == base()


BAD = [
    (("format",), "pybubble.problem/2", r"format: 'pybubble.problem/2' is not 'pybubble.problem/1'"),
    (("horizon",), KeyError, r"horizon: missing"),
    (("horizon",), "100", r"horizon: '100' is not a number"),
    (("horizon",), float("nan"), r"horizon: nan is not a finite number"),
    (("horizon",), -1.0, r"horizon: -1 is negative"),
    (("lanes", 0, "name"), 3, r"lanes\[0\].name: 3 is not a string"),
    (("lanes", 0, "compute_free"), [[0.0, 10.0], [5.0, 30.0]],
     r"lanes\[0\].compute_free\[1\]: start 5 overlaps or precedes"),
    (("lanes", 0, "compute_free"), [[20.0, 30.0], [0.0, 10.0]], r"lanes\[0\].compute_free\[1\]"),
    (("lanes", 0, "compute_free"), [[0.0, 0.0]], r"lanes\[0\].compute_free\[0\]: start 0 is not before end 0"),
    (("lanes", 0, "compute_free"), [[90.0, 110.0]], r"lanes\[0\].compute_free\[0\]: end 110 is after the horizon"),
    (("lanes", 0, "link_free"), [[-5.0, 1.0]], r"lanes\[0\].link_free\[0\]: start -5 is before 0"),
    (("lanes", 0, "link_free"), [[1.0]], r"lanes\[0\].link_free\[0\]: \[1.0\] is not a \[start, end\] pair"),
    (("lanes", 1, "link_free"), KeyError, r"lanes\[1\].link_free: missing"),
    (("microbatches", 0, "forward_needed"), 200.0, r"microbatches\[0\].forward_needed: 200 is outside"),
    (("microbatches", 0, "grad_ready"), 5.0, r"microbatches\[0\].grad_ready: 5 is before forward_needed 10"),
    (("tasks", 2, "id"), 7, r"tasks\[2\].id: 7 is not its index 2"),
    (("tasks", 2, "after"), [3], r"tasks\[2\].after\[0\]: 3 is not < 2"),
    (("tasks", 1, "after"), [0, -1], r"tasks\[1\].after\[1\]: -1 is negative"),
    (("tasks", 3, "after"), [2], r"tasks\[3\].after\[0\]: 2 is a backward task, a predecessor of forward task 3"),
    (("tasks", 3, "after"), [0], r"tasks\[3\].after\[0\]: 0 belongs to microbatch 0, task 3 to microbatch 1"),
    (("tasks", 0, "lane"), 2, r"tasks\[0\].lane: 2 is not in \[0, 2\)"),
    (("tasks", 0, "lane"), True, r"tasks\[0\].lane: True is not an integer"),
    (("tasks", 0, "microbatch"), 5, r"tasks\[0\].microbatch: 5 is not in \[0, 2\)"),
    (("tasks", 0, "duration"), -1.0, r"tasks\[0\].duration: -1 is negative"),
    (("tasks", 0, "duration"), float("inf"), r"tasks\[0\].duration: inf is not a finite number"),
    (("tasks", 0, "resource"), "gpu", r"tasks\[0\].resource: 'gpu' is not one of compute, comm"),
    (("tasks", 0, "phase"), "fw", r"tasks\[0\].phase: 'fw' is not one of fwd, bwd"),
    (("tasks", 0, "after"), "0", r"tasks\[0\].after: expected a list, got str"),
    (("tasks",), {}, r"tasks: expected a list, got dict"),
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[m for _, _, m in BAD])
def test_malformed_problem_names_the_field(path, value, message, replaced):
    with pytest.raises(ValueError, match=message):
        pybubble.load_problem(replaced(base(), path, value))


def test_unreadable_files_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        pybubble.load_problem(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        pybubble.load_problem(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        pybubble.load_problem(bad)


def test_malformed_schedules_name_the_field():
    good = {"format": "pybubble.schedule/1", "step_time": 1.0, "shift_front": 0.0, "shift_back": 0.0,
            "start": [0.0], "assignment": [0]}
    assert pybubble.load_schedule(good).start.tolist() == [0.0]
    for key, value, message in [("format", "x", "format"), ("start", [0.0, "a"], r"start\[1\]"),
                                ("assignment", [0.5], r"assignment\[0\]: 0.5 is not an integer"),
                                ("step_time", None, "step_time: None is not a number")]:
        doc = dict(good, **{key: value})
        with pytest.raises(ValueError, match=message):
            pybubble.load_schedule(doc)


def mutate(doc, data):
    """Replace one leaf of the document by an arbitrary JSON value."""
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + [i])
        paths.append(path)

    walk(doc, [])
    path = data.draw(st.sampled_from([p for p in paths if p]))
    value = data.draw(st.one_of(st.none(), st.booleans(), st.integers(-5, 2**40), st.floats(allow_nan=True),
                                st.text(max_size=3), st.lists(st.integers(-3, 10), max_size=3),
                                st.lists(st.floats(-10, 200), min_size=2, max_size=2)))
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return doc


@given(st.integers(0, 10_000), st.data())
@settings(max_examples=300, deadline=None)
def test_fuzzed_problems_load_or_raise_value_error(seed, data):
    doc = mutate(copy.deepcopy(random_problem(seed).to_dict()), data)
    try:
        p = pybubble.load_problem(json.loads(json.dumps(doc)))
    except ValueError:
        return
    s = pybubble.schedule_problem(p)
    assert pybubble.validate(p, s) == []


def test_a_task_whose_duration_vanishes_in_its_end_occupies_no_time():
    """Found by the long fuzz run (issue 23): a duration of 2.5e-195 us ends where it starts (74 us),
    so the scheduler put it where another task starts, and the validator called that an overlap."""
    doc = random_problem(2).to_dict()
    doc["tasks"][8]["duration"] = 2.5484236940500735e-195
    p = pybubble.load_problem(doc)
    s = pybubble.schedule_problem(p)
    assert s.start[8] + p.arrays().tasks.duration[8] == s.start[8]  # the case is still the one found
    assert pybubble.validate(p, s) == []


ARRAY_FIELDS = [("compute_free", k) for k in ("offset", "start", "end")] + \
    [("link_free", k) for k in ("offset", "start", "end")] + [("forward_needed",), ("grad_ready",)] + \
    [("tasks", k) for k in TASK_FIELDS]


@given(st.integers(0, 10_000), st.data())
@settings(max_examples=300, deadline=None)
def test_fuzzed_core_arrays_never_crash(seed, data):
    arrays = random_problem(seed).arrays()
    path = data.draw(st.sampled_from(ARRAY_FIELDS))
    owner = arrays if len(path) == 1 else getattr(arrays, path[0])
    arr = np.asarray(getattr(owner, path[-1]))
    size = data.draw(st.integers(0, arr.size + 2))
    if arr.dtype == np.int64:
        new = np.array(data.draw(st.lists(st.integers(-3, 2**31), min_size=size, max_size=size)), np.int64)
    else:
        new = np.array(data.draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=size,
                                          max_size=size)), np.float64)
    setattr(owner, path[-1], new)
    try:
        p = pybubble.Problem.from_arrays(arrays)
    except ValueError:
        return
    assert pybubble.validate(p, pybubble.schedule_problem(p)) == []


def test_with_tasks_shares_the_bubbles_and_checks_the_tasks():
    from pybubble.problem.arrays import ProblemArrays, Tasks
    from pybubble.schedule.scheduler import schedule_problem

    problem = random_problem(3)
    a = problem.arrays()
    empty = pybubble.Problem.from_arrays(ProblemArrays(horizon=a.horizon, compute_free=a.compute_free,
                                                       link_free=a.link_free, forward_needed=a.forward_needed,
                                                       grad_ready=a.grad_ready, tasks=Tasks.empty()), problem.lane_names)
    again = empty.with_tasks(a.tasks)
    assert again.to_dict() == problem.to_dict() and again.lane_names == problem.lane_names
    assert schedule_problem(again).step_time == schedule_problem(problem).step_time
    bad = copy.copy(a.tasks)
    bad.lane = np.full(len(a.tasks), problem.num_lanes)
    with pytest.raises(ValueError, match=r"tasks\[0\]\.lane: "):
        empty.with_tasks(bad)


def test_joined_blocks_are_the_partition_tasks_given_whole():
    """A partition's problem joined from its pipelines' one-microbatch blocks is the problem of
    ``EncoderWork.tasks(partition)``: the same arrays, the same schedule; bad joins are refused."""
    from pybubble.llm.step import LLMStep
    from pybubble.planner.candidate import encoder_plans
    from pybubble.problem.arrays import Tasks
    from pybubble.planner.space import PlanSpace
    from pybubble.schedule.scheduler import schedule_problem

    cfg = pybubble.load_config(Path(__file__).resolve().parent.parent / "examples" / "quickstart.yaml")
    step = LLMStep.of(cfg)
    plan = max(encoder_plans(cfg), key=lambda p: p.pipelines)
    space = PlanSpace(step, plan)
    m = cfg.microbatches
    for partition in ([m] + [0] * (plan.pipelines - 1), [0] * (plan.pipelines - 1) + [m],
                      [m // plan.pipelines] * (plan.pipelines - 1) + [m - m // plan.pipelines * (plan.pipelines - 1)]):
        joined = space.partition_problem(partition)
        whole = space.bubbles.with_tasks(space.work.tasks(partition))
        assert joined.to_dict() == whole.to_dict()
        assert np.array_equal(schedule_problem(joined).start, schedule_problem(whole).start)
    blocks = [space.bubbles.with_tasks(space.work.microbatch_tasks(i)) for i in range(plan.pipelines)]
    with pytest.raises(ValueError, match=r"counts\[0\]: -1 is negative"):
        space.bubbles.joined(blocks[:1], [-1])
    with pytest.raises(ValueError, match=rf"counts: {m + 1} microbatches or more, the problem has {m}"):
        space.bubbles.joined(blocks[:1], [m + 1])
    other = pybubble.Problem.on_timeline(step.timeline, Tasks.empty(), plan.lanes_per_stage, space.windows)
    with pytest.raises(ValueError, match=r"blocks\[0\]: not a problem on these bubbles"):
        space.bubbles.joined([other.with_tasks(space.work.microbatch_tasks(0))], [1])
    with pytest.raises(ValueError, match=r"blocks: .* is not a list of Problem"):
        space.bubbles.joined(["x"], [1])
    with pytest.raises(ValueError, match=rf"partition: {plan.pipelines + 1} entries"):
        space.partition_problem([1] * (plan.pipelines + 1))
