"""Online rescheduling with new durations, in the foreground and on a background thread."""

import numpy as np
import pytest

import pybubble
from pybubble.problems import synthetic


def test_reschedule_equals_a_fresh_schedule_of_the_changed_problem():
    problem = synthetic(stages=3, microbatches=6, encoder_layers=6, encoder_scale=2.0)
    rng = np.random.default_rng(0)
    with pybubble.OnlineScheduler(problem) as online:
        for _ in range(5):
            d = problem.arrays()["duration"] * rng.uniform(0.5, 1.5, problem.num_tasks)
            got = online.reschedule(d)
            changed = problem.with_durations(d)
            want = pybubble.schedule(changed)
            np.testing.assert_array_equal(got.start, want.start)
            assert pybubble.validate(changed, got) == []


def test_submit_runs_in_the_background_and_reports_errors():
    problem = synthetic(stages=2, microbatches=4, encoder_layers=2)
    d = problem.arrays()["duration"]
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
