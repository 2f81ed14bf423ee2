"""The pieces a runtime runs (pybubble/runtime/profile.py): the encoder's kernels merged into pieces
of at least a given time, the baselines' encoder unsplit, the automatic choice from the measured
cost of a task of its own; and bad values refused."""

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pybubble.runtime import MicrobatchRun, split_into_pieces  # noqa: E402
from pybubble.runtime import profile  # noqa: E402
from pybubble.runtime.profile import check_piece_s, piece_groups, profile_pieces  # noqa: E402


@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 5.0)), min_size=1, max_size=40),
       st.floats(0.0, 30.0))
@settings(max_examples=200, deadline=None)
def test_groups_cover_the_pieces_in_order_each_at_least_the_minimum(costs, min_s):
    fwd, bwd = [f for f, _ in costs], [b for _, b in costs]
    each = [f + b for f, b in costs]
    groups = piece_groups(fwd, bwd, min_s)
    assert sum(groups) == len(costs) and all(g >= 1 for g in groups)
    edges = [0]
    for g in groups:
        edges.append(edges[-1] + g)
    if len(groups) > 1:  # a shorter last group joined the one before
        assert all(sum(each[a:b]) >= min_s for a, b in zip(edges, edges[1:]))
    for a, b in zip(edges[:-1], edges[1:-1]):  # each group but the last closes as soon as it reaches min_s
        assert b - a == 1 or sum(each[a:b - 1]) < min_s


def test_groups_at_the_extremes():
    assert piece_groups([1.0] * 5, [1.0] * 5, 0.0) == [1] * 5
    assert piece_groups([1.0] * 5, [1.0] * 5, math.inf) == [5]
    assert piece_groups([1.0] * 5, [1.0] * 5, 3.0) == [2, 3]
    assert piece_groups([1.0] * 5, [1.0] * 5, 100.0) == [5]


def test_the_baselines_run_the_encoder_unsplit_and_bad_values_are_refused():
    assert check_piece_s(None, "megatron") == check_piece_s(0.0, "coarse") == math.inf
    assert check_piece_s(None, "pybubble") is None
    assert check_piece_s(0, "pybubble") == 0.0 and check_piece_s(0.004, "pybubble") == 0.004
    for bad in (-1e-3, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="piece_s: .* is not a number of seconds >= 0"):
            check_piece_s(bad, "pybubble")


def unsplit_and_pieces(encoder, pieces, x):
    ref = encoder(x)
    run = MicrobatchRun(pieces, (x,))
    for i in range(len(pieces)):
        run.forward_piece(i)
    return ref, run.output()


def test_the_profile_merges_the_kernels_as_asked(world_of_one, trainer_module):
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(12, 16), trainer_module.ViTBlock(16, 4), trainer_module.ViTBlock(16, 2))
    x = torch.randn(3, 7, 12)
    kernels = split_into_pieces(encoder, x)
    n = len(kernels)
    clock = iter(range(10**6))
    ticks = lambda: float(next(clock))  # noqa: E731: every timed call takes one second

    def run_profile(piece_s):
        return profile_pieces(kernels, (x,), ticks, world_of_one, 1, 0.0, piece_s)

    pieces, costs = run_profile(math.inf)
    assert len(pieces) == 1 and costs.piece_fwd_s == [1.0] and costs.piece_bwd_s == [1.0]
    pieces, costs = run_profile(0.0)
    assert pieces == kernels and costs.piece_fwd_s == [1.0] * n
    pieces, costs = run_profile(4.0)  # 2 s a kernel: two a piece, the odd one with the last
    assert [p.name for p in pieces][0] == f"{kernels[0].name}..{kernels[1].name}"
    assert len(pieces) == n // 2 and costs.piece_fwd_s[:-1] == [2.0] * (n // 2 - 1)
    assert sum(costs.piece_fwd_s) == sum(costs.piece_bwd_s) == n
    # automatic, with a real clock: some pieces, the costs theirs, the outputs the unsplit encoder's
    pieces, costs = profile_pieces(kernels, (x,), time.perf_counter, world_of_one, 1, 0.0, None)
    assert 1 <= len(pieces) <= n and len(costs.piece_fwd_s) == len(costs.piece_bwd_s) == len(pieces)
    torch.testing.assert_close(*unsplit_and_pieces(encoder, pieces, x))


def test_the_automatic_size_is_a_tasks_own_cost_over_its_share(world_of_one, trainer_module, monkeypatch):
    encoder = nn.Sequential(nn.Linear(12, 16), trainer_module.ViTBlock(16, 4), trainer_module.ViTBlock(16, 2))
    x = torch.randn(3, 7, 12)
    kernels = split_into_pieces(encoder, x)
    n = len(kernels)
    clock = iter(range(10**6))
    ticks = lambda: float(next(clock))  # noqa: E731: every timed piece takes one second each way
    for own, size in ((0.07, 2), (0.0, 1), (1.0, n)):  # 3.5 s: two kernels of 2 s; 0: kernels; 50 s: all
        # a pass of the kernels costs what the unsplit encoder's does and `own` per task more
        monkeypatch.setattr(profile, "pass_s", lambda pieces, example, now, o=own: 2.0 * n + o * (len(pieces) - 1))
        pieces, costs = profile_pieces(kernels, (x,), ticks, world_of_one, 1, 0.0, None)
        assert len(pieces) == n // size, (own, [p.name for p in pieces])
        assert sum(costs.piece_fwd_s) == sum(costs.piece_bwd_s) == n
