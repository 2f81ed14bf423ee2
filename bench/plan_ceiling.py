"""How far any plan of pybubble's pipeline step could go on a launch's data: per settled step, the
plan the runtime made (the core's greedy schedule) against the exact optimum of the same problem
(OR-Tools CP-SAT: the same producers, any schedule of the tasks), against the best of every
producer assignment and every split of a chain over two ranks at a chunk boundary (the greedy
on each; a split chain's chunks before the split on one rank, the rest on another, both parts
feeding the same LLM microbatch), and coarse's plan of the same chunks. Then, by the median step,
what a coarse launch measured over each of them: the ceiling of the bench's "vs coarse" ratio
that a better plan or a split chain could reach, at the launch's measured costs.

    python bench/plan_ceiling.py [--data mix] [--data-file FILE] [--steps 8] [--ranks 2] [--dp 2] [--encoder qwen2_5_vl]
    python bench/plan_ceiling.py --reports runtime_modes.json   # every launch of a runtime_modes --out

With several data-parallel replicas (``--dp 2 --pp 1``) the question is the balance's: per settled
step, the chunks of the busiest replica (what the step waits for) against the fewest any move of
tiles between the replicas allows (every tile's replica free: the step's tiles over the replicas,
in chunks), and against the mean over the replicas (the fractional bound, at least the costliest
image: one chunk, or the most chunks an image larger than a chunk spans), for
pybubble and for ``--balance off``. A native-resolution encoder's tile is a chunk of packed patches,
all of one cost: its replicas' encoder costs are whole chunks.

Without ``--reports`` it launches the test trainer once per mode (pybubble.testing.mllm, tp 1; its
first two steps profile and adapt and are left out): coarse and pybubble, and with ``--dp``
pybubble with ``--balance off``. Each step is planned again from the launch's last costs (the
medians of its last steps), so the plans are those of the costs the launch settled on. Times are
rounded to 1 us for CP-SAT (at most 0.5 us per task).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time

import numpy as np

import pybubble.testing.mllm as mllm  # noqa: E402  (the test trainer: pybubble's launcher of the runtime in its modes)

from pybubble.llm.tables import build_table  # noqa: E402
from pybubble.problem.problem import Problem  # noqa: E402
from pybubble.placement.step_placement import (  # noqa: E402
    US, MeasuredCosts, make_placement, piece_tasks, placement_step_s)
from pybubble.testing.exact import optimum  # noqa: E402
from pybubble.schedule.scheduler import schedule_problem  # noqa: E402

MAX_TRIES = 50_000
"""Producer and split choices tried per step at most (the search is exhaustive)."""


def split_runs(chunks: list[int], ranks: int, spans: list[list[int]] | None = None
               ) -> list[list[tuple[int, int, int]]]:
    """Per chain, its choices as runs ``(rank, chunks, part)``: whole on one rank, or its first
    ``a`` chunks on one rank and the rest on another (``a`` between two of its ``spans``: an
    image across several chunks stays on one rank)."""
    out = []
    for j, c in enumerate(chunks):
        if c == 0:
            out.append([()])
            continue
        cuts = np.cumsum(spans[j])[:-1].tolist() if spans else range(1, c)
        whole = [((r, c, 0),) for r in range(ranks)]
        split = [((r, a, 0), (q, c - a, 1)) for r in range(ranks) for q in range(ranks) if q != r for a in cuts]
        out.append(whole + split)
    return out


def run_spans(spans: list[int] | None, count: int, part: int) -> list[int]:
    """The spans of a chain's run: its first ``count`` chunks (``part`` 0) or its last (1), which
    :func:`split_runs` cuts between spans."""
    if spans is None:
        return [1] * count
    out, total = [], 0
    for g in spans if part == 0 else spans[::-1]:
        if total == count:
            break
        out.append(g)
        total += g
    return out if part == 0 else out[::-1]


def best_split_us(costs: MeasuredCosts, chunks: list[int], ranks: int, timeline,
                  spans: list[list[int]] | None = None) -> tuple[float, tuple, int]:
    """The greedy's shortest step (us) over every producer and split choice of ``chunks``'
    chains on ``timeline`` (``spans``: each chain's, kept whole), the choice (per chain its runs)
    and how many were tried."""
    choices = split_runs(chunks, ranks, spans)
    tries = int(np.prod([len(c) for c in choices]))
    if tries > MAX_TRIES:
        raise ValueError(f"chunks: {chunks} give {tries} producer and split choices, more than {MAX_TRIES}")
    best: tuple[float, tuple] = (float("inf"), ())
    for combo in itertools.product(*choices):
        runs = [(j, lane, count, part) for j, chain in enumerate(combo) for lane, count, part in chain]
        tasks = piece_tasks(costs, [lane for _, lane, _, _ in runs], [count for _, _, count, _ in runs],
                            [run_spans(spans[j] if spans else None, count, part) for j, _, count, part in runs])
        # piece_tasks numbers its runs as microbatches: each run's tasks feed its chain's
        tasks = dataclasses.replace(tasks, microbatch=np.asarray([j for j, _, _, _ in runs], np.int64)[tasks.microbatch])
        step = schedule_problem(Problem.on_timeline(timeline, tasks), "greedy", fixed_assignment=True).step_time
        if step < best[0]:
            best = (step, combo)
    return (*best, tries)


def step_figures(report: dict, step: int, budget: float) -> dict:
    """One settled step of a pybubble launch: measured, predicted, planned again, exact, best split
    and coarse's plan of the same chunks (seconds)."""
    costs = MeasuredCosts(**report["costs"])
    chunks = [int(c) for c in report["data"]["chunks"][0][step]]
    spans = (report["data"].get("spans") or [[None] * (step + 1)])[0][step]  # each chain's (None: one chunk each)
    pp, m = report["pp"], len(chunks)
    table = build_table(report["schedule"], pp, m, report["chunks"])
    plan = make_placement("pybubble", costs, m, table, chunks, spans)
    after = placement_step_s(plan, costs) - plan.schedule.step_time / US
    exact = optimum(plan.problem, scale=1.0, round_times=True, assignment=plan.assignment,
                    max_deterministic_time=budget)
    split_us, combo, tries = best_split_us(costs, chunks, pp, plan.timeline, spans)
    return {"step": step, "chunks": chunks, "measured_s": report["step_times_s"][step],
            "predicted_s": report["predicted_steps_s"][step], "greedy_s": plan.schedule.step_time / US + after,
            "exact_s": exact.step_time / US + after, "exact_optimal": exact.optimal,
            "split_s": split_us / US + after, "split": [list(map(list, chain)) for chain in combo], "tries": tries,
            "coarse_plan_s": placement_step_s(make_placement("coarse", costs, m, table, chunks, spans), costs)}


def balance_figures(report: dict, step: int) -> dict:
    """One settled step of a launch with several replicas: the busiest replica's chunks, the fewest
    any move of tiles between the replicas allows, and the lower bound (the mean over the replicas,
    at least the costliest image: one chunk, or the most chunks an image spans)."""
    data, replicas = report["data"], report["dp"]
    ranks = len(data["tiles"])  # every rank lists its replica's tiles per slot
    tiles = sum(sum(rank[step]) for rank in data["tiles"]) * replicas // ranks
    size = data["chunk_tiles"]
    spans = [rank[step] for rank in data.get("spans") or [] if rank and rank[step]]
    largest = max((g for chains in spans for chain in chains for g in chain), default=1)
    return {"step": step, "tiles": tiles, "busiest_chunks": max(sum(rank[step]) for rank in data["chunks"]),
            "fewest_chunks": max(-(-tiles // (replicas * size)), largest), "largest_image_chunks": largest,
            "mean_chunks": max(tiles / (replicas * size), largest), "measured_s": report["step_times_s"][step]}


def print_balance(reports: dict) -> list[dict]:
    """The balance's figures of every launch of pybubble and ``--balance off`` (see the module's notes)."""
    rows = []
    for name in ("pybubble", "unbalanced"):
        for i, r in enumerate(reports.get(name, [])):
            for s in r["settled_steps"]:
                rows.append({"variant": name, "launch": i + 1, **balance_figures(r, s)})
    for name in ("pybubble", "unbalanced"):
        mine = [x for x in rows if x["variant"] == name]
        if mine:
            at = sum(x["busiest_chunks"] == x["fewest_chunks"] for x in mine)
            over = sum(x["busiest_chunks"] - x["fewest_chunks"] for x in mine)
            near = sum(x["busiest_chunks"] <= 1.05 * x["mean_chunks"] for x in mine)
            worst = max(x["busiest_chunks"] / x["mean_chunks"] for x in mine)
            print(f"{name:<10} busiest replica at the fewest chunks in {at} of {len(mine)} steps, {over} chunk(s) "
                  f"over them in all; within 5% of the mean over the replicas (at least the chunks of the costliest "
                  f"image) in {near} of "
                  f"{len(mine)} (at most {worst:.3f}x it); median step "
                  f"{statistics.median(x['measured_s'] for x in mine) * 1e3:.1f} ms")
    return rows


def launch(a: argparse.Namespace, mode: str, balance: str = "on") -> dict:
    args = mllm.parse_args(["--ranks", str(a.ranks), "--steps", str(a.steps), "--mode", mode, "--data", a.data,
                            "--dp", str(a.dp), "--balance", balance, "--encoder", a.encoder]
                           + (["--data-file", a.data_file] if a.data_file else []))
    mllm.check_args(args)
    return mllm.launch_job(args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reports", help="a bench/runtime_modes.py --out file: its coarse and pybubble launches")
    p.add_argument("--ranks", type=int, default=2, help="ranks (tp 1)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas (of the --ranks)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--data", default="mix", help="mix (the trainer's --data)")
    p.add_argument("--data-file", help="replay these samples (JSON lines, the trainer's --data-file)")
    p.add_argument("--encoder", default="vit", help=f"the trainer's --encoder: {', '.join(mllm.ENCODER_KINDS)}")
    p.add_argument("--budget", type=float, default=200.0, help="CP-SAT's budget per step (deterministic units)")
    p.add_argument("--out", help="write the figures (JSON) here")
    a = p.parse_args(argv)
    try:
        if a.reports:
            with open(a.reports) as f:
                reports = json.load(f)["reports"]
        else:
            if a.steps < 3:
                raise ValueError(f"steps: {a.steps} is not >= 3 (a launch's first two steps profile and adapt)")
            reports = {mode: [launch(a, mode)] for mode in ("coarse", "pybubble")}
            if a.dp > 1:
                reports["unbalanced"] = [launch(a, "pybubble", "off")]
        dp = reports["pybubble"][0]["dp"]
        for r in reports["pybubble"]:
            if dp > 1 and (r["dp"] != dp or not r.get("data") or "chunk_tiles" not in r["data"]):
                raise ValueError(f"reports: dp {r['dp']}, data {'yes' if r.get('data') else 'none'}: the balance's "
                                 "figures need launches of one dp with varying data (and their chunk_tiles)")
            if dp == 1 and (r["tp"] != 1 or r["pp"] < 2 or not r.get("data") or r["schedule"] not in ("1f1b", "gpipe")):
                raise ValueError(f"reports: dp {r['dp']}, tp {r['tp']}, pp {r['pp']}, schedule {r['schedule']}: the "
                                 "ceiling is for one replica, tp 1, pp >= 2, varying data, 1f1b or gpipe")
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if dp > 1:
        rows = print_balance(reports)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"steps": rows}, f, indent=1)
        return 0
    t0 = time.monotonic()
    rows = []
    print(f"{'launch':>6} {'step':>4} {'chunks':<16} {'measured':>9} {'predicted':>9} {'greedy':>9} {'exact':>9} "
          f"{'split':>9} {'coarse plan':>11}  best split (per chain: rank, chunks)")
    for i, r in enumerate(reports["pybubble"]):
        for s in r["settled_steps"]:
            x = step_figures(r, s, a.budget)
            rows.append(x)
            print(f"{i + 1:>6} {s:>4} {str(x['chunks']):<16} "
                  + " ".join(f"{x[k] * 1e3:>6.1f} ms" for k in ("measured_s", "predicted_s", "greedy_s", "exact_s",
                                                                "split_s"))
                  + f" {x['coarse_plan_s'] * 1e3:>8.1f} ms  "
                  + " ".join("+".join(f"{lane}:{c}" for lane, c, _ in chain) or "-" for chain in x["split"])
                  + ("" if x["exact_optimal"] else "  (CP-SAT: not proved optimal)"), flush=True)
    med = {k: statistics.median(x[k] for x in rows) for k in ("measured_s", "predicted_s", "greedy_s", "exact_s",
                                                              "split_s", "coarse_plan_s")}
    coarse = statistics.median(t for r in reports["coarse"] for t in (r["step_times_s"][s] for s in r["settled_steps"]))
    print(f"{len(rows)} settled steps of {len(reports['pybubble'])} pybubble launch(es) in "
          f"{time.monotonic() - t0:.1f} s (load {os.getloadavg()[0]:.2f}); medians: "
          + ", ".join(f"{k[:-2].replace('_', ' ')} {v * 1e3:.1f} ms" for k, v in med.items()))
    print(f"coarse measured {coarse * 1e3:.1f} ms (median settled step of {len(reports['coarse'])} launch(es)) over "
          f"pybubble's median step: measured {coarse / med['measured_s']:.3f}x, as planned "
          f"{coarse / med['greedy_s']:.3f}x, at the exact optimum {coarse / med['exact_s']:.3f}x, with the best "
          f"chain splits {coarse / med['split_s']:.3f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"steps": rows, "median_s": med, "coarse_measured_s": coarse}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
