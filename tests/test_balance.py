"""Microbatch balancing: every microbatch non-empty, close to the lower bound, bad input rejected."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pybubble
from pybubble.schedule.balance import lower_bound, max_microbatch_cost, order_by_bubbles


@given(st.integers(0, 2**32 - 1), st.integers(1, 400), st.integers(1, 64), st.sampled_from(["uniform", "lognormal"]))
@settings(max_examples=200, deadline=None)
def test_assignment_is_complete_and_never_beats_the_bound(seed, n, m, dist):
    m = min(m, n)
    rng = np.random.default_rng(seed)
    costs = rng.uniform(0, 10, (n, 2)) if dist == "uniform" else rng.lognormal(0, 1, (n, 2))
    a = pybubble.balance_microbatches(costs, m)
    assert a.shape == (n,) and a.dtype == np.int64
    assert np.bincount(a, minlength=m).min() >= 1 and a.max() < m
    assert max_microbatch_cost(costs, a, m) >= lower_bound(costs, m) * (1 - 1e-12)


@given(st.integers(0, 2**32 - 1), st.sampled_from([(1024, 32), (4096, 64), (512, 16)]))
@settings(max_examples=20, deadline=None)
def test_within_2_percent_of_the_lower_bound_on_random_batches(seed, shape):
    n, m = shape
    rng = np.random.default_rng(seed)
    # Heavy-tailed encoder cost (images per sample vary), milder LLM cost (text length).
    costs = np.stack([rng.lognormal(0, 1, n), rng.lognormal(0, 0.5, n)], axis=1)
    a = pybubble.balance_microbatches(costs, m)
    assert max_microbatch_cost(costs, a, m) <= 1.02 * lower_bound(costs, m)


def test_zero_costs_still_fill_every_microbatch():
    a = pybubble.balance_microbatches(np.zeros((10, 2)), 10)
    assert sorted(a.tolist()) == list(range(10))


@pytest.mark.parametrize("costs,m,message", [
    (np.ones((4, 3)), 2, "costs: expected an N x 2 array"),
    (np.ones((4, 2)), 5, r"num_microbatches: 5 is not in \[1, 4\]"),
    (np.ones((4, 2)), 0, "num_microbatches: 0"),
    (np.array([[1.0, -1.0]]), 1, r"costs\[0, 1\]"),
    (np.array([[np.nan, 1.0]]), 1, r"costs\[0, 0\]"),
    (np.zeros((0, 2)), 1, "costs: no samples"),
])
def test_bad_input_names_the_field(costs, m, message):
    with pytest.raises(ValueError, match=message):
        pybubble.balance_microbatches(costs, m)


def test_order_by_bubbles_puts_the_heaviest_where_the_room_is():
    order = order_by_bubbles(np.array([5.0, 1.0, 9.0, 3.0]), np.array([10.0, 40.0, 20.0, 0.0]))
    assert order.tolist() == [3, 2, 0, 1]  # slot 1 (40) gets microbatch 2 (9), slot 2 (20) gets 0 (5), ...
    with pytest.raises(ValueError, match="bubble: shape"):
        order_by_bubbles(np.ones(3), np.ones(2))
