"""Where the time between pybubble's step and its lower bound goes, on small instances of the shapes
of the Optimus settings that stay above their bound (docs/reproduction.md): the same LLM schedule
(interleaved 1F1B, two microbatches per pipeline stage, TP 8 or TP 2 gaps), the same encoders cut
to a few layers, solved exactly.

For each instance: the planner's search (pybubble's plan and the optimus row), the lower bound, and
for every candidate small enough (pybubble's, the optimus row's and each encoder plan's best, at
most --max-tasks tasks) the greedy filler's step against the CP-SAT optimum of the same tasks
(``pybubble.testing.exact``, OR-Tools). Greedy above CP-SAT: the plan leaves time (the filler's
order); CP-SAT above the bound: no schedule of that layout reaches the bound.

    python bench/plan_gap.py [--budget 30] [--max-tasks 600] [--shape weak] [--plans]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pybubble
from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner.search import search
from pybubble.testing.exact import optimum

SHAPES = {
    "weak": "weak_a, weak_b (LLaMA-70B, PP 4 V 5, TP 8, 8 microbatches): PP 2 V 2, TP 8, 4 microbatches, ViT-22B",
    "gpt": "weak_c, weak_d (GPT-175B, PP 8 V 12, TP 8, 16 microbatches): PP 2 V 2, TP 8, 4 microbatches, ViT-22B",
    "dual": "dual_1-3 (two encoders): as gpt, ViT-22B + ViT-5B",
    "a100": "a100_vit3b_gpt11b (GPT-11B, PP 4 V 5, TP 2, 8 microbatches): PP 2 V 2, TP 2, 4 microbatches, ViT-3B",
}
"""The instances and the settings whose shape they have."""


def instance(shape: str) -> dict:
    """A small config of `shape` (see :data:`SHAPES`): 4 LLM layers, 2 encoder layers, 8 images of
    256 tokens per sample, full recomputation."""
    llm, tp, gpu = {"weak": ("llama-70b", 8, "h100"), "gpt": ("gpt-175b", 8, "h100"), "dual": ("gpt-175b", 8, "h100"),
                    "a100": ("gpt-11b", 2, "a100-80gb")}[shape]
    encoders = [{"preset": "vit-3b" if shape == "a100" else "vit-22b", "tokens_per_sample": 2048, "layers": 2}]
    if shape == "dual":
        encoders.append({"preset": "vit-5b", "tokens_per_sample": 2048, "layers": 2})
    return {"cluster": {"gpus": 2 * tp, "gpu": gpu, "gpus_per_node": 8}, "llm": {"preset": llm, "layers": 4},
            "encoders": encoders, "training": {"global_batch": 8, "micro_batch": 2, "seq_len": 2048, "recompute": "full"},
            "llm_plan": {"dp": 1, "pp": 2, "tp": tp, "vpp": 2, "schedule": "interleaved_1f1b"}, "memory_gb": 80}


def candidates(found, plans: bool) -> list[tuple[str, object]]:
    """pybubble's plan, the optimus row and (with `plans`) each plan's best, each once."""
    out, seen = [], set()
    for name, cand in [("pybubble", found.best), ("optimus", found.optimus)] + [
            (f"PP_enc {p.plan.pp_enc} TP_enc {p.plan.tp_enc}", p.best) for p in (found.plans if plans else [])]:
        if cand is not None and id(cand) not in seen:
            seen.add(id(cand))
            out.append((name, cand))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=30.0, help="CP-SAT's budget per candidate (deterministic units)")
    p.add_argument("--max-tasks", type=int, default=600, help="solve candidates with at most this many tasks")
    p.add_argument("--shape", choices=sorted(SHAPES), action="append", help="these shapes only (default: all)")
    p.add_argument("--plans", action="store_true", help="also each encoder plan's best layout")
    a = p.parse_args()
    for shape in a.shape or list(SHAPES):
        step = LLMStep.of(load_config(instance(shape)))
        found = search(step, warmup=False, optimus=True, workers=1)
        alone, bound = step.timeline.step_time, found.bound.step_time
        print(f"{shape}: {SHAPES[shape]}\n  LLM alone {alone / 1e3:.2f} ms, lower bound {bound / 1e3:.2f} ms "
              f"({bound / alone - 1:+.1%}); pybubble {found.best.step_time / 1e3:.2f} ms "
              f"({found.best.step_time / bound - 1:+.1%} over the bound), optimus row "
              f"{found.optimus.step_time / 1e3:.2f} ms", flush=True)
        for name, cand in candidates(found, a.plans):
            tasks = cand.problem.num_tasks
            layout = f"spread {cand.spread}" if any(cand.spread) else f"partition {cand.partition}"
            if tasks > a.max_tasks:
                print(f"  {name:<20} {layout:<20} {tasks:5d} tasks: greedy {cand.step_time / 1e3:8.2f} ms "
                      f"(too many tasks for CP-SAT here)", flush=True)
                continue
            t0 = time.monotonic()
            exact = optimum(cand.problem, scale=1.0, round_times=True, max_deterministic_time=a.budget, workers=2)
            print(f"  {name:<20} {layout:<20} {tasks:5d} tasks: greedy {cand.step_time / 1e3:8.2f} ms, CP-SAT "
                  f"{exact.step_time / 1e3:8.2f} ms ({'optimal' if exact.optimal else f'not proved, >= {exact.bound / 1e3:.2f}'})"
                  f", its plan's bound {cand.bound.step_time / 1e3:8.2f} ms; greedy {cand.step_time / exact.step_time - 1:+.1%}"
                  f" over CP-SAT, CP-SAT {exact.step_time / cand.bound.step_time - 1:+.1%} over the bound "
                  f"[{time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
