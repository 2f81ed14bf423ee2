"""Balancing one step of the Optimus 3,072-GPU setting over microbatches and replicas: time per step.

examples/optimus/strong_3072.yaml: dp 48, 16 microbatches of 2 samples per replica (global batch
1536), sequences of 2 x 2048 tokens packed per microbatch. Every step draws a new batch from the
mix (pybubble.planner.workloads.mix: text-only, single images of 1..13 tiles, multi-image, video),
prices each image with an EncoderCost fitted to the cost model's ViT-22B (one image of t tiles as
one sequence of t x 256 encoder tokens, forward plus backward), and times
pybubble.schedule.balance.balance_step (packing, light-first-and-last order, moves between
replicas) including the pricing. Prints the median and 90th percentile over the steps of the wall
time and of the thread's CPU time (which other processes on a loaded machine do not inflate), the
replicas' imbalance before and after, the moves, and the load average; asserts every step's
invariants.

Usage: python bench/step_balance.py [--steps 200] [--seed 0] [--tokens-per-tile 64] [--cpus 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from pybubble.config.schema import load_config
from pybubble.costs.roofline import CostModel
from pybubble.planner.workloads import MixSpec, encoder_time
from pybubble.schedule.balance import EncoderCost, balance_step

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "optimus" / "strong_3072.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens-per-tile", type=int, default=64,
                        help="LLM tokens per tile (64: a 32-frame video and its text fit one 4096-token sequence)")
    parser.add_argument("--cpus", type=int, default=2, help="run on this many CPUs (0: all)")
    args = parser.parse_args()
    if args.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cpus])
    config = load_config(CONFIG)
    r, m = config.llm_plan.dp, config.microbatches
    n = m * config.training.micro_batch
    sequence = config.training.micro_batch * config.training.seq_len
    enc = config.encoders[0].model
    tiles = np.arange(1, 33)
    seconds = [encoder_time(enc, int(t) * enc.tokens, CostModel("h100"), recompute=config.training.recompute) / 1e6
               for t in tiles]
    cost = EncoderCost.fit(tiles, np.array(seconds))
    owner = np.repeat(np.arange(r), n)
    rng = np.random.default_rng(args.seed)
    spec = MixSpec()
    took, cpu, before, after, moves, images = [], [], [], [], [], []
    load = os.getloadavg()
    for _ in range(args.steps):
        s = spec.draw(r * n, rng)
        sample, tokens = s.image_sample, s.tokens(args.tokens_per_tile)
        t0, c0 = time.perf_counter(), time.thread_time()
        b = balance_step(cost(s.tiles), sample, tokens, owner, replicas=r, microbatches=m, sequence_length=sequence)
        took.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        assert b.runs_on.size == s.tiles.size and np.unique(b.moves[:, 0]).size == len(b.moves)
        assert (b.moves[:, 1] == owner[sample][b.moves[:, 0]]).all()
        assert b.encoder_after.max() <= b.encoder_before.max() * (1 + 1e-12)
        assert (np.sort(b.order, axis=1) == np.arange(m)).all()
        assert np.bincount(owner * m + b.microbatch, weights=tokens, minlength=r * m).max() <= sequence
        before.append(b.imbalance_before)
        after.append(b.imbalance_after)
        moves.append(len(b.moves))
        images.append(s.tiles.size)
    took_ms, cpu_ms = np.array(took) * 1e3, np.array(cpu) * 1e3
    print(f"{CONFIG.name}: dp {r}, {m} microbatches, {n} samples per replica, sequences of {sequence} tokens, "
          f"{args.tokens_per_tile} tokens per tile")
    print(f"encoder cost per image (ViT-22B, fitted): {cost.a * 1e3:.4f} ms x tiles^2 + {cost.b * 1e3:.3f} ms x tiles "
          f"+ {cost.c * 1e3:.3f} ms")
    print(f"{args.steps} steps, {statistics.median(images):.0f} images per step (median)")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"balance_step wall: median {statistics.median(took_ms):.3f} ms, p90 {np.percentile(took_ms, 90):.3f} ms, "
          f"min {took_ms.min():.3f} ms on {cpus} CPUs")
    print(f"balance_step CPU:  median {statistics.median(cpu_ms):.3f} ms, p90 {np.percentile(cpu_ms, 90):.3f} ms, "
          f"min {cpu_ms.min():.3f} ms")
    print(f"replicas' imbalance (max / mean encoder s): median {statistics.median(before):.3f} before, "
          f"{statistics.median(after):.4f} after; moves per step median {statistics.median(moves):.0f}")
    print(f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
