"""Every entry point of the C++ core under arbitrary input (issue 17): arrays of any dtype, shape,
memory order, length and value, and scalars of any type. Each call gives a ValueError or a valid
result (a schedule that passes the validator, a timeline whose times and windows hold together),
never a crash, a hang, another exception or a silently wrapped value."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pybubble
from pybubble import _core
from pybubble.llm import tables as schedules
from pybubble.problem.generated import random_problem

SETTINGS = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DTYPES = st.one_of(
    hnp.integer_dtypes(), hnp.unsigned_integer_dtypes(), hnp.floating_dtypes(), hnp.boolean_dtypes(),
    hnp.complex_number_dtypes(), st.just(np.dtype(object)), st.just(np.dtype("<U3")),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**400]),
    st.floats(), st.text(max_size=4), st.just(np.int8(3)), st.just(np.float32(1.5)), st.just(np.uint64(2**64 - 1)),
    st.lists(st.integers(0, 3), max_size=3),
)


def reorder(draw, arr: np.ndarray) -> np.ndarray:
    """The same values in another memory layout: reversed (negative strides), Fortran order, a
    strided view, or as they are."""
    how = draw(st.integers(0, 3))
    if arr.ndim == 0 or how == 0:
        return arr
    if how == 1:
        return np.ascontiguousarray(arr[::-1])[::-1]
    if how == 2:
        return np.asfortranarray(arr)
    doubled = np.repeat(arr, 2, axis=0)
    return doubled[::2]


@st.composite
def any_value(draw, like=None):
    """An arbitrary argument: a scalar, a list, or an array of any dtype, shape, order and value.
    With `like` (an array), often one of its length with nearby or converted values, so that some
    draws are valid and the checks past the first one are reached."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(SCALARS)
    if like is not None and choice <= 5:
        like = np.asarray(like)
        if choice <= 2:  # the same values in another dtype (lossless or not) and layout
            dtype = draw(DTYPES)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # complex to real, out-of-range casts: the point here
                try:
                    arr = like.astype(dtype)
                except (ValueError, TypeError, OverflowError):
                    arr = like
            return reorder(draw, arr)
        arr = like.copy()  # one or two values changed to anything of its dtype
        if arr.size:
            for _ in range(draw(st.integers(1, 2))):
                i = draw(st.integers(0, arr.size - 1))
                value = draw(hnp.from_dtype(arr.dtype)) if arr.dtype.kind in "iuf" else draw(SCALARS)
                try:
                    arr.flat[i] = value
                except (ValueError, TypeError, OverflowError):
                    pass
        if choice == 5 and arr.ndim == 1:  # one entry more or fewer
            arr = arr[:-1] if arr.size and draw(st.booleans()) else np.concatenate([arr, arr[:1]])
        return reorder(draw, arr)
    dtype = draw(DTYPES)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=6))
    elements = st.one_of(st.integers(-3, 10), st.none(), st.floats()) if dtype == np.dtype(object) else None
    arr = draw(hnp.arrays(dtype, shape, elements=elements))
    return reorder(draw, arr)


REFUSED = object()


def attempt(call):
    """call(), or REFUSED when it raises ValueError; counted as hypothesis events."""
    try:
        out = call()
    except ValueError:
        event("refused")
        return REFUSED
    event("accepted")
    return out


def namespace(d):
    return SimpleNamespace(**{k: namespace(v) if isinstance(v, dict) else v for k, v in d.items()})


def check_schedule(problem: pybubble.Problem, result) -> None:
    start, assignment, step_time, shift_front, shift_back = result
    s = pybubble.Schedule(step_time=step_time, shift_front=shift_front, shift_back=shift_back, start=start,
                          assignment=assignment)
    assert pybubble.validate(problem, s) == []
    assert math.isfinite(step_time) and np.isfinite(start).all()


@given(st.integers(0, 10_000), st.data())
@SETTINGS
def test_problem(seed, data):
    arrays = random_problem(seed, lanes=1 + seed % 3).core.arrays()
    for _ in range(data.draw(st.integers(1, 2))):
        group = data.draw(st.sampled_from(sorted(arrays)))
        if isinstance(arrays[group], dict):
            key = data.draw(st.sampled_from(sorted(arrays[group])))
            arrays[group][key] = data.draw(any_value(like=arrays[group][key]))
        else:
            arrays[group] = data.draw(any_value(like=np.asarray(arrays[group])))
    core = attempt(lambda: _core.Problem(namespace(arrays)))
    if core is REFUSED:
        return
    problem = pybubble.Problem(core)
    for policy in ("greedy", "coarse"):
        check_schedule(problem, _core.Scheduler(core).run(policy))
    assert _core.first_fit_floor(core).shape == (core.num_tasks,)
    # What the core holds reads back as it was accepted, as float64 and int64.
    back = core.arrays()
    assert back["tasks"]["duration"].dtype == np.float64 and back["tasks"]["lane"].dtype == np.int64
    assert np.array_equal(back["tasks"]["duration"], np.asarray(arrays["tasks"]["duration"], np.float64))


@given(st.integers(0, 10_000), st.data())
@SETTINGS
def test_scheduler_run(seed, data):
    problem = random_problem(seed)
    a = problem.arrays()
    durations = data.draw(st.one_of(st.none(), any_value(like=a.tasks.duration)))
    policy = data.draw(st.one_of(st.sampled_from(["greedy", "coarse"]), SCALARS))
    scheduler = _core.Scheduler(problem.core)
    result = attempt(lambda: scheduler.run(policy, durations))
    if result is REFUSED:
        return
    if durations is not None:
        problem = problem.with_durations(np.asarray(durations, np.float64))
    check_schedule(problem, result)


