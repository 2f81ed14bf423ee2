"""Simulates one LLM training step from its pipeline schedule and per-action costs, and prints
each stage's idle time by kind: dp_allgather, pp_warmup, pp_steady, pp_cooldown, tp,
dp_reducescatter (docs/pipeline.md).

example:
  pybubble bubbles --schedule interleaved_1f1b --stages 8 --microbatches 32 --chunks 12 --tp-count 2 --tp-duration 60 --plot step.png
"""

from __future__ import annotations

import argparse
from typing import Any

from .option_groups import Parser, add_picture_options, add_pipeline_options, window_us
from .terminal import console, drawing, in_ms, shown_rows, summary, table


def add_options(p: Parser) -> None:
    """Adds the options of ``pybubble bubbles`` to its parser `p`."""
    from ..config.schema import SCHEDULES

    p.add_argument("--schedule", default="1f1b", metavar="NAME",
                   help=f"pipeline schedule: {', '.join(SCHEDULES)}, or a CSV action table")
    add_pipeline_options(p, "pipeline stages (one per rank)")
    p.add_argument("--chunks", type=int, default=1, metavar="N", help="model chunks per stage (interleaved_1f1b)")
    p.add_argument("--fwd", type=float, default=1000.0, metavar="US",
                   help="one forward action (a microbatch through one chunk), us")
    p.add_argument("--bwd", type=float, default=2000.0, metavar="US", help="one full backward action, us")
    p.add_argument("--wgrad", type=float, default=None, metavar="US",
                   help="weight-gradient part of --bwd in split schedules (zb_h1, zbv), us (default: half of --bwd)")
    p.add_argument("--p2p", type=float, default=0.0, metavar="US", help="latency of a send between stages, us")
    p.add_argument("--tp-count", type=int, default=0, metavar="N", help="TP collectives inside each F, B and I action")
    p.add_argument("--tp-duration", type=float, default=0.0, metavar="US", help="one TP collective, us")
    p.add_argument("--dp-allgather", type=float, default=0.0, metavar="US",
                   help="DP parameter all-gather before the first action, us")
    p.add_argument("--dp-reducescatter", type=float, default=0.0, metavar="US",
                   help="DP gradient reduce-scatter after the last action, us")
    p.add_argument("--warmup", type=int, nargs="+", default=None, metavar="N",
                   help="warm-up forwards of interleaved_1f1b: one count or one per stage (default: Megatron's)")
    add_picture_options(p, "the step")


def run(args: argparse.Namespace) -> int:
    """Simulate an LLM step and print its bubbles per stage and kind."""
    from ..llm.timeline import simulate_pipeline

    window = window_us(args.window, args.plot)
    tp = (args.tp_count, args.tp_duration) if args.tp_count else None
    warmup = args.warmup[0] if args.warmup is not None and len(args.warmup) == 1 else args.warmup
    tl = simulate_pipeline(args.schedule, ranks=args.stages, microbatches=args.microbatches,
                           chunks=args.chunks, fwd=args.fwd, bwd=args.bwd, wgrad=args.wgrad, p2p=args.p2p,
                           tp_comm=tp, dp_allgather=args.dp_allgather,
                           dp_reducescatter=args.dp_reducescatter, warmup=warmup)
    totals = _print_bubbles(args, tl)
    if args.trace:
        from ..viz.chrome_trace import save_trace

        save_trace(tl, args.trace)
        console.print(f"wrote {args.trace} (Chrome trace: open in ui.perfetto.dev)")
    if args.plot:
        from ..viz.gantt import save_gantt

        with drawing(args.plot):
            save_gantt(tl, args.plot, window=window,
                       title=f"{args.schedule}: {args.stages} stages, {args.microbatches} microbatches; "
                             f"step {in_ms(tl.step_time)}, {sum(totals) / (tl.step_time * len(totals)):.1%} "
                             "of it idle (mean over the stages)")
    summary("bubbles", step_ms=tl.step_time / 1e3, bubble_share=sum(totals) / (tl.step_time * len(totals)))
    return 0


def _print_bubbles(args: argparse.Namespace, tl: Any) -> list[float]:
    """The table of bubble time per stage and kind (its ends when there are many stages); returns
    each stage's total."""
    from ..llm.timeline import BUBBLE_KINDS

    times = tl.bubble_time()
    t = table(f"{args.schedule}: {args.stages} stages, {args.microbatches} microbatches, step {in_ms(tl.step_time)}; "
              "bubble time per stage (ms)")
    t.add_column("stage", justify="right")
    kinds = [k for k in BUBBLE_KINDS if any(times[s][k] > 0 for s in times)]
    for kind in kinds:  # the kind's name on lines short enough for 80 columns: dp_ / allgather
        head = kind.replace("_", "_\n", 1).replace("reducescatter", "reduce\nscatter")
        t.add_column(head, justify="right", min_width=max(map(len, head.split("\n"))))
    t.add_column("total", justify="right", style="bold")
    t.add_column("share", justify="right")
    totals = [sum(k.values()) for k in times.values()]
    shown_stages = shown_rows(len(totals))
    for s in shown_stages:
        if s is None:
            t.add_row("...", *("" for _ in kinds), "", "")
            continue
        t.add_row(str(s), *(f"{times[s][k] / 1e3:,.3f}" for k in kinds), f"{totals[s] / 1e3:,.3f}",
                  f"{totals[s] / tl.step_time:.1%}")
    console.print(t)
    if len(shown_stages) < len(totals):
        console.print(f"({len(totals) - len(shown_stages) + 1:,} stages not shown; --trace and --plot have them all)")
    return totals
