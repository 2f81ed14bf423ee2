"""Balancing one step over microbatches and data-parallel replicas: every image runs once, work moves
only away from its owner, the largest replica never gets heavier, microbatch orders are
permutations, packing respects the sequence length."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pybubble
from pybubble.data.mix import MixSpec, mix
from pybubble.data.samples import Samples
from pybubble.problem.generated import synthetic
from pybubble.schedule.online import ReplicaScheduler, data_parallel_step
from pybubble.schedule.balance import (EncoderCost, balance_replicas, balance_step, deadline_gaps, middle_room,
                                       order_by_bubbles)


@st.composite
def steps(draw):
    replicas = draw(st.integers(1, 6))
    microbatches = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    samples = MixSpec().draw(draw(st.integers(0, 60)), rng)
    owner = rng.integers(0, replicas, len(samples))
    cost = EncoderCost(a=draw(st.sampled_from([0.0, 0.01])), b=1.0, c=draw(st.sampled_from([0.0, 0.5])))
    tight = draw(st.booleans())
    return samples, owner, replicas, microbatches, cost, tight


@given(steps())
@settings(max_examples=150, deadline=None)
def test_a_balanced_step_keeps_every_invariant(case):
    samples, owner, r, m, cost, tight = case
    image_cost = cost(samples.tiles)
    tokens = samples.tokens(64)
    # a sequence twice the longest sample and twice a replica's mean microbatch: always packs
    limit = int(2 * max(tokens.max(initial=1), np.ceil(np.bincount(owner, tokens, r).max(initial=0) / m))) \
        if tight else None
    b = balance_step(image_cost, samples.image_sample, tokens, owner, replicas=r, microbatches=m,
                     sequence_length=limit)
    image_owner = owner[samples.image_sample]
    # every image runs exactly once, on its owner unless it was moved
    assert b.runs_on.shape == samples.tiles.shape and ((b.runs_on >= 0) & (b.runs_on < r)).all()
    moved = b.moves[:, 0]
    assert np.unique(moved).size == moved.size
    assert (b.moves[:, 1] == image_owner[moved]).all() and (b.moves[:, 2] != b.moves[:, 1]).all()
    assert (b.runs_on[moved] == b.moves[:, 2]).all()
    kept = np.ones(samples.tiles.size, bool)
    kept[moved] = False
    assert (b.runs_on[kept] == image_owner[kept]).all()
    # the same work, the largest replica never heavier
    assert b.encoder_after.sum() == pytest.approx(b.encoder_before.sum(), rel=1e-12, abs=1e-9)
    assert b.encoder_after.max(initial=0) <= b.encoder_before.max(initial=0) * (1 + 1e-12) + 1e-12
    assert b.imbalance_after <= b.imbalance_before + 1e-12
    # each replica's microbatch order is a permutation; an image's slot is its sample's on its owner
    assert b.order.shape == (r, m) and (np.sort(b.order, axis=1) == np.arange(m)).all()
    assert ((b.microbatch >= 0) & (b.microbatch < m)).all()
    position = np.argsort(b.order, axis=1)
    assert (b.slot == position[image_owner, b.microbatch[samples.image_sample]]).all()
    assert b.slot_load.sum() == pytest.approx(image_cost.sum(), rel=1e-12, abs=1e-9)
    if limit is not None:
        used = np.bincount(owner * m + b.microbatch, weights=tokens, minlength=r * m)
        assert used.max(initial=0) <= limit
    doc = json.loads(json.dumps(b.to_dict()))
    assert doc["format"] == "pybubble.step_balance/1" and doc["moves"] == b.moves.tolist()


@given(st.lists(st.floats(0, 100), min_size=0, max_size=200), st.integers(1, 8), st.integers(0, 2**31),
       st.booleans())
@settings(max_examples=200, deadline=None)
def test_moving_work_never_raises_the_largest_replica(costs, r, seed, slots):
    rng = np.random.default_rng(seed)
    cost = np.array(costs)
    owner = rng.integers(0, r, cost.size)
    slot = rng.integers(0, 4, cost.size) if slots else None
    moves = balance_replicas(cost, owner, r, slot)
    before = np.bincount(owner, weights=cost, minlength=r)
    runs_on = owner.copy()
    runs_on[moves[:, 0]] = moves[:, 2]
    after = np.bincount(runs_on, weights=cost, minlength=r)
    assert after.max(initial=0) <= before.max(initial=0) + 1e-9
    assert (cost[moves[:, 0]] > 0).all() and (moves[:, 1] == owner[moves[:, 0]]).all()
    assert np.unique(moves[:, 0]).size == len(moves) and (moves[:, 2] != moves[:, 1]).all()
    if slot is not None:  # nor the largest load of any slot
        for s in range(4):
            here = slot == s
            assert np.bincount(runs_on[here], weights=cost[here], minlength=r).max() \
                <= np.bincount(owner[here], weights=cost[here], minlength=r).max() + 1e-9


def test_the_optimus_step_is_balanced_to_within_two_percent():
    """48 replicas of 32 samples (examples/optimus/strong_3072.yaml), 16 microbatches."""
    r, n, m = 48, 32, 16
    samples = mix(r * n, seed=1)
    cost = EncoderCost(b=1.0, c=0.1)(samples.tiles)
    owner = np.repeat(np.arange(r), n)[samples.image_sample]
    b = balance_step(cost, samples.image_sample, samples.tokens(64), np.repeat(np.arange(r), n), replicas=r,
                     microbatches=m, sequence_length=4096)
    assert b.imbalance_before > 1.1
    assert b.imbalance_after < 1.02
    # no slot's worst replica gets heavier, and the slots' worst replicas get lighter in all
    before = np.bincount(owner * m + b.slot, weights=cost, minlength=r * m).reshape(r, m)
    assert (b.slot_load.max(axis=0) <= before.max(axis=0) + 1e-9).all()
    assert b.slot_load.max(axis=0).sum() < 0.95 * before.max(axis=0).sum()
    # fewer moves than images by far: most work stays where its sample is
    assert len(b.moves) < samples.tiles.size / 4
    # on the totals alone (no slots) the replicas come closer still, with fewer moves
    moves = balance_replicas(cost, owner, r)
    runs_on = owner.copy()
    runs_on[moves[:, 0]] = moves[:, 2]
    after = np.bincount(runs_on, weights=cost, minlength=r)
    assert after.max() / after.mean() < 1.01 and len(moves) < len(b.moves)


@pytest.mark.parametrize("data", ["mix", "file"])
def test_every_replica_is_replanned_validly_after_balancing(data):
    """The work before a step, as bench/step_balance.py times it on the Optimus setting: balance the
    step, then reschedule every replica's fill for the encoder seconds it runs per LLM slot, the
    replicas over two threads. Every schedule is valid, and the replicas that wait for the slowest
    at the gradient collective wait less after balancing."""
    r, n, m = 4, 8, 4
    problem = synthetic(stages=2, microbatches=m, encoder_layers=4, encoder_scale=2.0)
    rng = np.random.default_rng(5)
    source = MixSpec() if data == "mix" else Samples.of([[32], [], [13], [1, 1, 1], [5, 5]], [100, 300, 0, 50, 20])
    owner = np.repeat(np.arange(r), n)
    slowest = {"balanced": [], "own": []}
    with ReplicaScheduler(problem, threads=2) as each:
        for _ in range(4):
            s = source.draw(r * n, rng)
            cost = EncoderCost(b=1.0, c=0.5)(s.tiles)
            b = balance_step(cost, s.image_sample, s.tokens(64), owner, replicas=r, microbatches=m,
                             sequence_length=4096, bubble=deadline_gaps(problem))
            unit = cost.sum() / (r * m)  # the problem holds the step's mean microbatch
            own = np.bincount(owner[s.image_sample] * m + b.slot, weights=cost, minlength=r * m).reshape(r, m)
            for name, load in (("balanced", b.slot_load), ("own", own)):
                schedules = each.reschedule(load / unit)
                for k, sched in enumerate(schedules):
                    changed = problem.with_durations(each.durations(load[k] / unit))
                    assert pybubble.validate(changed, sched) == []
                slowest[name].append(data_parallel_step([x.step_time for x in schedules]))
    assert np.mean(slowest["balanced"]) < np.mean(slowest["own"])


def test_light_microbatches_go_first_and_last():
    load = np.array([[5.0, 1.0, 9.0, 3.0, 7.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    order = order_by_bubbles(load, middle_room(5))
    assert order.tolist() == [[3, 4, 2, 0, 1], [1, 3, 4, 2, 0]]
    for row, o in zip(load, order):
        assert np.array_equal(o, order_by_bubbles(row, middle_room(5)))
        assert {o[0], o[-1]} == set(np.argsort(row)[:2])
    assert middle_room(1).tolist() == [0.0]
    with pytest.raises(ValueError, match="bubble: shape"):
        order_by_bubbles(np.ones((2, 3)), np.ones((3, 3)))


def test_the_cost_model_is_fitted_with_non_negative_coefficients():
    tiles = np.arange(1, 33)
    exact = EncoderCost(a=0.002, b=0.05, c=0.3)
    fit = EncoderCost.fit(tiles, exact(tiles))
    assert (fit.a, fit.b, fit.c) == pytest.approx((0.002, 0.05, 0.3), rel=1e-9)
    # a line through the origin with noise: no negative intercept or curvature
    noisy = 0.1 * tiles + np.random.default_rng(0).normal(0, 0.02, tiles.size)
    fit = EncoderCost.fit(tiles, np.maximum(noisy, 0))
    assert min(fit.a, fit.b, fit.c) >= 0 and fit.b == pytest.approx(0.1, rel=0.05)
    with pytest.raises(ValueError, match="b: -1"):
        EncoderCost(b=-1.0)


@pytest.mark.parametrize("kwargs,message", [
    ({"owner": np.array([0, 2])}, r"owner: expected \(2,\) integers in \[0, 2\)"),
    ({"image_sample": np.array([0, 5])}, r"image_sample: expected \(2,\) integers in \[0, 2\)"),
    ({"image_cost": np.array([1.0, -1.0])}, r"image_cost\[1\]: -1.0"),
    ({"tokens": np.array([1.5, 2.0])}, "tokens: expected one integer >= 0 per sample"),
    ({"sequence_length": 10}, r"tokens\[1\]: a sample of 20 tokens does not fit in one sequence of 10"),
    ({"replicas": 0}, "replicas: 0"),
])
def test_bad_input_names_the_field(kwargs, message):
    args = {"image_cost": np.array([1.0, 2.0]), "image_sample": np.array([0, 1]), "tokens": np.array([5, 20]),
            "owner": np.array([0, 1]), "replicas": 2, "microbatches": 1, "sequence_length": None, **kwargs}
    with pytest.raises(ValueError, match=message):
        balance_step(args.pop("image_cost"), args.pop("image_sample"), args.pop("tokens"), args.pop("owner"), **args)


def test_the_cores_moves_refuse_bad_input_naming_the_field():
    from pybubble import _core

    cost, owner = np.array([1.0, 2.0, 3.0]), np.array([0, 1, 1])
    assert _core.balance_replicas(cost, owner, 2).shape[1] == 3
    for args, message in (((cost, owner[:2], 2), "image_owner: 2 entries for 3 images"),
                          ((cost, owner, 2, np.array([0, 1])), "image_slot: 2 entries for 3 images"),
                          ((cost, np.array([0, 1, 5]), 2), r"image_owner\[2\]: 5 is not in \[0, 2\)"),
                          ((cost, owner, 2, np.array([0, -1, 0])), r"image_slot\[1\]: -1 is negative"),
                          ((np.array([1.0, np.inf, 1.0]), owner, 2), r"image_cost\[1\]: inf is not a finite number"),
                          ((cost, owner, 2_000_000), r"replicas: 2000000, more than the limit"),
                          ((cost, owner.astype(float), 2), "image_owner: dtype float64 is not an integer type")):
        with pytest.raises(ValueError, match=message):
            _core.balance_replicas(*args)


def test_a_bubble_profile_orders_the_microbatches():
    problem = synthetic(stages=4, microbatches=8, encoder_layers=4, encoder_scale=1.0)
    gaps = deadline_gaps(problem)
    a = problem.arrays()
    assert gaps.shape == (8,) and (gaps >= 0).all()
    # the forward deadlines' gaps and the gradients' gaps add up to the first deadline plus the
    # time from the first gradient to the end of the step
    assert gaps.sum() == pytest.approx(a.forward_needed[-1] + problem.horizon - a.grad_ready[0])
    samples = mix(64, seed=3)
    cost = EncoderCost()(samples.tiles)
    owner = np.repeat([0, 1], 32)
    b = balance_step(cost, samples.image_sample, samples.tokens(64), owner, replicas=2, microbatches=8, bubble=gaps)
    load = np.bincount(owner * 8 + b.microbatch, weights=np.bincount(samples.image_sample, cost, 64),
                       minlength=16).reshape(2, 8)
    assert np.array_equal(b.order, order_by_bubbles(load, gaps))
    with pytest.raises(ValueError, match=r"bubble: shape \(3,\), expected \(8,\)"):
        balance_step(cost, samples.image_sample, samples.tokens(64), owner, replicas=2, microbatches=8,
                     bubble=np.ones(3))
