"""Reads torch.profiler Chrome traces of a pipeline run (a file, or a folder of one per rank)
and prints per rank the step's span, busy and idle time, idle by kind (warm-up, steady,
cool-down, collective), idle by what the rank waits for (pp, dp, tp, other) and, with every
rank's trace, waiting versus transferring (docs/runtime.md).

example:
  pybubble measure traces/ --predict examples/quickstart.yaml --plot idle.png
"""

from __future__ import annotations

import argparse
import os

from .option_groups import Parser, add_json, add_plot
from .terminal import console, drawing, in_ms, summary, table


def add_options(p: Parser) -> None:
    """Adds the options of ``pybubble measure`` to its parser `p`."""
    p.add_argument("trace", help="a Chrome trace (JSON) of one rank, or a folder with one per rank")
    p.add_argument("--predict", metavar="FILE",
                   help="a planning config (YAML) or a timeline's Chrome trace (JSON) to compare with")
    p.add_argument("--what-if", metavar="CONFIG",
                   help="the planning config of the traced job: the cost model fitted to the trace, then how much "
                        "of its encoder pybubble hides in the measured bubbles and the step it predicts")
    add_json(p, "the measurement (pybubble.measure/1 JSON)")
    add_plot(p, "idle per rank and kind as a bar chart")
    p.add_argument("--min-gap-us", type=float, default=100.0, metavar="US",
                   help="gaps between busy events shorter than this are host glue, not idle, us")


def run(args: argparse.Namespace) -> int:
    """Measure the idle time per rank and kind in torch.profiler traces of a pipeline run."""
    if args.what_if:
        return _what_if(args)
    from ..config.documents import write_document
    from ..measure.bubbles import PARALLEL_KINDS, compare, measure, predicted_bubbles, save_plot, to_dict

    measured = measure(args.trace, args.min_gap_us)
    predicted = predicted_bubbles(args.predict) if args.predict else None
    comparison = compare(measured, predicted) if predicted else None
    _print_idle_by_kind(args, measured, comparison)
    _print_idle_by_parallelism(args.trace, measured)
    if not all(r.phases_known for r in measured):
        console.print("note: no pipeline op annotations (PP:<stage><F|B><mb>) in some traces: their idle outside "
                      "collectives is all counted as steady")
    if args.json:
        write_document(args.json, to_dict(measured, comparison))
        console.print(f"wrote {args.json}")
    if args.plot:
        with drawing(args.plot):
            save_plot(measured, args.plot, predicted)
    summary("measure", ranks=len(measured), idle_ms=sum(r.idle for r in measured) / 1e3,
            span_ms=max(r.span for r in measured) / 1e3,
            **{f"{k}_ms": sum(r.idle_by_parallelism[k] for r in measured) / 1e3 for k in PARALLEL_KINDS})
    return 0


def _print_idle_by_kind(args: argparse.Namespace, measured: list, comparison: dict | None) -> None:
    """``pybubble measure``'s first table: per rank its span, busy and idle time, idle by kind and,
    with --predict, the prediction and its error under each rank."""
    from ..measure.bubbles import IDLE_KINDS

    t = table(f"{args.trace}: idle per rank (ms)" + (f" beside {args.predict}" if args.predict else ""))
    for col in ("rank", "span", "busy", "idle", *IDLE_KINDS, "waiting", "transferring"):
        t.add_column(col, justify="left" if col == "rank" else "right")
    for i, r in enumerate(measured):
        t.add_row(str(r.rank), f"{r.span / 1e3:,.2f}", f"{r.busy / 1e3:,.2f}", f"{r.idle / 1e3:,.2f}",
                  *(f"{r.idle_by_kind[k] / 1e3:,.2f}" for k in IDLE_KINDS),
                  "-" if r.waiting is None else f"{r.waiting / 1e3:,.2f}",
                  "-" if r.transferring is None else f"{r.transferring / 1e3:,.2f}")
        if comparison is not None:
            row = comparison["ranks"][i]
            t.add_row("  predicted", f"{row['span_us']['predicted'] / 1e3:,.2f}", "",
                      f"{row['idle_us']['predicted'] / 1e3:,.2f}",
                      *(f"{row['kinds'][k]['predicted_us'] / 1e3:,.2f}" for k in IDLE_KINDS), "", "", style="dim")
            err = row["idle_us"]["error"]
            t.add_row("  error", f"{r.span / row['span_us']['predicted'] - 1:+.0%}", "",
                      "-" if err is None else f"{err:+.0%}",
                      *("-" if row["kinds"][k]["error"] is None else f"{row['kinds'][k]['error']:+.0%}"
                        for k in IDLE_KINDS), "", "", style="dim")
    console.print(t)


def _print_idle_by_parallelism(trace: str, measured: list) -> None:
    """``pybubble measure``'s second table: idle per rank by what the rank waits for."""
    from ..measure.bubbles import PARALLEL_KINDS

    t = table(f"{trace}: idle per rank by what it waits for (ms)")
    for col in ("rank", "idle", *PARALLEL_KINDS):
        t.add_column(col, justify="left" if col == "rank" else "right")
    for r in measured:
        t.add_row(str(r.rank), f"{r.idle / 1e3:,.2f}",
                  *(f"{r.idle_by_parallelism[k] / 1e3:,.2f}" for k in PARALLEL_KINDS))
    console.print(t)


def _what_if(args: argparse.Namespace) -> int:
    """``pybubble measure TRACE --what-if CONFIG``: pybubble's plan on the measured step's bubbles."""
    from ..config.schema import load_config
    from ..planner.report import describe
    from ..planner.what_if import what_if

    config = load_config(args.what_if)
    w = what_if(args.trace, config, workers=min(2, os.cpu_count() or 1))
    factors = ", ".join(f"{k} {v:.3f}" for k, v in w.fit.factors.items())
    idle = "" if w.measured_idle is None else f", {in_ms(w.measured_idle)} idle over all ranks"
    console.print(f"[bold]{args.trace}[/]: {w.fit.ranks} ranks, measured step {in_ms(w.measured_step)} "
                  f"({w.layout} layout){idle}")
    console.print(f"op factors fitted to it (measured / predicted): {factors}")
    error = w.predicted_step / w.measured_step - 1
    console.print(f"{w.layout} at these factors: {in_ms(w.predicted_step)} ({error:+.1%} against the measured step)")
    adopted = w.report.in_pipeline
    console.print(f"pybubble with {args.what_if}'s encoder: {in_ms(w.pybubble_step)} "
                  f"({w.measured_step / w.pybubble_step:.3f}x the measured step), "
                  + (f"{w.hidden_fraction:.1%} of the encoder's compute in the measured bubbles; "
                     f"{describe(w.report.best)}" if adopted is None else f"{adopted.name}'s layout"))
    summary("what-if", measured_ms=w.measured_step / 1e3, predicted_ms=w.predicted_step / 1e3,
            error=error, pybubble_ms=w.pybubble_step / 1e3, hidden=w.hidden_fraction,
            speedup=w.measured_step / w.pybubble_step)
    return 0
