"""Dynamic workloads and replaying a static schedule on them."""

import numpy as np
import pytest

import pybubble
from pybubble.costs.roofline import CostModel
from pybubble.problem.generated import synthetic
from pybubble.data.workloads import WorkloadSpec, batches
from pybubble.planner.sample_costs import sample_costs


def test_batches_are_reproducible_and_vary():
    a = [b.encoder_tokens for b in batches(WorkloadSpec(), samples=32, steps=3, seed=5)]
    b = [b.encoder_tokens for b in batches(WorkloadSpec(), samples=32, steps=3, seed=5)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], a[1])
    assert all((x >= 16).all() for x in a)


def test_sample_costs_follow_the_cost_model():
    enc, llm = pybubble.presets.encoder("vit-l-14"), pybubble.presets.llm("llama-3-8b")
    batch = next(batches(WorkloadSpec(video_share=0.0), samples=16, steps=1, seed=0))
    c = sample_costs(batch, encoder=enc, llm=llm, costs=CostModel("h100"))
    assert c.shape == (16, 2) and (c > 0).all()
    # More encoder tokens never cost less.
    tokens = batch.encoder_tokens
    i, j = int(np.argmin(tokens)), int(np.argmax(tokens))
    assert c[j, 0] >= c[i, 0]
    frozen = sample_costs(batch, encoder=enc, llm=llm, costs=CostModel("h100"), frozen=True)
    assert (frozen[:, 0] < c[:, 0]).all() and np.array_equal(frozen[:, 1], c[:, 1])


@pytest.mark.parametrize("field,value", [("images_mean", 0.5), ("video_share", 1.5), ("tokens_per_image", 8),
                                         ("max_frames", 2)])
def test_bad_specs_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        WorkloadSpec(**{field: value})


def test_replay_of_the_plan_itself_is_its_step_time():
    problem = synthetic(stages=4, microbatches=8, encoder_layers=8, encoder_scale=2.0)
    for policy in ("greedy", "coarse"):
        sched = pybubble.schedule_problem(problem, policy)
        assert pybubble.replay(problem, sched) == pytest.approx(sched.step_time, rel=1e-12)


def test_replay_grows_with_the_work():
    problem = synthetic(stages=4, microbatches=8, encoder_layers=8, encoder_scale=2.0)
    sched = pybubble.schedule_problem(problem)
    d = problem.arrays().tasks.duration
    steps = [pybubble.replay(problem.with_durations(d * f), sched) for f in (0.5, 1.0, 1.5, 2.0)]
    assert steps == sorted(steps) and steps[0] < steps[-1]


def test_microbatch_loads_in_order_or_by_assignment():
    from pybubble.planner.sample_costs import microbatch_loads

    cost = np.arange(6, dtype=float)
    np.testing.assert_array_equal(microbatch_loads(cost, 3), [1.0, 5.0, 9.0])
    np.testing.assert_array_equal(microbatch_loads(cost, 2, np.array([1, 0, 1, 0, 1, 0])), [9.0, 6.0])
    with pytest.raises(ValueError, match="microbatches: 6 samples do not split into 4"):
        microbatch_loads(cost, 4)
    with pytest.raises(ValueError, match="assignment"):
        microbatch_loads(cost, 2, np.array([0, 1, 2, 0, 1, 0]))


@pytest.mark.parametrize("seed", [-1, 2**64, float("inf"), 1.5, "0"])
def test_a_seed_that_is_no_64_bit_integer_is_a_value_error(seed):
    with pytest.raises(ValueError, match="seed"):
        next(batches(WorkloadSpec(), samples=4, steps=1, seed=seed))


def test_orders_by_encoder_work():
    from pybubble.planner.sample_costs import work_orders

    loads = np.array([5.0, 1.0, 4.0, 2.0, 3.0])
    orders = work_orders(loads)
    assert all(sorted(o) == list(range(5)) for o in orders.values())
    assert loads[orders["light_ends"]].tolist() == [2.0, 4.0, 5.0, 3.0, 1.0]  # the lightest last, then first, inward
    assert loads[orders["heavy_ends"]].tolist() == [4.0, 2.0, 1.0, 3.0, 5.0]
    assert loads[orders["ascending"]].tolist() == sorted(loads)
    assert loads[orders["descending"]].tolist() == sorted(loads, reverse=True)
    assert all(o.tolist() == [] for o in work_orders(np.zeros(0)).values())
    with pytest.raises(ValueError, match="loads: shape"):
        work_orders(np.ones((2, 2)))
