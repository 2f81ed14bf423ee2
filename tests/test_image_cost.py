"""The per-image cost of native-resolution encoders: ``a*p^2 + b*p + c`` seconds for an image of
``p`` patches, fitted with coefficients >= 0 (exact non-negative least squares of three unknowns)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybubble.costs.image_cost import ImageCost

COEF = st.floats(min_value=0, max_value=1e-3, allow_nan=False, allow_infinity=False)


@settings(max_examples=100, deadline=None)
@given(COEF, COEF, COEF, st.lists(st.integers(min_value=4, max_value=16384), min_size=3, max_size=40, unique=True))
def test_noiseless_times_give_back_their_cost(a, b, c, patches):
    truth = ImageCost(a=a * 1e-6, b=b * 1e-3, c=c)
    fit = ImageCost.fit(patches, truth(patches))
    assert np.allclose(fit(patches), truth(patches), rtol=1e-7, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=1, max_value=5000), st.floats(min_value=0, max_value=10)),
                min_size=1, max_size=30), st.integers(min_value=0, max_value=2**31))
def test_the_fit_is_no_worse_than_any_other_non_negative_cost(samples, seed):
    patches = np.array([p for p, _ in samples], float)
    seconds = np.array([t for _, t in samples])
    fit = ImageCost.fit(patches, seconds)
    assert min(fit.a, fit.b, fit.c) >= 0
    best = float(np.sum((fit(patches) - seconds) ** 2))
    rng = np.random.default_rng(seed)
    scale = np.array([1 / patches.max() ** 2, 1 / patches.max(), 1.0]) * max(1e-9, seconds.max())
    for a, b, c in rng.random((200, 3)) * scale * 3:
        other = ImageCost(a=float(a), b=float(b), c=float(c))
        assert best <= float(np.sum((other(patches) - seconds) ** 2)) * (1 + 1e-9) + 1e-18


def test_attention_grows_faster_than_the_area():
    cost = ImageCost.fit([256, 1024, 4096, 16384], [0.01, 0.05, 0.3, 2.2])
    assert cost.a > 0 and cost(16384) / cost(4096) > 4


@pytest.mark.parametrize("patches,seconds,message", [
    ([], [], "not two 1-D arrays"), ([1, 2], [1.0], "not two 1-D arrays"),
    ([0, 2], [1.0, 2.0], "finite number > 0"), ([1, 2], [1.0, float("nan")], "finite number >= 0"),
    ([1, 2], [-1.0, 2.0], "finite number >= 0"),
])
def test_bad_measurements_are_refused(patches, seconds, message):
    with pytest.raises(ValueError, match=message):
        ImageCost.fit(patches, seconds)


def test_a_cost_with_a_negative_or_infinite_coefficient_is_refused():
    with pytest.raises(ValueError, match="a: -1 is not a finite number >= 0"):
        ImageCost(a=-1, b=0, c=0)
    with pytest.raises(ValueError, match="c: inf"):
        ImageCost(a=0, b=0, c=float("inf"))
