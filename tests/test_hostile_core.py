"""Hostile input to the C++ core (issue 17): every entry point checks what it is given and answers
a ValueError naming the field, never a crash, a hang or a wrapped value."""

from __future__ import annotations

import numpy as np
import pytest

import pybubble
from pybubble import _core, balance
from pybubble.problems import random_problem


def small_arrays():
    return pybubble.Problem.from_arrays(**random_problem(1, lanes=2).arrays()).arrays()


# -- the three segfaults found by hand ------------------------------------------------------------

def test_window_offsets_rising_then_falling_are_refused():
    a = small_arrays()
    count = len(a["compute_start"])
    a["compute_offset"] = np.array([0, count + 10**8, count], np.int64)
    # Checked against the window count before any window is read (the walk used to run past them).
    with pytest.raises(ValueError, match=r"compute_free\.offset\[1\]: %d is not in \[0, %d\]" % (count + 10**8, count)):
        pybubble.Problem.from_arrays(**a)


@pytest.mark.parametrize("costs, m", [(np.zeros((0, 2)), 1), (np.zeros((0, 2)), 0), (np.ones((3, 2)), 0),
                                      (np.ones((3, 2)), -4)])
def test_max_microbatch_cost_on_no_samples_or_a_bad_count(costs, m):
    with pytest.raises(ValueError, match=r"costs|num_microbatches"):
        balance.max_microbatch_cost(costs, np.zeros(len(costs), np.int64), m)


def test_scheduler_run_with_fewer_durations_than_tasks():
    p = random_problem(2)
    with pytest.raises(ValueError, match=r"durations: 1 values? for %d tasks" % p.num_tasks):
        _core.Scheduler(p.core).run("greedy", np.ones(1))
