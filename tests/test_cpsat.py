"""Greedy against the exact optimum from OR-Tools CP-SAT on tiny integer problems."""

import numpy as np
import pytest

import pybubble
from pybubble.problem.generated import random_problem, synthetic

pytest.importorskip("ortools.sat.python.cp_model")
from pybubble.testing import exact  # noqa: E402


def optimum(problem: pybubble.Problem, scale: float = 1.0) -> float:
    """The shortest step any valid schedule reaches; every time times `scale` must be an integer."""
    # A bound in CP-SAT's deterministic time (its count of work, the same on every machine), not in
    # seconds: a wall-clock limit made the result depend on the machine's load. The hardest of these
    # instances takes about 11 units.
    best = exact.optimum(problem, scale=scale, max_deterministic_time=100.0)
    assert best.optimal
    # the model's own schedule is one the core's validator accepts, at the step it reports: the
    # start domains and the LLM's busy intervals state the windows, neither more nor less
    assert pybubble.validate(problem, best.schedule) == []
    assert best.schedule.step_time == best.step_time
    return best.step_time


def tiny_pipeline(seed: int) -> pybubble.Problem:
    """A tiny generated 1F1B problem whose times are multiples of 0.1 us."""
    rng = np.random.default_rng(seed)
    return synthetic(stages=2, lanes_per_stage=1, microbatches=int(rng.integers(2, 5)), encoder_layers=2,
                     kernels_per_layer=int(rng.integers(2, 5)), llm_fwd=40.0, llm_bwd=80.0,
                     tp_gaps_per_op=1, tp_gap=6.0, encoder_scale=float(rng.choice([0.1, 0.2, 0.3])),
                     jitter=0.0, seed=seed)


def gaps(problems, scale):
    out = []
    for problem in problems:
        sched = pybubble.schedule_problem(problem)
        assert pybubble.validate(problem, sched) == []
        best = optimum(problem, scale)
        assert sched.step_time >= best - 1e-6, "the heuristic cannot beat the optimum"
        out.append((sched.step_time - best) / best)
    return np.array(out)


def test_greedy_mean_gap_on_tiny_pipelines_is_at_most_5_percent():
    g = gaps([tiny_pipeline(seed) for seed in range(16)], scale=10.0)
    print(f"tiny pipelines: mean gap {g.mean():.3%}, max {g.max():.3%} over {len(g)} problems")
    assert g.mean() <= 0.05


def test_greedy_gap_on_random_problems_stays_bounded():
    # Random lanes, windows and deadlines: harder than any pipeline; the figure is recorded in
    # bench/README.md, the bound guards against regressions.
    g = gaps([random_problem(seed, lanes=2, microbatches=3, max_fwd=3, max_bwd=2) for seed in range(40)],
             scale=1.0)
    print(f"random problems: mean gap {g.mean():.3%}, max {g.max():.3%} over {len(g)} problems")
    assert g.mean() <= 0.09


def test_a_given_assignment_is_never_shorter_than_a_free_one_and_the_greedy_never_beats_it():
    for seed in range(4):
        problem = tiny_pipeline(seed)
        free = exact.optimum(problem, scale=10.0)
        m = problem.num_microbatches
        given = exact.optimum(problem, scale=10.0, assignment=list(range(m))[::-1])
        assert free.optimal and given.optimal and given.bound == given.step_time
        assert given.schedule.assignment.tolist() == list(range(m))[::-1]
        assert sorted(free.schedule.assignment.tolist()) == list(range(m))
        assert pybubble.validate(problem, given.schedule) == [] and pybubble.validate(problem, free.schedule) == []
        assert given.step_time >= free.step_time - 1e-6
        sched = pybubble.schedule_problem(problem, fixed_assignment=True)
        assert sched.step_time >= exact.optimum(problem, scale=10.0, assignment=list(range(m))).step_time - 1e-6


def test_times_off_the_grid_are_refused_unless_rounded_and_bad_arguments_named():
    problem = tiny_pipeline(0)
    with pytest.raises(ValueError, match="not whole numbers"):
        exact.optimum(problem, scale=1.0)
    rounded = exact.optimum(problem, scale=1.0, round_times=True)
    on_grid = exact.optimum(problem, scale=10.0)
    # rounding moves each of the tasks' times by at most half a unit (1 us here)
    assert abs(rounded.step_time - on_grid.step_time) <= 0.5 * (problem.num_tasks + 2)
    with pytest.raises(ValueError, match="assignment"):
        exact.optimum(problem, scale=10.0, assignment=[0] * problem.num_microbatches)
    with pytest.raises(ValueError, match="scale"):
        exact.optimum(problem, scale=0.0)


def test_within_says_yes_at_the_optimum_and_proves_no_just_below_it():
    for seed in range(3):
        problem = tiny_pipeline(seed)
        best = exact.optimum(problem, scale=10.0)
        assert best.optimal
        assert exact.within(problem, best.step_time, scale=10.0) is True
        # times are multiples of 0.1 us: a step 0.1 us shorter is the next one down, and none reaches it
        assert exact.within(problem, best.step_time - 0.1, scale=10.0) is False
        given = list(range(problem.num_microbatches))
        fixed = exact.optimum(problem, scale=10.0, assignment=given).step_time
        assert exact.within(problem, fixed - 0.1, scale=10.0, assignment=given) is False
    with pytest.raises(ValueError, match="limit"):
        exact.within(problem, float("nan"), scale=10.0)
