"""What the polish's budget buys (issue 41): the Optimus settings whose best plan is over 2% of its
bound, planned with the polish off and at several budgets (``pybubble.planner.polish.POLISH_TASKS``,
task placements), the gate on the problem's size lifted so that every setting polishes: each
budget's step, its distance to the bound, the moves kept, and the search's wall time over the search
without the polish (medians of `--repeats` runs, measured in one run). The search's justification
after the polish is off in every run (``search(justify=False)``): the polish's own effect.

    python bench/polish_budget.py [--budgets 500000,1000000,2000000,4000000] [--setting weak_a ...]
        [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner import polish
from pybubble.planner.search import search

SETTINGS = ["weak_a", "weak_b", "dual_2", "dual_3"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(step: LLMStep, repeats: int, **kw) -> tuple[float, object]:
    """The median wall time of `repeats` searches of `step` and the last search."""
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        found = search(step, **kw)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="500000,1000000,2000000,4000000")
    parser.add_argument("--setting", nargs="*", default=SETTINGS)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    print(f"command: python bench/polish_budget.py --budgets {args.budgets} --setting {' '.join(args.setting)} "
          f"--repeats {args.repeats}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, load "
          f"{os.getloadavg()[0]:.2f}, shipped budget {polish.POLISH_TASKS:,} (at least {polish.POLISH_MIN_MOVES} moves)")
    print("per setting: the search without the polish, then each budget: step in ms (over the bound), moves kept, "
          "problem size, wall over the search without it\n")
    shipped = polish.POLISH_TASKS, polish.POLISH_MIN_MOVES
    try:
        polish.POLISH_MIN_MOVES = 0
        for name in args.setting:
            step = LLMStep.of(load_config(os.path.join(ROOT, "examples", "optimus", f"{name}.yaml")))
            search(step)  # warm-up
            base, off = timed(step, args.repeats, polish=False, justify=False)
            bound = off.bound.step_time
            cells = [f"off {off.best.step_time / 1e3:,.2f} ({100 * (off.best.step_time / bound - 1):+.2f}%) {base:.3f} s"]
            for budget in budgets:
                polish.POLISH_TASKS = budget
                wall, found = timed(step, args.repeats, justify=False)
                best = found.best
                cells.append(f"{budget:,}: {best.step_time / 1e3:,.2f} ({100 * (best.step_time / bound - 1):+.2f}%) "
                             f"kept {best.moved}, +{wall - base:.3f} s ({wall / base:.2f}x)")
            print(f"{name} ({off.best.problem.num_tasks:,} tasks): " + "; ".join(cells), flush=True)
    finally:
        polish.POLISH_TASKS, polish.POLISH_MIN_MOVES = shipped
    return 0


if __name__ == "__main__":
    sys.exit(main())
