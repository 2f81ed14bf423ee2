"""Draws batches whose images per sample change, and compares per batch: the static plan, samples
balanced over microbatches, microbatches ordered by their encoder work, online rescheduling, and a
per-batch choice among the best plans (docs/dynamic.md).

example:
  pybubble dynamic examples/quickstart.yaml --steps 100 --plot steps.png
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..config.checks import finite, integer
from ..data.sources import add_data_options, data_name, data_source
from .option_groups import Parser, add_config, add_json, add_plot, add_seed
from .terminal import console, drawing, in_ms, progress_bar, summary, table


def add_options(p: Parser) -> None:
    """Adds the options of ``pybubble dynamic`` to its parser `p`."""
    add_config(p, "the planning config (YAML)")
    p.add_argument("--steps", type=int, default=200, metavar="N", help="batches to draw")
    add_seed(p, "the batches")
    p.add_argument("--candidates", type=int, default=4, metavar="K",
                   help="plans the per-batch choice considers (the K best on the mean batch)")
    p.add_argument("--budget-ms", type=float, default=10.0, metavar="MS", help="time budget of one plan choice, ms")
    add_plot(p, "the chart of step times per mode")
    add_json(p, "the run (pybubble.dynamic/1 JSON)")
    add_data_options(p, ("workload", "mix", "native"), default="workload",
                     file_use="drawn with replacement, over data-parallel replicas like --data mix")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="data-parallel replicas modelled with --data mix, native or --data-file (default: the config's dp)")


def run(args: argparse.Namespace) -> int:
    """Compare static, balanced, ordered, online and per-batch plan choice on batches that change."""
    from ..config.documents import write_document
    from ..config.schema import load_config
    from ..planner.dynamic import run as run_modes

    integer(args.steps, "steps", minimum=1)
    integer(args.candidates, "candidates", minimum=1)
    finite(args.budget_ms, "budget_ms", minimum=0.0)
    if args.replicas is not None:
        integer(args.replicas, "replicas", minimum=1)
        if data_name(args) == "workload":
            raise ValueError("replicas: modelled with --data mix, native or --data-file only")
    config = load_config(args.config)
    data = data_source(args, tokens_per_tile=config.encoders[0].model.tokens)
    with progress_bar(f"{args.steps} batches", total=args.steps) as update:
        result = run_modes(config, steps=args.steps, seed=args.seed, k=args.candidates, budget=args.budget_ms / 1e3,
                           progress=lambda i: update(i + 1, args.steps), data=data, replicas=args.replicas)
    _print_modes(args, result)
    if args.json:
        write_document(args.json, {**result.to_dict(), "config": str(args.config)})
        console.print(f"wrote {args.json}")
    if args.plot:
        with drawing(args.plot):
            result.save_plot(args.plot, title=f"{os.path.basename(args.config)}: step time over {args.steps} "
                                              "batches whose encoder work changes")
    summary("dynamic", **{f"{mode}_ms": round(s["mean"] / 1e3, 1) for mode, s in result.summary().items()})
    return 0


def _print_modes(args: argparse.Namespace, result: Any) -> None:
    """The table of step times per mode, the per-batch choice's effort and, with replicas, their
    imbalance before and after balancing."""
    import numpy as np

    replicas = result.imbalance_before is not None
    t = table(f"{args.config}: {args.steps} batches, LLM alone {in_ms(result.horizon)}, "
              f"{len(result.plans)} candidate plans"
              + (f", {result.extra['replicas']} replicas ({result.extra['data']} data)" if replicas else ""))
    for col in ("mode", "mean step (ms)", "p95 step (ms)", "gain vs static", "reschedule (ms, median)") \
            + (("replicas wait (ms, mean)",) if replicas else ()):
        t.add_column(col, justify="left" if col == "mode" else "right")
    # balanced: balancing plus rescheduling; choice: all plans it evaluated
    took = {"online": result.reschedule, "balanced": result.balance_took, "ordered": result.order_took,
            "choice": result.choice_took}
    for mode, s in result.summary().items():
        median = f"{float(np.median(took[mode])) * 1e3:.3f}" if mode in took else "-"
        wait = (f"{float(np.mean(result.dp_wait[mode])) / 1e3:,.2f}",) if replicas else ()
        t.add_row(mode, f"{s['mean'] / 1e3:,.1f}", f"{s['p95'] / 1e3:,.1f}", f"{s['gain_vs_static']:.4f}x", median,
                  *wait)
    console.print(t)
    console.print(f"choice: {float(np.mean(result.evaluated)):.2f} plans evaluated per batch on average within "
                  f"{args.budget_ms:g} ms (max {float(result.choice_took.max()) * 1e3:.3f} ms); a plan other than "
                  f"the mean batch's best chosen for {int((result.chosen > 0).sum())} of {args.steps} batches")
    if replicas:
        assert result.imbalance_before is not None and result.imbalance_after is not None
        assert result.balance_dp_took is not None
        console.print(f"replicas' encoder imbalance (max / mean seconds), median over steps: "
                      f"{float(np.median(result.imbalance_before)):.3f} before balancing, "
                      f"{float(np.median(result.imbalance_after)):.3f} after (balanced_dp; balancing "
                      f"{float(np.median(result.balance_dp_took)) * 1e3:.3f} ms per step, median)")
