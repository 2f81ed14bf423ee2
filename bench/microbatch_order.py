"""Which order of a replica's microbatches gives the shortest step: the data loader's, sorted, light
first and last (`middle_room`), heavy first and last, or by the plan's deadline gaps
(`deadline_gaps`).

For a config, the best encoder plan (the planner's search); each step draws `global_batch / dp`
samples per replica from the mix (pybubble.data.mix.mix), splits them into microbatches
in the data loader's order, orders each replica's microbatches by `order_by_bubbles` against each
profile, and reschedules the plan online with those loads (a tile costs the encoders' time on one
image of the first encoder's tokens). Prints the mean step per order, replicas averaged. No moves
between replicas: the order alone.

Usage: python bench/microbatch_order.py CONFIG [--replicas 2] [--steps 10] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner.dynamic import ranked_candidates
from pybubble.data.mix import MixSpec
from pybubble.planner.sample_costs import encoder_time
from pybubble.schedule.balance import deadline_gaps, middle_room, order_by_bubbles
from pybubble.schedule.online import ReplicaScheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = load_config(args.config)
    step = LLMStep.of(config)
    best = ranked_candidates(step, 1)[0]
    m, micro = config.microbatches, config.training.micro_batch
    n, r = m * micro, args.replicas
    tile = sum(encoder_time(e.model, e.model.tokens, step.costs, frozen=e.frozen, recompute=config.training.recompute)
               for e in config.encoders)
    rng = np.random.default_rng(args.seed)
    draws = [MixSpec().draw(r * n, rng) for _ in range(args.steps)]
    mean = float(np.mean([d.tiles.sum() * tile for d in draws])) / (r * m)
    s = np.arange(m, dtype=np.float64)
    profiles = {"data loader": None, "light first": s, "heavy first": -s, "light first and last": middle_room(m),
                "heavy first and last": -middle_room(m), "deadline gaps": deadline_gaps(best.problem)}
    owner = np.repeat(np.arange(r), n)
    microbatch = (np.arange(r * n) % n) // micro
    steps: dict[str, list[float]] = {k: [] for k in profiles}
    with ReplicaScheduler(best.problem) as each:
        for d in draws:
            loads = np.bincount(owner[d.image_sample] * m + microbatch[d.image_sample], weights=d.tiles * tile,
                                minlength=r * m).reshape(r, m)
            for name, room in profiles.items():
                ordered = loads if room is None else np.take_along_axis(loads, order_by_bubbles(loads, room), axis=1)
                steps[name].append(float(np.mean(each.run(ordered / mean).step_time)))
    print(f"{args.config}: {args.steps} steps, {r} replicas, {m} microbatches, LLM alone {best.problem.horizon / 1e3:.1f} ms")
    for name, values in steps.items():
        print(f"{name:22s} mean step {np.mean(values) / 1e3:9.1f} ms")


if __name__ == "__main__":
    main()
