"""How fast the planner is, and how close its local search comes to enumerating every partition.

Speed: `pybubble.plan` on a config, median and range of --repeats runs, split into the search, the
baselines (each on its own LLM plan) and the non-colocated layout; 1 thread against 2. Quality: for each encoder plan with at most
--max-pipelines pipelines, the local search's best partition against the best of all partitions
(every composition scheduled), both from the same search code.

Usage: python bench/planner_speed.py [--config examples/optimus/strong_3072.yaml] [--repeats 5]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import pybubble
from pybubble.cli.terminal import progress_bar
from pybubble.llm.step import LLMStep
from pybubble.planner import layouts, partitions
from pybubble.planner import search as planner
from pybubble.planner.space import PlanSpace
from scheduler_speed import median_time  # bench/ is the script's folder

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "examples" / "optimus" / "strong_3072.yaml"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-pipelines", type=int, default=4)
    args = parser.parse_args()
    cfg = pybubble.load_config(args.config)
    pybubble.plan(cfg)  # warm caches (imports, first allocations)
    step = LLMStep.of(cfg)
    runs: list[float] = []

    def whole_plan() -> None:
        t0 = time.perf_counter()
        pybubble.plan(cfg)
        runs.append(time.perf_counter() - t0)

    parts = {"whole": whole_plan, "llm": lambda: LLMStep.of(cfg),
             "one": lambda: planner.search(step, workers=1), "two": lambda: planner.search(step, workers=2),
             "base": lambda: (layouts.megatron(step.with_plan(cfg.baseline_plan("megatron"))),
                              layouts.megatron_balanced(step.with_plan(cfg.baseline_plan("megatron_balanced")))),
             "sep": lambda: layouts.separate(step)}
    medians = {}
    with progress_bar("timing the planner's parts", total=len(parts)) as update:  # redrawn between timings only
        for done, (name, fn) in enumerate(parts.items()):
            medians[name] = median_time(fn, args.repeats)
            update(done + 1)
    _, llm, one, two, base, sep = medians.values()
    whole = statistics.median(runs)
    found = planner.search(step)
    print(f"{Path(args.config).name}: {cfg.cluster.gpus} GPUs, {cfg.microbatches} microbatches, "
          f"{found.stats.plans} encoder plans, {found.stats.scheduled} partitions scheduled")
    print(f"plan (all)          median {whole:.3f} s (range {min(runs):.3f}-{max(runs):.3f} s, {len(runs)} runs)")
    print(f"  LLM step          median {llm:.3f} s")
    print(f"  search, 1 thread  median {one:.3f} s")
    print(f"  search, 2 threads median {two:.3f} s   (1 thread / 2 threads = {one / two:.2f}x)")
    print(f"  baselines         median {base:.3f} s")
    print(f"  non-colocated     median {sep:.3f} s")

    # Local search against every partition, plan by plan (the same scheduling code).
    tl = step.timeline
    m = cfg.microbatches
    print(f"\nlocal search vs all partitions (plans with <= {args.max_pipelines} pipelines):")
    for plan in planner.encoder_plans(cfg):  # one line printed per plan
        if plan.pipelines > args.max_pipelines or plan.pipelines == 1:
            continue
        lps = plan.lanes_per_stage
        space = PlanSpace(step, plan, step.encoder_windows(lps))
        t0 = time.perf_counter()
        every = min(space.candidate(p).step_time for p in planner.compositions(m, plan.pipelines)
                    if space.memory(p) <= space.memory_limit)
        t_all = time.perf_counter() - t0
        saved = partitions.EXHAUSTIVE
        partitions.EXHAUSTIVE = 0
        try:
            stats = partitions.SearchStats()
            t0 = time.perf_counter()
            local = partitions.best_layout(space, m, lambda: (math.inf, 0), stats, __import__("threading").Lock())
            t_local = time.perf_counter() - t0
        finally:
            partitions.EXHAUSTIVE = saved
        assert local is not None
        print(f"  PP_enc {plan.pp_enc} TP_enc {plan.tp_enc} ({plan.pipelines} pipelines, "
              f"{math.comb(m + plan.pipelines - 1, plan.pipelines - 1)} partitions): local "
              f"{local.step_time / 1e3:,.2f} ms in {stats.scheduled} schedules ({t_local:.2f} s), all "
              f"{every / 1e3:,.2f} ms ({t_all:.2f} s); gap {local.step_time / every - 1:.3%}")


if __name__ == "__main__":
    main()
