"""What justification buys and costs on the Optimus settings (issue 41): each setting's best plan
(``pybubble plan``'s), its schedule before and after :func:`pybubble.schedule.scheduler.justified`
(the search justifies it only where it is more than 2% over the bound: "search" says whether it
did), each over the search's bound, and the time of one justification over that of the holes
filler's five orders on the same problem (medians of `--repeats` runs each, measured in one run).

    python bench/justify.py [--setting dual_2 ...] [--repeats 5]
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
from pybubble.planner.search import search
from pybubble.schedule.scheduler import justified, schedule_problem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = ["strong_1536", "strong_2048", "strong_3072", "weak_a", "weak_b", "weak_c", "weak_d", "dual_1", "dual_2",
            "dual_3", "a100_vit3b_gpt11b"]


def median_time(f, repeats: int) -> tuple[float, object]:
    """The median wall time of `repeats` calls of f() (s) and the last result."""
    walls, got = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        got = f()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", nargs="*", default=SETTINGS)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"command: python bench/justify.py --setting {' '.join(args.setting)} --repeats {args.repeats}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, "
          f"load {os.getloadavg()[0]:.2f}")
    print("per setting: the best plan's step before -> after justification in ms (over the search's bound), whether "
          "the search justified it, and one justification's time over the holes filler's on its problem\n")
    for name in args.setting:
        step = LLMStep.of(load_config(os.path.join(ROOT, "examples", "optimus", f"{name}.yaml")))
        found = search(step)
        best, bound = found.best, found.bound.step_time
        problem = best.problem
        holes_s, holes = median_time(lambda: schedule_problem(problem, "holes"), args.repeats)
        before = best.schedule if best.justified_from is None else holes
        just_s, after = median_time(lambda: justified(problem, before), args.repeats)
        was = best.justified_from if best.justified_from is not None else best.step_time
        print(f"{name} ({problem.num_tasks:,} tasks, {best.policy}): {was / 1e3:,.2f} -> {after.step_time / 1e3:,.2f} ms "
              f"({100 * (was / bound - 1):+.2f}% -> {100 * (after.step_time / bound - 1):+.2f}%), search "
              f"{'justified' if best.justified_from is not None else 'left it'}; justify {1e3 * just_s:.1f} ms, holes "
              f"{1e3 * holes_s:.1f} ms ({just_s / holes_s:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
