"""Core vs its floor and vs the pure-Python reference on the ViT-22B-sized problem, in one run.

Prints the median time of each (repeated runs, single thread), the core's ratio to the floor (a
one-pass first-fit loop in C++ over the same tasks and windows: the least work any scheduler
filling them does) and to the reference, and checks that core and reference return the same
schedule; then the same for the holes filler (policy ``holes``) against its reference
(``pybubble.testing.holes``) and against the greedy. With ``--settings``, instead: the greedy and
the holes filler on the candidates the search re-fills (its best :data:`REFILL` plans) on each
Optimus setting, medians of --repeat runs each.

    python bench/scheduler_speed.py [--repeat N]
    python bench/scheduler_speed.py --settings [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from pybubble import _core, validate
from pybubble.cli.terminal import progress_bar
from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner.search import REFILL, search
from pybubble.problem.generated import vit22b_sized
from pybubble.testing.holes import reference_holes
from pybubble.testing.reference import reference_schedule
from pybubble.schedule.scheduler import schedule_problem


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of the reference (the core runs 50x more)")
    parser.add_argument("--settings", action="store_true", help="the re-filled candidates of each Optimus setting")
    args = parser.parse_args()
    if args.settings:
        settings(args.repeat)
        return
    problem = vit22b_sized()
    arrays = problem.arrays()
    windows = arrays.compute_free.start.size + arrays.link_free.start.size
    core = _core.Scheduler(problem.core)
    fast = schedule_problem(problem)
    slow = reference_schedule(problem)
    assert np.array_equal(fast.start, slow.start) and validate(problem, fast) == []
    assert _core.first_fit_floor(problem.core).shape == (problem.num_tasks,)
    # Core and floor interleaved, so that both see the same machine.
    t_core, t_floor = [], []
    holes, holes_ref = schedule_problem(problem, "holes"), reference_holes(problem)
    assert np.array_equal(holes.start, holes_ref.start) and validate(problem, holes) == []
    with progress_bar("timing the core, its floor and the references", total=14) as update:  # between timings only
        for i in range(10):
            t_core.append(median_time(lambda: core.run("greedy"), 5 * args.repeat))
            t_floor.append(median_time(lambda: _core.first_fit_floor(problem.core), 5 * args.repeat))
            update(i + 1)
        t_core, t_floor = statistics.median(t_core), statistics.median(t_floor)
        t_api = median_time(lambda: schedule_problem(problem), 10 * args.repeat)
        update(11)
        t_ref = median_time(lambda: reference_schedule(problem), args.repeat)
        update(12)
        t_holes = median_time(lambda: core.run("holes"), 5 * args.repeat)
        update(13)
        t_holes_ref = median_time(lambda: reference_holes(problem), max(1, args.repeat // 2))
        update(14)
    print(f"problem: {problem.num_tasks} tasks, {windows} windows, {problem.num_lanes} lanes, "
          f"{problem.num_microbatches} microbatches")
    print(f"core (Scheduler.run, reused)   median {t_core * 1e3:8.3f} ms")
    print(f"floor (first-fit pass, C++)    median {t_floor * 1e3:8.3f} ms")
    print(f"core (schedule_problem)       median {t_api * 1e3:8.3f} ms")
    print(f"reference (pure Python)        median {t_ref * 1e3:8.3f} ms")
    print(f"core / floor: {t_core / t_floor:.2f}x")
    print(f"speed-up core vs reference: {t_ref / t_core:.0f}x (run), {t_ref / t_api:.0f}x (API call)")
    print(f"step: {fast.step_time / 1e3:.1f} ms greedy vs horizon {problem.horizon / 1e3:.1f} ms, "
          f"hidden {fast.hidden_fraction(problem):.1%}")
    print(f"holes (Scheduler.run, reused)  median {t_holes * 1e3:8.3f} ms: {t_holes / t_core:.1f}x the greedy, "
          f"{t_holes_ref / t_holes:.0f}x faster than its reference ({t_holes_ref * 1e3:.0f} ms)")
    print(f"step: {holes.step_time / 1e3:.1f} ms holes, hidden {holes.hidden_fraction(problem):.1%}")


def settings(repeat: int) -> None:
    """The greedy and the holes filler on the candidates each Optimus setting's search re-fills."""
    print(f"per Optimus setting, the search's best {REFILL} plans: greedy and holes (Scheduler.run reused, one "
          f"thread, median of {repeat})")
    for path in sorted(Path(__file__).resolve().parent.parent.glob("examples/optimus/*.yaml")):
        found = search(LLMStep.of(load_config(path)), refill=False, workers=1)
        for cand in found.top[:REFILL]:
            core = _core.Scheduler(cand.problem.core)
            greedy, holes = (median_time(lambda p=p: core.run(p), repeat) for p in ("greedy", "holes"))
            print(f"{path.stem:18s} {cand.plan.pp_enc}x{cand.plan.tp_enc:<2d} {cand.problem.num_tasks:8d} tasks  "
                  f"greedy {greedy * 1e3:6.1f} ms  holes {holes * 1e3:6.1f} ms  {holes / greedy:5.1f}x", flush=True)


if __name__ == "__main__":
    main()
