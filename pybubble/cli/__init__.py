"""The ``pybubble`` command line.

Each subcommand is a function ``cmd_<name>(args) -> int`` (its docstring is the command's help). A
command's tables fit the terminal's width, anything over a couple of seconds shows progress on
stderr, and the last line on stdout is one summary line for scripts: ``<command>: key=value ...``.
Bad input ends with exit code 2 and one line ``error: ...`` on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from .config.checks import finite, integer, interval
from .problem.problem import load_problem
from .schedule.scheduler import POLICIES, load_schedule, schedule_problem
from .schedule.validator import validate

console = Console(highlight=False)
"""Where commands print (stdout)."""
status = Console(stderr=True, highlight=False)
"""Where progress goes (stderr: stdout stays clean for pipes)."""

DESCRIPTION = """Predict the idle time (bubbles) of a 3D-parallel LLM training step and fill it with the
modality encoder's kernels. Times are microseconds (us) unless an option says otherwise."""
"""What ``pybubble --help`` says first."""
EPILOG = """examples:
  pybubble plan examples/quickstart.yaml --plot plan.png     # plan an MLLM, compare with the baselines
  pybubble bubbles --schedule 1f1b --stages 4 --microbatches 8   # the bubbles of an LLM step
  pybubble kernels internvit-300m --micro-batch 13               # one layer as kernels, with times

`pybubble COMMAND --help` describes one command. The last line a command prints is a summary for
scripts: `COMMAND: key=value ...`."""
"""What ``pybubble --help`` says last."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions and epilogs as written and adds each option's default to its help (unless
    the help already says it, or there is no default)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "default:" in text or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line ``error: ...`` (exit code 2)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        """Prints ``error: <message> (see <prog> --help)`` on stderr and exits with code 2."""
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def summary(command: str, **fields: Any) -> None:
    """Prints the summary line ``<command>: key=value ...`` (never wrapped: one line to grep).
    Floats are rounded: times (keys ending in ``_us``, ``_ms``, ``_s``) to 3 decimals, the rest to 4."""
    parts = [f"{k}={round(v, 3 if k.endswith(('_us', '_ms', '_s')) else 4)!r}" if isinstance(v, float) else f"{k}={v}"
             for k, v in fields.items()]
    print(f"{command}: {' '.join(parts)}", flush=True)


@contextlib.contextmanager
def drawing(path: str) -> Iterator[None]:
    """A spinner on stderr while a picture is drawn (on a terminal only)."""
    with status.status(f"drawing {path}") if status.is_terminal else contextlib.nullcontext():
        yield
    console.print(f"wrote {path}")


@contextlib.contextmanager
def progress_bar(what: str, total: int | None = None) -> Iterator[Callable[[int, int | None], None]]:
    """A progress bar on stderr (gone when done; none when stderr is not a terminal); yields
    ``update(done, total)``. It redraws only when updated (no drawing thread), so it does not disturb
    what a benchmark times between updates."""
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=status,
                  transient=True, auto_refresh=False, disable=not status.is_terminal) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done, total=total: bar.update(task, completed=done, total=total, refresh=True)


def table(heading: str | None = None, **kwargs: Any) -> Table:
    """A table in the commands' style (fits the terminal: cells wrap rather than overflow); its
    `heading`, when given, is printed as a line of its own first (it wraps at the terminal's width,
    not at the table's)."""
    if heading:
        console.print(heading)
    return Table(box=box.SIMPLE_HEAVY, show_edge=False, pad_edge=False, collapse_padding=True, **kwargs)


def window_us(text: str | None, plot: str | None) -> tuple[float, float] | None:
    """``--window START:END`` (ms) as (start, end) in us; an error without ``--plot``."""
    if text is None:
        return None
    if not plot:
        raise ValueError("window: draws a part of --plot; give --plot too")
    start, end = interval(text, "window")
    return start * 1e3, end * 1e3


def _ms(us: float) -> str:
    return f"{us / 1000.0:,.1f} ms"


def cmd_schedule(args: argparse.Namespace) -> int:
    """Schedule a problem file's encoder tasks into its bubbles and print the step."""
    problem = load_problem(args.problem)
    t0 = time.perf_counter()
    sched = schedule_problem(problem, args.policy)
    took = time.perf_counter() - t0
    if args.output:
        sched.save(args.output)
    t = table(f"{args.problem}: {problem.num_tasks:,} tasks on {problem.num_lanes} lanes, "
              f"{problem.num_microbatches} microbatches", show_header=False)
    t.add_column()
    t.add_column(justify="right")
    hidden = sched.hidden_fraction(problem)
    t.add_row("LLM step alone (horizon)", _ms(problem.horizon))
    t.add_row(f"step with the encoder ({args.policy})", _ms(sched.step_time))
    t.add_row("grows before / after", f"{_ms(sched.shift_front)} / {_ms(sched.shift_back)}")
    t.add_row("encoder compute in bubbles", f"{hidden:.1%}")
    t.add_row("scheduling took", f"{took * 1e3:,.3f} ms")
    console.print(t)
    if args.output:
        console.print(f"wrote {args.output}")
    summary("schedule", step_ms=sched.step_time / 1e3, horizon_ms=problem.horizon / 1e3, hidden=hidden,
            took_ms=took * 1e3)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a schedule against its problem; exit code 1 when it breaks any rule."""
    problem = load_problem(args.problem)
    violations = validate(problem, load_schedule(args.schedule))
    for v in violations:
        console.print(v)
    summary("validate", valid="yes" if not violations else "no", violations=len(violations))
    return 1 if violations else 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Write a generated 1F1B problem with a ViT-like encoder."""
    from .problem.generated import synthetic

    problem = synthetic(stages=args.stages, lanes_per_stage=args.lanes_per_stage,
                        microbatches=args.microbatches, encoder_layers=args.encoder_layers,
                        kernels_per_layer=args.kernels_per_layer, encoder_scale=args.encoder_scale,
                        tp_gaps_per_op=args.tp_gaps_per_op, seed=args.seed)
    problem.save(args.output)
    console.print(f"wrote {args.output}")
    summary("generate", tasks=problem.num_tasks, lanes=problem.num_lanes, microbatches=problem.num_microbatches,
            horizon_ms=problem.horizon / 1e3)
    return 0


def cmd_bubbles(args: argparse.Namespace) -> int:
    """Simulate an LLM step and print its bubbles per stage and kind."""
    from .llm.timeline import BUBBLE_KINDS, simulate_pipeline

    window = window_us(args.window, args.plot)
    tp = (args.tp_count, args.tp_duration) if args.tp_count else None
    warmup = args.warmup[0] if args.warmup is not None and len(args.warmup) == 1 else args.warmup
    tl = simulate_pipeline(args.schedule, ranks=args.stages, microbatches=args.microbatches,
                           chunks=args.chunks, fwd=args.fwd, bwd=args.bwd, wgrad=args.wgrad, p2p=args.p2p,
                           tp_comm=tp, dp_allgather=args.dp_allgather,
                           dp_reducescatter=args.dp_reducescatter, warmup=warmup)
    times = tl.bubble_time()
    t = table(f"{args.schedule}: {args.stages} stages, {args.microbatches} microbatches, step {_ms(tl.step_time)}; "
              "bubble time per stage (ms)")
    t.add_column("stage", justify="right")
    kinds = [k for k in BUBBLE_KINDS if any(times[s][k] > 0 for s in times)]
    for kind in kinds:  # the kind's name on lines short enough for 80 columns: dp_ / allgather
        head = kind.replace("_", "_\n", 1).replace("reducescatter", "reduce\nscatter")
        t.add_column(head, justify="right", min_width=max(map(len, head.split("\n"))))
    t.add_column("total", justify="right", style="bold")
    t.add_column("share", justify="right")
    totals = [sum(k.values()) for k in times.values()]
    shown_stages = _shown_rows(len(totals))
    for s in shown_stages:
        if s is None:
            t.add_row("...", *("" for _ in kinds), "", "")
            continue
        t.add_row(str(s), *(f"{times[s][k] / 1e3:,.3f}" for k in kinds), f"{totals[s] / 1e3:,.3f}",
                  f"{totals[s] / tl.step_time:.1%}")
    console.print(t)
    if len(shown_stages) < len(totals):
        console.print(f"({len(totals) - len(shown_stages) + 1:,} stages not shown; --trace and --plot have them all)")
    if args.trace:
        from .viz.trace import save_trace

        save_trace(tl, args.trace)
        console.print(f"wrote {args.trace} (Chrome trace: open in ui.perfetto.dev)")
    if args.plot:
        from .viz.gantt import save_gantt

        with drawing(args.plot):
            save_gantt(tl, args.plot, window=window,
                       title=f"{args.schedule}: {args.stages} stages, {args.microbatches} microbatches; "
                             f"step {_ms(tl.step_time)}, {sum(totals) / (tl.step_time * len(totals)):.1%} "
                             "of it idle (mean over the stages)")
    summary("bubbles", step_ms=tl.step_time / 1e3, bubble_share=sum(totals) / (tl.step_time * len(totals)))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan an MLLM from a YAML config and print pybubble beside the baselines."""
    import json

    from .config.documents import write_text
    from .config.schema import load_config
    from .planner.report import plan

    window = window_us(args.window, args.plot)
    config = load_config(args.config)
    workers = args.workers or min(2, os.cpu_count() or 1)
    with progress_bar("searching encoder plans") as update:
        report = plan(config, workers=workers, progress=update)
    c, p = config, config.llm_plan
    encoders = " + ".join(f"{e.model.name} ({e.images_per_sample} image{'s' * (e.images_per_sample > 1)}/sample"
                          + (", frozen" if e.frozen else "") + ")" for e in c.encoders)
    llm_alone = report.search.timeline.step_time
    console.print(f"[bold]{args.config}[/]: {encoders} -> {c.llm.name} on {c.cluster.gpus:,} x {c.cluster.gpu}")
    console.print(f"LLM plan: DP {p.dp} x PP {p.pp} x TP {p.tp}, {p.schedule}"
                  + (f" (vpp {p.vpp})" if p.vpp > 1 else "") + f", {c.microbatches} microbatches; "
                  f"LLM alone {_ms(llm_alone)}")
    bound = report.lower_bound
    if bound is not None:
        console.print(f"lower bound {_ms(bound)} ({bound / llm_alone - 1:+.2%}): no schedule of these encoder plans "
                      f"in the LLM's bubbles is shorter; pybubble {report.step_time / bound - 1:+.2%} above it")
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
        console.print(f"* more than memory_gb ({c.memory_gb:g} GB per GPU): does not fit, not compared")
    layouts = Table.grid(padding=(0, 2))
    layouts.add_column(no_wrap=True)
    layouts.add_column(overflow="fold")
    for row in rows:  # a list like [1, 5, 5, 5] wraps as one word
        layouts.add_row(row.name, re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(", ", ","), row.layout))
    console.print(layouts)
    for f in report.features if report.in_pipeline is None else []:
        bought = "" if f.step_without is None else f"; without it {_ms(f.step_without)} ({f.without})"
        console.print(f"pybubble uses {f.name}: {f.uses}{bought}")
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
    if args.plot:
        with drawing(args.plot):
            report.save_plot(args.plot, window=window)
    step = report.step_time
    summary("plan", step_ms=step / 1e3, vs_megatron=megatron / step, vs_coarse=report.baselines["coarse"].step_time / step,
            hidden=report.hidden_fraction or 0.0, planner_s=report.planner_seconds)
    return 0


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def cmd_kernels(args: argparse.Namespace) -> int:
    """Print one layer's kernels with their FLOPs, bytes and predicted time."""
    from .config.presets import model
    from .costs.roofline import CostModel

    cfg = model(args.model)
    seq_len = args.seq_len or getattr(cfg, "tokens", None) or getattr(cfg, "seq_len")
    costs = CostModel(args.gpu, calibration=args.calibration)
    phase_times = {}
    for phase in ("fwd", "bwd"):
        rows = costs.layer_kernels(cfg, args.micro_batch, seq_len, tp=args.tp,
                                   sequence_parallel=args.sequence_parallel, phase=phase)
        t = table(f"{cfg.name}, one layer's {('forward', 'backward')[phase == 'bwd']}: micro batch {args.micro_batch}, "
                  f"{seq_len:,} tokens, TP {args.tp}, {costs.hardware.name}")
        for col in ("#", "kernel", "FLOPs", "bytes", "time (us)", "bound", "after"):
            t.add_column(col, justify="left" if col in ("kernel", "bound", "after") else "right")
        for i, (k, dur) in enumerate(rows):
            t.add_row(str(i), k.name, _si(k.flops, "FLOP") if k.flops else "-", _si(k.bytes, "B"), f"{dur:,.1f}",
                      costs.bound(k), ",".join(map(str, k.after)))
        phase_times[phase] = sum(d for _, d in rows)
        t.add_row("", "layer", _si(sum(k.flops for k, _ in rows), "FLOP"), "", f"{phase_times[phase]:,.1f}", "", "",
                  style="bold")
        console.print(t)
    total = sum(phase_times.values())
    console.print(f"{cfg.name}: one layer forward + backward {_ms(total)}; {cfg.layers} layers {_ms(total * cfg.layers)}")
    summary("kernels", layer_fwd_us=phase_times["fwd"], layer_bwd_us=phase_times["bwd"],
            model_ms=total * cfg.layers / 1e3)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Time real layer kernels with torch and fit the cost model's efficiencies, or fit it to a measured step."""
    from .config.documents import write_document, write_text
    from .costs.calibration import FIT_X, calibrate, error_table

    if args.trace or args.config:
        return _calibrate_on_trace(args)

    t0 = time.perf_counter()
    with progress_bar(f"timing kernels on {args.device}") as update:
        doc = calibrate(args.device, repeats=args.repeats, progress=update)
    took = time.perf_counter() - t0
    write_document(args.output, doc)
    t = table(f"calibration on {doc['device_name']} ({doc['hardware']}, {took:.1f} s)")
    t.add_column("kind")
    t.add_column("efficiency (of peak FLOP/s or bandwidth)", justify="right")
    t.add_column("overhead (us)", justify="right")
    for kind, fit in doc["kinds"].items():
        eff = fit["compute_efficiency"] if FIT_X[kind] == "flops" else fit["memory_efficiency"]
        t.add_row(kind, f"{eff:.3f}", f"{fit['overhead_us']:,.1f}")
    console.print(t)
    console.print(f"wrote {args.output}")
    if args.errors:
        write_text(args.errors, error_table(doc))
        console.print(f"wrote {args.errors}")
    summary("calibrate", device=args.device, kinds=len(doc["kinds"]), samples=len(doc["samples"]), took_s=took)
    return 0


def _calibrate_on_trace(args: argparse.Namespace) -> int:
    """``pybubble calibrate --trace DIR [DIR ...] --config CONFIG``: the op factors fitted to measured
    steps (the medians of their measured quantities)."""
    from .config.documents import read_document, write_document
    from .config.schema import load_config
    from .costs.roofline import CALIBRATION_FORMAT
    from .measure.fit import fit_steps, read_steps

    if not (args.trace and args.config):
        raise ValueError("--trace and --config go together: the measured steps and the config of their job")
    config = load_config(args.config)
    fit = fit_steps(config, read_steps(args.trace))
    base = {}
    if config.cluster.calibration:
        base = {k: v for k, v in read_document(config.cluster.calibration, CALIBRATION_FORMAT).items()
                if k not in ("op_factors", "fit", "fitted_on")}
    fitted_on = ", ".join(os.path.basename(os.path.normpath(trace)) for trace in args.trace)
    write_document(args.output, fit.to_calibration(base, config.cluster.gpu, fitted_on))
    t = table(f"op factors fitted to {fit.measured} in {', '.join(map(str, args.trace))} ({fit.ranks} ranks) "
              f"for {args.config}")
    for col in ("op kind", "measured /\npredicted", "measured", "residual\nmedian", "residual\nlargest"):
        t.add_column(col, justify="left" if col == "op kind" else "right")
    for kind, factor in fit.factors.items():
        res = sorted(abs(r) for r in fit.residuals.get(kind, []))
        t.add_row(kind, f"{factor:.3f}", f"{fit.rows.get(kind, 0)}",
                  f"{res[len(res) // 2]:.1%}" if res else "-", f"{res[-1]:.1%}" if res else "-")
    console.print(t)
    console.print(f"wrote {args.output} (name it as cluster.calibration in a config to plan with it)")
    summary("calibrate", trace=",".join(map(str, args.trace)), steps=fit.steps, kinds=len(fit.factors),
            **{k: round(v, 4) for k, v in fit.factors.items()},
            worst_residual=max((abs(r) for rs in fit.residuals.values() for r in rs), default=0.0))
    return 0


def cmd_dynamic(args: argparse.Namespace) -> int:
    """Compare static, balanced, ordered, online and per-batch plan choice on batches that change."""
    import numpy as np

    from .config.documents import write_document
    from .config.schema import load_config
    from .planner.dynamic import run

    from .data.files import read_samples
    from .data.mix import MixSpec

    integer(args.steps, "steps", minimum=1)
    integer(args.candidates, "candidates", minimum=1)
    finite(args.budget_ms, "budget_ms", minimum=0.0)
    if args.replicas is not None:
        integer(args.replicas, "replicas", minimum=1)
        if args.data_file is None and args.data != "mix":
            raise ValueError("replicas: modelled with --data mix or --data-file only")
    config = load_config(args.config)
    data = None
    if args.data_file is not None:
        data = read_samples(args.data_file, tokens_per_tile=config.encoders[0].model.tokens)
    elif args.data == "mix":
        data = MixSpec()
    with progress_bar(f"{args.steps} batches", total=args.steps) as update:
        result = run(config, steps=args.steps, seed=args.seed, k=args.candidates, budget=args.budget_ms / 1e3,
                     progress=lambda i: update(i + 1, args.steps), data=data, replicas=args.replicas)
    summ = result.summary()
    replicas = result.imbalance_before is not None
    t = table(f"{args.config}: {args.steps} batches, LLM alone {_ms(result.horizon)}, "
              f"{len(result.plans)} candidate plans"
              + (f", {result.extra['replicas']} replicas ({result.extra['data']} data)" if replicas else ""))
    for col in ("mode", "mean step (ms)", "p95 step (ms)", "gain vs static", "reschedule (ms, median)") \
            + (("replicas wait (ms, mean)",) if replicas else ()):
        t.add_column(col, justify="left" if col == "mode" else "right")
    # balanced: balancing plus rescheduling; choice: all plans it evaluated
    took = {"online": result.reschedule, "balanced": result.balance_took, "ordered": result.order_took,
            "choice": result.choice_took}
    for mode, s in summ.items():
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
    if args.json:
        write_document(args.json, {**result.to_dict(), "config": str(args.config)})
        console.print(f"wrote {args.json}")
    if args.plot:
        with drawing(args.plot):
            result.save_plot(args.plot, title=f"{os.path.basename(args.config)}: step time over {args.steps} "
                                              "batches whose encoder work changes")
    summary("dynamic", **{f"{mode}_ms": round(s["mean"] / 1e3, 1) for mode, s in summ.items()})
    return 0


def _what_if(args: argparse.Namespace) -> int:
    """``pybubble measure TRACE --what-if CONFIG``: pybubble's plan on the measured step's bubbles."""
    from .config.schema import load_config
    from .planner.report import describe
    from .planner.what_if import what_if

    config = load_config(args.what_if)
    w = what_if(args.trace, config, workers=min(2, os.cpu_count() or 1))
    factors = ", ".join(f"{k} {v:.3f}" for k, v in w.fit.factors.items())
    idle = "" if w.measured_idle is None else f", {_ms(w.measured_idle)} idle over all ranks"
    console.print(f"[bold]{args.trace}[/]: {w.fit.ranks} ranks, measured step {_ms(w.measured_step)} "
                  f"({w.layout} layout){idle}")
    console.print(f"op factors fitted to it (measured / predicted): {factors}")
    error = w.predicted_step / w.measured_step - 1
    console.print(f"{w.layout} at these factors: {_ms(w.predicted_step)} ({error:+.1%} against the measured step)")
    adopted = w.report.in_pipeline
    console.print(f"pybubble with {args.what_if}'s encoder: {_ms(w.pybubble_step)} "
                  f"({w.measured_step / w.pybubble_step:.3f}x the measured step), "
                  + (f"{w.hidden_fraction:.1%} of the encoder's compute in the measured bubbles; "
                     f"{describe(w.report.best)}" if adopted is None else f"{adopted.name}'s layout"))
    summary("what-if", measured_ms=w.measured_step / 1e3, predicted_ms=w.predicted_step / 1e3,
            error=error, pybubble_ms=w.pybubble_step / 1e3, hidden=w.hidden_fraction,
            speedup=w.measured_step / w.pybubble_step)
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    """Measure the idle time per rank and kind in torch.profiler traces of a pipeline run."""
    if args.what_if:
        return _what_if(args)
    from .config.documents import write_document
    from .measure.bubbles import IDLE_KINDS, PARALLEL_KINDS, compare, measure, predicted_bubbles, save_plot, to_dict

    measured = measure(args.trace, args.min_gap_us)
    predicted = predicted_bubbles(args.predict) if args.predict else None
    comparison = compare(measured, predicted) if predicted else None
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


def _print_idle_by_parallelism(trace: str, measured: list) -> None:
    """``pybubble measure``'s second table: idle per rank by what the rank waits for."""
    from .measure.bubbles import PARALLEL_KINDS

    t = table(f"{trace}: idle per rank by what it waits for (ms)")
    for col in ("rank", "idle", *PARALLEL_KINDS):
        t.add_column(col, justify="left" if col == "rank" else "right")
    for r in measured:
        t.add_row(str(r.rank), f"{r.idle / 1e3:,.2f}",
                  *(f"{r.idle_by_parallelism[k] / 1e3:,.2f}" for k in PARALLEL_KINDS))
    console.print(t)


def _command(sub: Any, name: str, func: Callable[[argparse.Namespace], int], about: str, example: str) -> Parser:
    """A subcommand: its help line (the function's docstring), what it does, and an example."""
    summary_line = (func.__doc__ or "").strip()
    p = sub.add_parser(name, help=summary_line[0].lower() + summary_line[1:].rstrip("."),
                       description=f"{summary_line}\n\n{about}", epilog=f"example:\n  {example}",
                       formatter_class=HelpFormatter)
    p.set_defaults(func=func)
    return p


def _picture_options(p: argparse.ArgumentParser, what: str) -> None:
    """--trace, --plot and --window of a command that simulates a step."""
    p.add_argument("--trace", metavar="FILE", help=f"write {what} as a Chrome trace (open in ui.perfetto.dev)")
    p.add_argument("--plot", metavar="FILE", help=f"write a Gantt chart of {what} here (.png or .svg)")
    p.add_argument("--window", metavar="START:END",
                   help="draw only this part of the step in --plot: ms from the step's start, e.g. 100:250")


MAX_TABLE_ROWS = 24
"""The most rows a table prints: longer ones show their first and last rows around a "..." row."""


def _shown_rows(count: int) -> list[int | None]:
    """The rows of a table of `count` rows to print (None: the "..." between its ends)."""
    if count <= MAX_TABLE_ROWS:
        return list(range(count))
    half = MAX_TABLE_ROWS // 2
    return [*range(half), None, *range(count - half, count)]


def _pipeline_options(p: argparse.ArgumentParser, stages: str) -> None:
    """--stages and --microbatches, as `bubbles` and `generate` take them."""
    p.add_argument("--stages", type=int, default=4, metavar="N", help=stages)
    p.add_argument("--microbatches", type=int, default=8, metavar="N", help="microbatches per step")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from .config.presets import ENCODERS, LLMS
    from .config.schema import GPUS, SCHEDULES

    parser = Parser(prog="pybubble", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"pybubble {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")

    p = _command(sub, "plan", cmd_plan,
                 "Searches the encoder's parallel plans (PP_enc, TP_enc, DP_enc) and microbatch partitions,\n"
                 "schedules the encoder's kernels into the LLM's bubbles, and prints pybubble's step beside\n"
                 "megatron (encoder on stage 0), megatron_balanced, coarse (encoder before/after the LLM) and\n"
                 "a non-colocated layout. The config format: examples/quickstart.yaml, docs/planner.md.",
                 "pybubble plan examples/quickstart.yaml --plot plan.png --trace plan.trace.json --json plan.json")
    p.add_argument("config", help="the planning config (YAML): models, batch, LLM plan, cluster")
    p.add_argument("--json", metavar="FILE", help="write the report (step times in s, pybubble's plan) as JSON here")
    _picture_options(p, "pybubble's step")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="search threads (default: 0, as many as the cores, at most 2)")

    p = _command(sub, "bubbles", cmd_bubbles,
                 "Simulates one LLM training step from its pipeline schedule and per-action costs, and prints\n"
                 "each stage's idle time by kind: dp_allgather, pp_warmup, pp_steady, pp_cooldown, tp,\n"
                 "dp_reducescatter (docs/pipeline.md).",
                 "pybubble bubbles --schedule interleaved_1f1b --stages 8 --microbatches 32 --chunks 12 "
                 "--tp-count 2 --tp-duration 60 --plot step.png")
    p.add_argument("--schedule", default="1f1b", metavar="NAME",
                   help=f"pipeline schedule: {', '.join(SCHEDULES)}, or a CSV action table")
    _pipeline_options(p, "pipeline stages (one per rank)")
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
    _picture_options(p, "the step")

    p = _command(sub, "schedule", cmd_schedule,
                 "Places every encoder task of a pybubble.problem/1 file (docs/formats.md) into its lane's free\n"
                 "windows with the C++ scheduler, and prints the step it gives.",
                 "pybubble generate -o problem.json && pybubble schedule problem.json -o schedule.json")
    p.add_argument("problem", help="a pybubble.problem/1 JSON file")
    p.add_argument("-o", "--output", metavar="FILE", help="write the schedule (pybubble.schedule/1 JSON) here")
    p.add_argument("--policy", choices=POLICIES, default="greedy",
                   help="greedy: fill the bubbles kernel by kernel (Optimus's fine-grained schedule); "
                        "coarse: every encoder forward before the LLM's step, every backward after it")

    p = _command(sub, "validate", cmd_validate,
                 "Checks every rule of docs/formats.md (dependencies, windows, overlaps, F_k and B_k, step\n"
                 "time) and prints each violation. Exit code: 0 valid, 1 violations, 2 unreadable input.",
                 "pybubble validate problem.json schedule.json")
    p.add_argument("problem", help="a pybubble.problem/1 JSON file")
    p.add_argument("schedule", help="a pybubble.schedule/1 JSON file for that problem")

    p = _command(sub, "generate", cmd_generate,
                 "A 1F1B pipeline with LLM forwards of 4 ms and backwards of 8 ms, TP collectives of 150 us\n"
                 "inside them, and an encoder cut into kernels with random durations, as a problem file.",
                 "pybubble generate -o problem.json --stages 8 --microbatches 32")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="write the pybubble.problem/1 JSON here")
    _pipeline_options(p, "pipeline stages (the encoder has as many)")
    p.add_argument("--lanes-per-stage", type=int, default=2, metavar="N", help="encoder lanes on each stage's GPUs")
    p.add_argument("--encoder-layers", type=int, default=8, metavar="N", help="encoder layers, split over the stages")
    p.add_argument("--kernels-per-layer", type=int, default=16, metavar="N",
                   help="encoder kernels per layer and phase")
    p.add_argument("--tp-gaps-per-op", type=int, default=4, metavar="N", help="TP collectives inside each LLM action")
    p.add_argument("--encoder-scale", type=float, default=1.0, metavar="X",
                   help="multiplies every encoder kernel's duration")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the kernel durations")

    models = "presets:\n" + "\n".join(textwrap.fill(f"{kind}: {', '.join(names)}", 96, initial_indent="  ", break_on_hyphens=False,
                                                   subsequent_indent="    ")
                                     for kind, names in (("encoders", ENCODERS), ("LLMs", LLMS))) + "\n\n"
    p = _command(sub, "kernels", cmd_kernels,
                 "Cuts one transformer layer of a preset into the kernels one rank of its TP group runs, forward\n"
                 "and backward, with FLOPs, bytes, the roofline's time and what bounds it (docs/costmodel.md).",
                 "pybubble kernels vit-22b --micro-batch 2 --tp 8 --gpu h100")
    p.epilog = models + p.epilog
    p.add_argument("model", help="an encoder or LLM preset (listed below)")
    p.add_argument("--micro-batch", type=int, default=1, metavar="N", help="sequences (or images) per microbatch")
    p.add_argument("--seq-len", type=int, metavar="N",
                   help="tokens per sequence (default: the preset's tokens per image or sequence length)")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel size")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron's sequence parallelism (all-gather and reduce-scatter instead of all-reduce)")
    p.add_argument("--gpu", default="h100", choices=GPUS, help="the cost model's hardware")
    p.add_argument("--calibration", metavar="FILE",
                   help="a pybubble.calibration/1 file (from `pybubble calibrate`) replacing the default efficiencies")

    p = _command(sub, "calibrate", cmd_calibrate,
                 "Times every compute kernel of a layer at a few shapes with torch (needs torch), fits the\n"
                 "roofline's efficiency and overhead per kernel kind, and writes them for --calibration.\n"
                 "With --trace and --config: fits the cost model to measured steps instead (torch.profiler\n"
                 "traces of torch.distributed.pipelining steps, each measured quantity at its median over\n"
                 "them): per op kind, measured over predicted time.",
                 "pybubble calibrate --trace prof1/ prof2/ prof3/ --config job.yaml -o calib.json")
    p.add_argument("--trace", metavar="DIR", nargs="+", action="extend",
                   help="torch.profiler traces of one step each (a folder, one per rank, or one file) to fit to: "
                        "several steps of the job are fitted at the medians of their measured quantities")
    p.add_argument("--config", metavar="CONFIG", help="the planning config of the traced job (with --trace)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to time the kernels (cpu: one thread, fp32; cuda: the first GPU, bf16)")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="write the pybubble.calibration/1 JSON here")
    p.add_argument("--errors", metavar="FILE", help="write the predicted-versus-measured table (Markdown) here")
    p.add_argument("--repeats", type=int, default=7, metavar="N", help="timed runs per kernel (the fastest counts)")

    p = _command(sub, "dynamic", cmd_dynamic,
                 "Draws batches whose images per sample change, and compares per batch: the static plan, samples\n"
                 "balanced over microbatches, microbatches ordered by their encoder work, online rescheduling, and a\n"
                 "per-batch choice among the best plans (docs/dynamic.md).",
                 "pybubble dynamic examples/quickstart.yaml --steps 100 --plot steps.png")
    p.add_argument("config", help="the planning config (YAML)")
    p.add_argument("--steps", type=int, default=200, metavar="N", help="batches to draw")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the batches")
    p.add_argument("--candidates", type=int, default=4, metavar="K",
                   help="plans the per-batch choice considers (the K best on the mean batch)")
    p.add_argument("--budget-ms", type=float, default=10.0, metavar="MS", help="time budget of one plan choice, ms")
    p.add_argument("--plot", metavar="FILE", help="write the chart of step times per mode here (.png or .svg)")
    p.add_argument("--json", metavar="FILE", help="write the run (pybubble.dynamic/1 JSON) here")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--data", choices=("workload", "mix"), default="workload",
                      help="workload: images per sample from the config (one replica, as before); mix: an open "
                           "VLM's training mix as tiles over data-parallel replicas (docs/dynamic.md)")
    data.add_argument("--data-file", metavar="FILE",
                      help='JSON lines, one sample each: {"tiles": [t1, t2, ...], "text": N}, drawn with '
                           "replacement, over data-parallel replicas like --data mix")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="data-parallel replicas modelled with --data mix or --data-file (default: the config's dp)")

    p = _command(sub, "measure", cmd_measure,
                 "Reads torch.profiler Chrome traces of a pipeline run (a file, or a folder of one per rank)\n"
                 "and prints per rank the step's span, busy and idle time, idle by kind (warm-up, steady,\n"
                 "cool-down, collective), idle by what the rank waits for (pp, dp, tp, other) and, with every\n"
                 "rank's trace, waiting versus transferring (docs/runtime.md).",
                 "pybubble measure traces/ --predict examples/quickstart.yaml --plot idle.png")
    p.add_argument("trace", help="a Chrome trace (JSON) of one rank, or a folder with one per rank")
    p.add_argument("--predict", metavar="FILE",
                   help="a planning config (YAML) or a timeline's Chrome trace (JSON) to compare with")
    p.add_argument("--what-if", metavar="CONFIG",
                   help="the planning config of the traced job: the cost model fitted to the trace, then how much "
                        "of its encoder pybubble hides in the measured bubbles and the step it predicts")
    p.add_argument("--json", metavar="FILE", help="write the measurement (pybubble.measure/1 JSON) here")
    p.add_argument("--plot", metavar="FILE", help="write idle per rank and kind as a bar chart here (.png or .svg)")
    p.add_argument("--min-gap-us", type=float, default=100.0, metavar="US",
                   help="gaps between busy events shorter than this are host glue, not idle, us")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code (2 and one ``error:`` line for bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, a usage error (already printed)
        return e.code if isinstance(e.code, int) else 0
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BrokenPipeError:  # the reader left (`pybubble ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except (MemoryError, RecursionError, OverflowError) as e:
        # the limits (docs/formats.md) are meant to stop this earlier; never a traceback all the same
        print(f"error: the input is too large or nested too deeply ({type(e).__name__}); see the limits in "
              "docs/formats.md", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def _one_line(error: BaseException) -> str:
    """An error's message on one line (an OSError's with its file)."""
    if isinstance(error, OSError) and error.filename:
        text = f"{error.filename}: {error.strerror or error}"
    else:
        text = str(error)
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
