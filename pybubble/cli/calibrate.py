"""Times every compute kernel of a layer at a few shapes with torch (needs torch), fits the
roofline's efficiency and overhead per kernel kind, and writes them for --calibration.
With --trace and --config: fits the cost model to measured steps instead (torch.profiler
traces of torch.distributed.pipelining steps, each measured quantity at its median over
them): per op kind, measured over predicted time.

example:
  pybubble calibrate --trace prof1/ prof2/ prof3/ --config job.yaml -o calib.json
"""

from __future__ import annotations

import argparse
import os
import time

from .option_groups import Parser
from .terminal import console, progress_bar, summary, table


def add_options(p: Parser) -> None:
    """Adds the options of ``pybubble calibrate`` to its parser `p`."""
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


def run(args: argparse.Namespace) -> int:
    """Time real layer kernels with torch and fit the cost model's efficiencies, or fit it to a measured step."""
    from ..config.documents import write_document, write_text
    from ..costs.calibration import FIT_X, calibrate, error_table

    if args.trace or args.config:
        return _fit_to_traces(args)

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


def _fit_to_traces(args: argparse.Namespace) -> int:
    """``pybubble calibrate --trace DIR [DIR ...] --config CONFIG``: the op factors fitted to measured
    steps (the medians of their measured quantities)."""
    from ..config.documents import read_document, write_document
    from ..config.schema import load_config
    from ..costs.roofline import CALIBRATION_FORMAT
    from ..measure.fit import fit_steps, read_steps

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