@given(st.integers(0, 10_000), st.data())
@SETTINGS
def test_validate(seed, data):
    problem = random_problem(seed)
    s = pybubble.schedule_problem(problem)
    args = [problem.core, s.start, s.assignment, s.step_time, s.shift_front, s.shift_back]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, 5))
        args[i] = data.draw(any_value(like=args[i] if i in (1, 2) else None))
    violations = attempt(lambda: _core.validate(*args))
    if violations is REFUSED:
        return
    assert isinstance(violations, list) and all(isinstance(v, str) for v in violations)


def pipeline_spec(seed):
    name = ["gpipe", "1f1b", "interleaved_1f1b", "zb_h1"][seed % 4]
    p, v = 1 + seed % 3, 2 if name == "interleaved_1f1b" else 1
    m = p * (1 + seed % 2)
    offset, stage, kind, mb = schedules.flatten(schedules.build_table(name, p, m, v))
    return dict(ranks=p, chunks=v, microbatches=m, row_offset=offset, stage=stage, kind=kind, microbatch=mb,
                fwd=np.full(p * v, 2.0), bwd=np.full(p * v, 4.0), wgrad=np.full(p * v, 1.0), p2p=0.5, tp_count=2,
                tp_duration=0.1, dp_allgather=1.0, dp_reducescatter=2.0)


def check_windows(offset, start, end, ranks, step_time):
    assert len(offset) == ranks + 1 and (np.diff(offset) >= 0).all()
    assert (start < end).all() and (start >= 0).all() and (end <= step_time).all()
    for r in range(ranks):
        s, e = start[offset[r]:offset[r + 1]], end[offset[r]:offset[r + 1]]
        assert (e[:-1] < s[1:]).all()


@given(st.integers(0, 10_000), st.data())
@SETTINGS
def test_simulate_pipeline(seed, data):
    spec = pipeline_spec(seed)
    for _ in range(data.draw(st.integers(1, 2))):
        key = data.draw(st.sampled_from(sorted(spec)))
        old = spec[key]
        spec[key] = data.draw(any_value(like=old) if isinstance(old, np.ndarray) else SCALARS)
    if data.draw(st.integers(0, 20)) == 0:
        spec[data.draw(st.sampled_from(sorted(spec)))] = None
    out = attempt(lambda: _core.simulate_pipeline(**spec))
    if out is REFUSED:
        return
    assert math.isfinite(out["step_time"])
    assert (out["op_end"] >= out["op_start"]).all() and (out["bubble_end"] > out["bubble_start"]).all()
    assert (out["forward_needed"] <= out["grad_ready"]).all()
    ranks = len(out["compute_free_offset"]) - 1
    for key in ("compute_free", "link_free"):
        check_windows(out[f"{key}_offset"], out[f"{key}_start"], out[f"{key}_end"], ranks, out["step_time"])
    assert _core.simulate_pipeline_seconds(1, **spec) >= 0.0


@given(st.data())
@SETTINGS
def test_balance(data):
    n = data.draw(st.integers(0, 12))
    costs = np.random.default_rng(n).lognormal(size=(n, 2))
    costs = data.draw(st.one_of(st.just(costs), any_value(like=costs)))
    m = data.draw(st.one_of(st.integers(1, 13), SCALARS))
    a = attempt(lambda: _core.balance_microbatches(costs, m))
    if a is not REFUSED:
        assert a.shape == (len(costs),) and a.dtype == np.int64
        assert sorted(set(a.tolist())) == list(range(m))  # every microbatch non-empty
        assert _core.max_microbatch_cost(costs, a, m) >= _core.balance_lower_bound(costs, m) * (1 - 1e-12)
    assignment = data.draw(any_value(like=np.zeros(len(np.atleast_1d(costs)), np.int64)))
    cost = attempt(lambda: _core.max_microbatch_cost(costs, assignment, m))
    assert cost is REFUSED or (math.isfinite(cost) and cost >= 0.0)


FIELDS = ("stages", "lanes_per_stage", "microbatches", "encoder_layers", "kernels_per_layer", "llm_fwd", "llm_bwd",
          "tp_gaps_per_op", "tp_gap", "encoder_scale", "jitter", "seed")


@given(st.data())
@settings(max_examples=100, deadline=None)
def test_synthetic_problem(data):
    kwargs = {}
    for key in data.draw(st.lists(st.sampled_from(FIELDS + ("speed",)), max_size=3, unique=True)):
        kwargs[key] = data.draw(SCALARS)
    core = attempt(lambda: _core.synthetic_problem(**kwargs))
    if core is REFUSED:
        return
    problem = pybubble.Problem(core)
    check_schedule(problem, _core.Scheduler(core).run("greedy"))


@given(SCALARS)
@settings(max_examples=30, deadline=None)
def test_problem_arguments_of_the_wrong_kind(value):
    for call in (lambda: _core.Scheduler(value), lambda: _core.first_fit_floor(value),
                 lambda: _core.validate(value, [], [], 0.0, 0.0, 0.0), lambda: _core.Problem(value)):
        assert attempt(call) is REFUSED, f"accepted {value!r}"
