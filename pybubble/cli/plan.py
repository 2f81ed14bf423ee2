"""Searches the encoder's parallel plans (PP_enc, TP_enc, DP_enc) and microbatch partitions,
schedules the encoder's kernels into the LLM's bubbles, and prints pybubble's step beside
megatron (encoder on stage 0), megatron_balanced, coarse (encoder before/after the LLM), optimus
(Optimus as published: whole microbatches per encoder pipeline, the config's schedule) and a
non-colocated layout. The config format: examples/quickstart.yaml, docs/planner.md.

example:
  pybubble plan examples/quickstart.yaml --plot plan.png --trace plan.trace.json --json plan.json
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from rich.table import Table

from .option_groups import Parser, add_config, add_json, add_picture_options, window_us
from .terminal import console, drawing, in_ms, progress_bar, summary, table


def add_options(p: Parser) -> None:
    """Adds the options of ``pybubble plan`` to its parser `p`."""
    add_config(p, "the planning config (YAML): models, batch, LLM plan, cluster")
    add_json(p, "the report (step times in s, pybubble's plan) as JSON")
    add_picture_options(p, "pybubble's step")
    p.add_argument("--optimus-trace", metavar="FILE",
                   help="write the optimus row's step (Optimus as published) as a Chrome trace, as --trace")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="search threads (default: 0, as many as the cores, at most 2)")


def run(args: argparse.Namespace) -> int:
    """Plan an MLLM from a YAML config and print pybubble beside the baselines."""
    from ..config.documents import write_text
    from ..config.schema import load_config
    from ..planner.report import plan

    window = window_us(args.window, args.plot)
    config = load_config(args.config)
    workers = args.workers or min(2, os.cpu_count() or 1)
    with progress_bar("searching encoder plans") as update:
        report = plan(config, workers=workers, progress=update)
    _print_setting(args.config, config, report)
    _print_rows(config, report)
    s = report.search.stats
    console.print(f"planned in {report.planner_seconds:.3f} s: {s.plans} encoder plans ({s.plans_pruned} pruned by "
                  f"bound, {s.plans_out_of_memory} out of memory),\n{s.scheduled} partitions scheduled "
                  f"({s.bound_pruned} pruned by bound, {s.memory_pruned} by memory)")
    if args.json:
        write_text(args.json, report.to_json())
        console.print(f"wrote {args.json}")
    if args.trace:
        report.save_trace(args.trace)
        console.print(f"wrote {args.trace} (Chrome trace: open in ui.perfetto.dev)")
    if args.optimus_trace:
        report.save_trace(args.optimus_trace, layout="optimus")
        console.print(f"wrote {args.optimus_trace} (the optimus row's step, Chrome trace)")
    if args.plot:
        with drawing(args.plot):
            report.save_plot(args.plot, window=window)
    step = report.step_time
    summary("plan", step_ms=step / 1e3, vs_megatron=report.baselines["megatron"].step_time / step,
            vs_coarse=report.baselines["coarse"].step_time / step, hidden=report.hidden_fraction or 0.0,
            planner_s=report.planner_seconds)
    return 0


def _print_setting(path: str, config: Any, report: Any) -> None:
    """What is planned: the models, the LLM's plan and step alone, and the lower bound."""
    c, p = config, config.llm_plan
    encoders = " + ".join(f"{e.model.name} ({e.images_per_sample} image{'s' * (e.images_per_sample > 1)}/sample"
                          + (", frozen" if e.frozen else "") + ")" for e in c.encoders)
    llm_alone = report.search.timeline.step_time
    console.print(f"[bold]{path}[/]: {encoders} -> {c.llm.name} on {c.cluster.gpus:,} x {c.cluster.gpu}")
    console.print(f"LLM plan: DP {p.dp} x PP {p.pp} x TP {p.tp}, {p.schedule}"
                  + (f" (vpp {p.vpp})" if p.vpp > 1 else "") + f", {c.microbatches} microbatches; "
                  f"LLM alone {in_ms(llm_alone)}")
    bound = report.lower_bound
    if bound is not None:
        own = report.layout_bound
        console.print(f"lower bound {in_ms(bound)} ({bound / llm_alone - 1:+.2%}): no schedule of these encoder plans "
                      f"in the LLM's bubbles is shorter; pybubble {report.step_time / bound - 1:+.2%} above it"
                      + ("" if own is None else f", {report.step_time / own - 1:+.2%} above its layout's own bound "
                                                f"{in_ms(own)}"))


def _print_rows(config: Any, report: Any) -> None:
    """pybubble's row beside the baselines', their layouts, and the features pybubble's plan uses."""
    t = table()
    for col in ("layout", "step\n(ms)", "vs\nmegatron", "MFU", "encoder\nin bubbles", "memory\nGB/GPU", "GPUs"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    megatron = report.baselines["megatron"].step_time
    rows = report.rows()
    for row in rows:
        t.add_row(row.name, f"{row.step_time / 1e3:,.1f}", f"{megatron / row.step_time:.3f}x",
                  f"{report.mfu(row.step_time, row.gpus):.1%}",
                  "-" if row.hidden_fraction is None else f"{row.hidden_fraction:.1%}",
                  f"{row.memory_bytes / 1e9:.1f}" + ("" if row.fits else " *"), f"{row.gpus:,}",
                  style="bold" if row.name == "pybubble" else None)
    console.print(t)
    if not all(row.fits for row in rows):
        console.print(f"* more than memory_gb ({config.memory_gb:g} GB per GPU): does not fit, not compared")
    layouts = Table.grid(padding=(0, 2))
    layouts.add_column(no_wrap=True)
    layouts.add_column(overflow="fold")
    for row in rows:  # a list like [1, 5, 5, 5] wraps as one word
        layouts.add_row(row.name, re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(", ", ","), row.layout))
    console.print(layouts)
    for f in report.features if report.in_pipeline is None else []:
        bought = "" if f.step_without is None else f"; without it {in_ms(f.step_without)} ({f.without})"
        console.print(f"pybubble uses {f.name}: {f.uses}{bought}")
