"""A 1F1B pipeline with LLM forwards of 4 ms and backwards of 8 ms, TP collectives of 150 us
inside them, and an encoder cut into kernels with random durations, as a problem file.

example:
  pybubble generate -o problem.json --stages 8 --microbatches 32
"""

from __future__ import annotations

import argparse

from .option_groups import Parser, add_pipeline_options, add_seed
from .terminal import console, summary


def add_options(p: Parser) -> None:
    """Adds the options of ``pybubble generate`` to its parser `p`."""
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="write the pybubble.problem/1 JSON here")
    add_pipeline_options(p, "pipeline stages (the encoder has as many)")
    p.add_argument("--lanes-per-stage", type=int, default=2, metavar="N", help="encoder lanes on each stage's GPUs")
    p.add_argument("--encoder-layers", type=int, default=8, metavar="N", help="encoder layers, split over the stages")
    p.add_argument("--kernels-per-layer", type=int, default=16, metavar="N",
                   help="encoder kernels per layer and phase")
    p.add_argument("--tp-gaps-per-op", type=int, default=4, metavar="N", help="TP collectives inside each LLM action")
    p.add_argument("--encoder-scale", type=float, default=1.0, metavar="X",
                   help="multiplies every encoder kernel's duration")
    add_seed(p, "the kernel durations")


def run(args: argparse.Namespace) -> int:
    """Write a generated 1F1B problem with a ViT-like encoder."""
    from ..problem.generated import synthetic

    problem = synthetic(stages=args.stages, lanes_per_stage=args.lanes_per_stage,
                        microbatches=args.microbatches, encoder_layers=args.encoder_layers,
                        kernels_per_layer=args.kernels_per_layer, encoder_scale=args.encoder_scale,
                        tp_gaps_per_op=args.tp_gaps_per_op, seed=args.seed)
    problem.save(args.output)
    console.print(f"wrote {args.output}")
    summary("generate", tasks=problem.num_tasks, lanes=problem.num_lanes, microbatches=problem.num_microbatches,
            horizon_ms=problem.horizon / 1e3)
    return 0
