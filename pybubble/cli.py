"""The ``pybubble`` command line. Each subcommand is a function ``cmd_<name>(args) -> int``;
bad input ends with exit code 2 and one line ``error: ...`` on stderr."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

from .problem import load_problem
from .scheduler import POLICIES, load_schedule, schedule
from .validator import validate

console = Console(highlight=False)


def _ms(us: float) -> str:
    return f"{us / 1000.0:,.3f} ms"


def cmd_schedule(args: argparse.Namespace) -> int:
    problem = load_problem(args.problem)
    t0 = time.perf_counter()
    sched = schedule(problem, args.policy)
    took = time.perf_counter() - t0
    if args.output:
        sched.save(args.output)
    table = Table(title=f"{args.problem}: {problem.num_tasks} tasks, {problem.num_lanes} lanes, "
                        f"{problem.num_microbatches} microbatches", show_header=False)
    table.add_row("policy", args.policy)
    table.add_row("LLM step (horizon)", _ms(problem.horizon))
    table.add_row("step with encoder", _ms(sched.step_time))
    table.add_row("grows before / after", f"{_ms(sched.shift_front)} / {_ms(sched.shift_back)}")
    table.add_row("encoder compute hidden", f"{100.0 * sched.hidden_fraction(problem):.1f}%")
    table.add_row("scheduling took", f"{took * 1e3:.3f} ms")
    if args.output:
        table.add_row("written to", str(args.output))
    console.print(table)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    problem = load_problem(args.problem)
    violations = validate(problem, load_schedule(args.schedule))
    for v in violations:
        console.print(v)
    if violations:
        console.print(f"{len(violations)} violation(s)")
        return 1
    console.print("valid")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .problems import synthetic

    problem = synthetic(stages=args.stages, lanes_per_stage=args.lanes_per_stage,
                        microbatches=args.microbatches, encoder_layers=args.encoder_layers,
                        kernels_per_layer=args.kernels_per_layer, encoder_scale=args.encoder_scale,
                        tp_gaps_per_op=args.tp_gaps_per_op, seed=args.seed)
    problem.save(args.output)
    console.print(f"wrote {args.output}: {problem}")
    return 0


def cmd_bubbles(args: argparse.Namespace) -> int:
    from .timeline import BUBBLE_KINDS, simulate_pipeline

    tp = (args.tp_count, args.tp_duration) if args.tp_count else None
    warmup = args.warmup[0] if args.warmup is not None and len(args.warmup) == 1 else args.warmup
    tl = simulate_pipeline(args.schedule, stages=args.stages, microbatches=args.microbatches,
                           chunks=args.chunks, fwd=args.fwd, bwd=args.bwd, wgrad=args.wgrad, p2p=args.p2p,
                           tp_comm=tp, dp_allgather=args.dp_allgather,
                           dp_reducescatter=args.dp_reducescatter, warmup=warmup)
    times = tl.bubble_time()
    table = Table(title=f"bubble time (ms) per stage; step {_ms(tl.step_time)}")
    table.add_column("kind", no_wrap=True)
    for s in times:
        table.add_column(str(s), justify="right")
    for kind in BUBBLE_KINDS:
        table.add_row(kind, *(f"{times[s][kind] / 1000.0:.3f}" for s in times))
    totals = [sum(kinds.values()) for kinds in times.values()]
    table.add_row("total", *(f"{t / 1000.0:.3f}" for t in totals), style="bold")
    table.add_row("share", *(f"{t / tl.step_time:.1%}" for t in totals))
    width = max(console.width, 22 + 10 * len(times))  # no squeezed cells when piped (80 columns)
    Console(highlight=False, width=width).print(table)
    if args.trace:
        tl.save_trace(args.trace)
        console.print(f"wrote {args.trace} (Chrome trace: open in ui.perfetto.dev)")
    if args.plot:
        from .plot import save_gantt

        save_gantt(tl, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import json
    import os

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .config import load_config
    from .report import plan

    config = load_config(args.config)
    workers = args.workers or min(2, os.cpu_count() or 1)
    with Progress(TextColumn("searching encoder plans"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("plans", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        report = plan(config, workers=workers, progress=progress)
    c, p = config, config.llm_plan
    encoders = " + ".join(e.model.name + (" (frozen)" if e.frozen else "") for e in c.encoders)
    title = (f"{args.config}: {encoders} -> {c.llm.name}; {c.cluster.gpus} x {c.cluster.gpu}; "
             f"DP {p.dp} x PP {p.pp} x TP {p.tp}, {p.schedule}" + (f" (vpp {p.vpp})" if p.vpp > 1 else "")
             + f", {c.microbatches} microbatches")
    table = Table(title=title)
    for col, just in (("layout", "left"), ("step", "right"), ("vs megatron", "right"), ("MFU", "right"),
                      ("encoder hidden", "right"), ("memory/GPU", "right"), ("GPUs", "right"), ("plan", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    megatron = report.baselines["megatron"].step_time
    for row in report.rows():
        table.add_row(row.name, _ms(row.step_time), f"{megatron / row.step_time:.3f}x",
                      f"{report.mfu(row.step_time, row.gpus):.1%}",
                      "-" if row.hidden_fraction is None else f"{row.hidden_fraction:.1%}",
                      f"{row.memory_bytes / 1e9:.1f} GB", f"{row.gpus:,}", row.layout,
                      style="bold" if row.name == "pybubble" else None)
    Console(highlight=False, width=max(console.width, 160)).print(table)
    s = report.search.stats
    console.print(f"LLM alone: {_ms(report.search.timeline.step_time)}; planner {report.planner_seconds:.3f} s "
                  f"({s.plans} plans, {s.plans_pruned} pruned by bound, {s.plans_out_of_memory} out of memory; "
                  f"{s.scheduled} partitions scheduled, {s.bound_pruned} pruned by bound, "
                  f"{s.memory_pruned} by memory)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
        console.print(f"wrote {args.json}")
    if args.trace:
        report.save_trace(args.trace)
        console.print(f"wrote {args.trace} (Chrome trace: open in ui.perfetto.dev)")
    if args.plot:
        report.save_plot(args.plot)
        console.print(f"wrote {args.plot}")
    return 0


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def cmd_kernels(args: argparse.Namespace) -> int:
    from .costmodel import CostModel
    from .presets import model

    cfg = model(args.model)
    seq_len = args.seq_len or getattr(cfg, "tokens", None) or getattr(cfg, "seq_len")
    costs = CostModel(args.gpu, calibration=args.calibration)
    wide = Console(highlight=False, width=max(console.width, 110))  # the table needs 110 columns
    total = 0.0
    for phase in ("fwd", "bwd"):
        rows = costs.layer_kernels(cfg, args.micro_batch, seq_len, tp=args.tp,
                                   sequence_parallel=args.sequence_parallel, phase=phase)
        table = Table(title=f"{cfg.name} layer {phase}: micro batch {args.micro_batch}, {seq_len} tokens, "
                            f"tp {args.tp}, {costs.hardware.name}")
        for col in ("kernel", "resource", "FLOPs", "bytes", "time", "bound", "after"):
            table.add_column(col, justify="left" if col in ("kernel", "resource", "bound", "after") else "right")
        phase_total = 0.0
        for k, t in rows:
            phase_total += t
            table.add_row(k.name, k.resource, _si(k.flops, "FLOP") if k.flops else "-", _si(k.bytes, "B"),
                          f"{t:,.1f} us", costs.bound(k), ",".join(map(str, k.after)))
        table.add_row("layer", "", _si(sum(k.flops for k, _ in rows), "FLOP"), "", f"{phase_total:,.1f} us", "", "")
        wide.print(table)
        total += phase_total
    console.print(f"{cfg.name}: one layer fwd+bwd {_ms(total)}; {cfg.layers} layers {_ms(total * cfg.layers)}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .calibrate import FIT_X, calibrate, error_table
    from .formats import write_document

    t0 = time.perf_counter()
    doc = calibrate(args.device, repeats=args.repeats)
    took = time.perf_counter() - t0
    write_document(args.output, doc)
    if args.errors:
        Path(args.errors).write_text(error_table(doc))
    table = Table(title=f"calibration on {doc['device_name']} ({doc['hardware']}, {took:.1f} s)")
    for col in ("kind", "efficiency (of peak FLOP/s or bandwidth)", "overhead"):
        table.add_column(col)
    for kind, fit in doc["kinds"].items():
        eff = fit["compute_efficiency"] if FIT_X[kind] == "flops" else fit["memory_efficiency"]
        table.add_row(kind, f"{eff:.3f}", f"{fit['overhead_us']:.1f} us")
    console.print(table)
    console.print(f"wrote {args.output}" + (f" and {args.errors}" if args.errors else ""))
    return 0


def cmd_dynamic(args: argparse.Namespace) -> int:
    import numpy as np
    from rich.progress import Progress

    from .config import load_config
    from .dynamic import run
    from .formats import write_document

    if args.steps < 1:
        raise ValueError(f"steps: {args.steps} is not >= 1")
    if args.candidates < 1:
        raise ValueError(f"candidates: {args.candidates} is not >= 1")
    if not args.budget_ms >= 0:
        raise ValueError(f"budget_ms: {args.budget_ms} is not >= 0")
    config = load_config(args.config)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"{args.steps} batches", total=args.steps)
        result = run(config, steps=args.steps, seed=args.seed, k=args.candidates, budget=args.budget_ms / 1e3,
                     progress=lambda i: bar.update(task, completed=i + 1))
    summary = result.summary()
    table = Table(title=f"{args.config}: {args.steps} batches, LLM-only step {_ms(result.horizon)}, "
                        f"{len(result.plans)} candidate plans")
    for col in ("mode", "mean step", "p95 step", "gain vs static", "reschedule median"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    # balanced: balancing plus rescheduling; choice: all plans it evaluated
    took = {"online": result.reschedule, "balanced": result.balance_took, "choice": result.choice_took}
    for mode, s in summary.items():
        median = f"{float(np.median(took[mode])) * 1e3:.3f} ms" if mode in took else "-"
        table.add_row(mode, _ms(s["mean"]), _ms(s["p95"]), f"{s['gain_vs_static']:.4f}x", median)
    console.print(table)
    console.print(f"choice: {float(np.mean(result.evaluated)):.2f} plans evaluated per batch on average within "
                  f"{args.budget_ms:g} ms (max {float(result.choice_took.max()) * 1e3:.3f} ms); a plan other than "
                  f"the mean batch's best chosen for {int((result.chosen > 0).sum())} of {args.steps} batches")
    if args.json:
        write_document(args.json, {**result.to_dict(), "config": str(args.config)})
        console.print(f"wrote {args.json}")
    if args.plot:
        result.save_plot(args.plot, title=f"{args.config}: step per batch")
        console.print(f"wrote {args.plot}")
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    import json

    from .measure import KINDS, compare, measure, predicted_bubbles, save_plot, to_json

    measured = measure(args.trace, args.min_gap_us)
    predicted = predicted_bubbles(args.predict) if args.predict else None
    comparison = compare(measured, predicted) if predicted else None
    table = Table(title=f"{args.trace}: idle per rank (ms)" + (f" beside {args.predict}" if args.predict else ""))
    for col in ("rank", "step span", "busy", "idle", *KINDS, "waiting", "transferring"):
        table.add_column(col, justify="left" if col == "rank" else "right")
    for i, r in enumerate(measured):
        cells = [str(r.rank), f"{r.span / 1e3:.2f}", f"{r.busy / 1e3:.2f}", f"{r.idle / 1e3:.2f}",
                 *(f"{r.idle_by_kind[k] / 1e3:.2f}" for k in KINDS),
                 "-" if r.waiting is None else f"{r.waiting / 1e3:.2f}",
                 "-" if r.transferring is None else f"{r.transferring / 1e3:.2f}"]
        table.add_row(*cells)
        if comparison is not None:
            row = comparison["ranks"][i]
            pred = [f"{row['kinds'][k]['predicted_us'] / 1e3:.2f}" for k in KINDS]
            table.add_row("  predicted", f"{row['span_us']['predicted'] / 1e3:.2f}", "",
                          f"{row['idle_us']['predicted'] / 1e3:.2f}", *pred, "", "", style="dim")
            errs = [("-" if row["kinds"][k]["error"] is None else f"{row['kinds'][k]['error']:+.0%}") for k in KINDS]
            err = row["idle_us"]["error"]
            table.add_row("  error", f"{r.span / row['span_us']['predicted'] - 1:+.0%}", "",
                          "-" if err is None else f"{err:+.0%}", *errs, "", "", style="dim")
    Console(highlight=False, width=max(console.width, 130)).print(table)
    if not all(r.phases_known for r in measured):
        console.print("note: no pipeline op annotations (PP:<stage><F|B><mb>) in some traces: their idle outside "
                      "collectives is all counted as steady")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(measured, comparison), f, indent=1)
        console.print(f"wrote {args.json}")
    if args.plot:
        save_plot(measured, args.plot, predicted)
        console.print(f"wrote {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pybubble", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("schedule", help="schedule a problem's encoder tasks into its bubbles")
    p.add_argument("problem", help="pybubble.problem/1 JSON file")
    p.add_argument("-o", "--output", help="write the pybubble.schedule/1 JSON here")
    p.add_argument("--policy", choices=POLICIES, default="greedy")
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("validate", help="check a schedule against its problem (exit 1 if invalid)")
    p.add_argument("problem", help="pybubble.problem/1 JSON file")
    p.add_argument("schedule", help="pybubble.schedule/1 JSON file")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("generate", help="write a generated 1F1B problem with a ViT-like encoder")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--lanes-per-stage", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--encoder-layers", type=int, default=8)
    p.add_argument("--kernels-per-layer", type=int, default=16)
    p.add_argument("--tp-gaps-per-op", type=int, default=4)
    p.add_argument("--encoder-scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("plan", help="plan an MLLM from a YAML config: encoder plan, schedule, baselines")
    p.add_argument("config", help="the YAML config (see examples/quickstart.yaml)")
    p.add_argument("--json", help="write the machine-readable report here")
    p.add_argument("--trace", help="write pybubble's step as a Chrome trace JSON (Perfetto) here")
    p.add_argument("--plot", help="write a Gantt chart of pybubble's step here (.png, .svg)")
    p.add_argument("--workers", type=int, default=0, help="search threads (default: up to 2 cores)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("bubbles", help="simulate the LLM step and print its bubbles per stage and kind")
    p.add_argument("--schedule", default="1f1b",
                   help="gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv, or a CSV action table")
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--chunks", type=int, default=1, help="model chunks per stage (interleaved_1f1b)")
    p.add_argument("--fwd", type=float, default=1000.0, help="one forward action (us)")
    p.add_argument("--bwd", type=float, default=2000.0, help="one full backward action (us)")
    p.add_argument("--wgrad", type=float, default=None, help="weight-gradient part of --bwd (us)")
    p.add_argument("--p2p", type=float, default=0.0, help="point-to-point latency (us)")
    p.add_argument("--tp-count", type=int, default=0, help="TP collectives inside each F/B/I op")
    p.add_argument("--tp-duration", type=float, default=0.0, help="one TP collective (us)")
    p.add_argument("--dp-allgather", type=float, default=0.0, help="exposed DP all-gather (us)")
    p.add_argument("--dp-reducescatter", type=float, default=0.0, help="exposed DP reduce-scatter (us)")
    p.add_argument("--warmup", type=int, nargs="+", default=None,
                   help="warm-up forwards of interleaved_1f1b: one count or one per stage")
    p.add_argument("--trace", help="write a Chrome trace JSON (Perfetto) here")
    p.add_argument("--plot", help="write a Gantt chart here (.png, .svg)")
    p.set_defaults(func=cmd_bubbles)

    p = sub.add_parser("kernels", help="print one layer's kernels with FLOPs, bytes and predicted time")
    p.add_argument("model", help="an encoder or LLM preset, e.g. vit-22b")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the preset's)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--gpu", default="h100", help="h100, h200, a100-80gb or cpu")
    p.add_argument("--calibration", help="a pybubble.calibration/1 file to use")
    p.set_defaults(func=cmd_kernels)

    p = sub.add_parser("calibrate", help="time real layer kernels with torch and fit the cost model")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("-o", "--output", required=True, help="write the pybubble.calibration/1 JSON here")
    p.add_argument("--errors", help="write the predicted-versus-measured Markdown table here")
    p.add_argument("--repeats", type=int, default=7)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("dynamic", help="static, balanced, online and per-batch plan choice on dynamic batches")
    p.add_argument("config", help="a planning config (YAML)")
    p.add_argument("--steps", type=int, default=200, help="batches to draw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--candidates", type=int, default=4, help="plans the per-batch choice keeps")
    p.add_argument("--budget-ms", type=float, default=10.0, help="time budget of one plan choice")
    p.add_argument("--plot", help="write the step time per batch here (.png, .svg)")
    p.add_argument("--json", help="write the pybubble.dynamic/1 JSON here")
    p.set_defaults(func=cmd_dynamic)

    p = sub.add_parser("measure", help="idle time per rank and kind from torch.profiler traces of a pipeline run")
    p.add_argument("trace", help="a Chrome trace (JSON) of one rank, or a folder with one per rank")
    p.add_argument("--predict", help="a planning config (YAML) or a timeline's Chrome trace (JSON) to compare with")
    p.add_argument("--json", help="write the pybubble.measure/1 JSON here")
    p.add_argument("--plot", help="write idle per rank and kind as a bar chart here (.png, .svg)")
    p.add_argument("--min-gap-us", type=float, default=100.0,
                   help="gaps between busy events shorter than this are host glue, not idle (default 100)")
    p.set_defaults(func=cmd_measure)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
