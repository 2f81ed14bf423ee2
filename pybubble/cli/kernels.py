"""Cuts one transformer layer of a preset into the kernels one rank of its TP group runs, forward
and backward, with FLOPs, bytes, the roofline's time and what bounds it (docs/costmodel.md).

example:
  pybubble kernels vit-22b --micro-batch 2 --tp 8 --gpu h100
"""

from __future__ import annotations

import argparse
import textwrap

from .option_groups import Parser
from .terminal import console, in_ms, summary, table


def add_options(p: Parser) -> None:
    """Adds the options of ``pybubble kernels`` to its parser `p`; its help lists the presets."""
    from ..config.presets import ENCODERS, LLMS
    from ..config.schema import GPUS

    models = "presets:\n" + "\n".join(textwrap.fill(f"{kind}: {', '.join(names)}", 96, initial_indent="  ",
                                                   break_on_hyphens=False, subsequent_indent="    ")
                                     for kind, names in (("encoders", ENCODERS), ("LLMs", LLMS))) + "\n\n"
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


def run(args: argparse.Namespace) -> int:
    """Print one layer's kernels with their FLOPs, bytes and predicted time."""
    from ..config.presets import model
    from ..costs.roofline import CostModel

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
    console.print(f"{cfg.name}: one layer forward + backward {in_ms(total)}; {cfg.layers} layers "
                  f"{in_ms(total * cfg.layers)}")
    summary("kernels", layer_fwd_us=phase_times["fwd"], layer_bwd_us=phase_times["bwd"],
            model_ms=total * cfg.layers / 1e3)
    return 0


def _si(value: float, unit: str) -> str:
    """`value` with an SI prefix (k, M, G, T) and `unit`."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"
