"""Per-batch plan choice against the fixed plan on dynamic batches, on real configs.

For each config: the encoder plans ranked on the mean batch (pybubble.planner.dynamic.ranked_candidates),
then `--steps` batches from pybubble.workloads run through the four modes of pybubble.dynamic
(static replay, balanced + online, online with the fixed plan, per-batch choice among the K best
plans within the time budget). Prints each mode's mean and p95 step, the gain of the choice over
the fixed plan rescheduled online (mean step ratio, and the median of the per-batch ratios), and
what the choice cost.

Usage: python bench/plan_choice.py [--steps 200] [--seed 0] [--candidates 4] [--budget-ms 10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pybubble.cli.terminal import progress_bar
from pybubble.planner import dynamic
from pybubble.config.schema import load_config

BASE = {"cluster": {"gpus": 16, "gpu": "h100"}, "llm": {"preset": "llama-3-8b"},
        "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 2048}, "llm_plan": {"dp": 2, "pp": 4, "tp": 2}}
CONFIGS = {
    "llama-3-8b + vit-l-14, 1 image, pp 4 tp 2": {**BASE, "encoders": [{"preset": "vit-l-14"}]},
    "llama-3-8b + vit-g-14, 4 images, pp 4 tp 2": {**BASE, "encoders": [{"preset": "vit-g-14",
                                                                          "tokens_per_sample": 4 * 257}]},
    "llama-3-8b + vit-g-14, 4 images, pp 4 tp 4 (32 GPUs)": {
        **BASE, "cluster": {"gpus": 32, "gpu": "h100"}, "llm_plan": {"dp": 2, "pp": 4, "tp": 4},
        "encoders": [{"preset": "vit-g-14", "tokens_per_sample": 4 * 257}]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--budget-ms", type=float, default=10.0)
    args = parser.parse_args()
    for name, doc in CONFIGS.items():
        config = load_config(doc)
        t0 = time.perf_counter()
        with progress_bar(f"{name}: batches", total=args.steps) as update:
            r = dynamic.run(config, steps=args.steps, seed=args.seed, k=args.candidates, budget=args.budget_ms / 1e3,
                            progress=lambda i: update(i + 1, args.steps))
        took = time.perf_counter() - t0
        plans = ", ".join(f"pp{p['pp_enc']}/tp{p['tp_enc']} {p['mean_step'] / 1e3:.2f} ms" for p in r.plans)
        print(f"{name}: {config.microbatches} microbatches, LLM-only step {r.horizon / 1e3:.2f} ms")
        print(f"  plans (encoder pp/tp, mean-batch step): {plans}")
        for mode, s in r.summary().items():
            print(f"  {mode:9s} mean {s['mean'] / 1e3:9.2f} ms   p95 {s['p95'] / 1e3:9.2f} ms   "
                  f"gain vs static {s['gain_vs_static']:.4f}x")
        fixed, chosen = r.step_time["online"], r.step_time["choice"]
        print(f"  choice vs fixed plan (online): mean {fixed.mean() / chosen.mean():.4f}x, "
              f"median per batch {np.median(fixed / chosen):.4f}x, max {np.max(fixed / chosen):.4f}x; "
              f"another plan chosen in {np.mean(r.chosen > 0):.0%} of batches")
        print(f"  cost: {r.evaluated.mean():.2f} plans evaluated per batch, choice median "
              f"{np.median(r.choice_took) * 1e3:.3f} ms, max {r.choice_took.max() * 1e3:.3f} ms "
              f"(budget {args.budget_ms:g} ms); one online reschedule median {np.median(r.reschedule) * 1e3:.3f} ms; "
              f"run {took:.1f} s")


if __name__ == "__main__":
    main()
