"""Static schedule replayed vs online rescheduling on a stream of dynamic batches, in one run.

A generated 1F1B problem (4 stages x 2 lanes, 16 microbatches) carries the encoder's kernels; each
step draws a batch from pybubble.workloads (ViT-L/14 encoder, Llama-3-8B LLM, H100 cost model) and
scales the kernels of encoder microbatch j by that microbatch's encoder cost over the mean one.
Modes: `static` (one schedule planned on the mean batch, replayed), `online` (rescheduled every
step), `balanced` (samples balanced over microbatches, then rescheduled). The LLM's own timeline
is held fixed: only the encoder's work varies here.

Usage: python bench/dynamic_online.py [--steps 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import pybubble
from pybubble.cli.terminal import progress_bar
from pybubble.costs.roofline import CostModel
from pybubble.problem.generated import synthetic
from pybubble.data.workloads import WorkloadSpec, batches
from pybubble.planner.sample_costs import microbatch_loads, sample_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    microbatches, micro_batch = 16, 4
    problem = synthetic(stages=4, lanes_per_stage=2, microbatches=microbatches, encoder_layers=8,
                        encoder_scale=1.5, seed=args.seed)
    enc, llm = pybubble.presets.encoder("vit-l-14"), pybubble.presets.llm("llama-3-8b")
    cm = CostModel("h100")
    costs = [sample_costs(b, encoder=enc, llm=llm, costs=cm)
             for b in batches(WorkloadSpec(), samples=microbatches * micro_batch, steps=args.steps, seed=args.seed)]
    mean_mb = float(np.mean([c[:, 0].sum() for c in costs])) / microbatches
    static = pybubble.schedule_problem(problem)  # the mean batch: every factor 1
    online = pybubble.OnlineScheduler(problem)
    steps: dict[str, list[float]] = {"static (replayed)": [], "online": [], "balanced + online": []}
    took: list[float] = []
    with progress_bar("batches", total=len(costs)) as update:
        for i, c in enumerate(costs):
            plain = microbatch_loads(c[:, 0], microbatches) / mean_mb
            balanced = microbatch_loads(c[:, 0], microbatches, pybubble.balance_microbatches(c, microbatches)) / mean_mb
            d_plain, d_bal = online.scaled_durations(plain), online.scaled_durations(balanced)
            steps["static (replayed)"].append(pybubble.replay(problem.with_durations(d_plain), static))
            t0 = time.perf_counter()
            steps["online"].append(online.reschedule(d_plain).step_time)
            took.append(time.perf_counter() - t0)
            steps["balanced + online"].append(online.reschedule(d_bal).step_time)
            update(i + 1, len(costs))
    print(f"{args.steps} steps, {problem.num_tasks} tasks, LLM-only step {problem.horizon / 1e3:.1f} ms")
    for name, values in steps.items():
        print(f"{name:20s} mean step {statistics.fmean(values) / 1e3:9.2f} ms   "
              f"p95 {np.percentile(values, 95) / 1e3:9.2f} ms")
    print(f"reschedule median {statistics.median(took) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
