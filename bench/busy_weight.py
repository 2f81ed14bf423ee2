"""The weight of the link-busy windows in the shaped layout's second program (issue 41): each
Optimus setting planned with ``pybubble.planner.refill.BUSY_WEIGHT`` set to each weight, its step
and its distance to the bound printed, and the weight whose steps sum least. Weight 1 is the
planner without the second program (both programs are then the same).

    python bench/busy_weight.py [--weights 1,0.4,0.5,0.6,0.7,0.8] [--setting weak_a ...]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner import refill
from pybubble.planner.search import search

SETTINGS = ["weak_a", "weak_b", "weak_c", "weak_d", "dual_1", "dual_2", "dual_3", "a100_vit3b_gpt11b"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="1,0.4,0.5,0.6,0.7,0.8")
    parser.add_argument("--setting", nargs="*", default=SETTINGS)
    args = parser.parse_args()
    weights = [float(w) for w in args.weights.split(",")]
    print(f"command: python bench/busy_weight.py --weights {args.weights} --setting {' '.join(args.setting)}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, "
          f"shipped weight {refill.BUSY_WEIGHT}")
    print("per weight: each setting's step in ms (over its bound), then the sum of the steps\n")
    shipped, sums = refill.BUSY_WEIGHT, {}
    try:
        for w in weights:
            refill.BUSY_WEIGHT = w
            cells, total = [], 0.0
            for name in args.setting:
                found = search(LLMStep.of(load_config(os.path.join(ROOT, "examples", "optimus", f"{name}.yaml"))))
                total += found.best.step_time
                cells.append(f"{name} {found.best.step_time / 1e3:,.2f} ({100 * (found.best.step_time / found.bound.step_time - 1):+.2f}%)")
            sums[w] = total
            print(f"weight {w:g}: " + "; ".join(cells) + f"; sum {total / 1e3:,.2f}", flush=True)
    finally:
        refill.BUSY_WEIGHT = shipped
    print(f"\nleast sum: weight {min(sums, key=sums.get):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
