"""Places every encoder task of a pybubble.problem/1 file (docs/formats.md) into its lane's free
windows with the C++ scheduler, and prints the step it gives.

example:
  pybubble generate -o problem.json && pybubble schedule problem.json -o schedule.json
"""

from __future__ import annotations

import argparse
import time

from ..problem.problem import load_problem
from ..schedule.scheduler import POLICIES, schedule_problem
from .option_groups import Parser
from .terminal import console, in_ms, summary, table


def add_options(p: Parser) -> None:
    """Adds the options of ``pybubble schedule`` to its parser `p`."""
    p.add_argument("problem", help="a pybubble.problem/1 JSON file")
    p.add_argument("-o", "--output", metavar="FILE", help="write the schedule (pybubble.schedule/1 JSON) here")
    p.add_argument("--policy", choices=POLICIES, default="greedy",
                   help="greedy: fill the bubbles kernel by kernel (Optimus's fine-grained schedule); "
                        "coarse: every encoder forward before the LLM's step, every backward after it")


def run(args: argparse.Namespace) -> int:
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
    t.add_row("LLM step alone (horizon)", in_ms(problem.horizon))
    t.add_row(f"step with the encoder ({args.policy})", in_ms(sched.step_time))
    t.add_row("grows before / after", f"{in_ms(sched.shift_front)} / {in_ms(sched.shift_back)}")
    t.add_row("encoder compute in bubbles", f"{hidden:.1%}")
    t.add_row("scheduling took", f"{took * 1e3:,.3f} ms")
    console.print(t)
    if args.output:
        console.print(f"wrote {args.output}")
    summary("schedule", step_ms=sched.step_time / 1e3, horizon_ms=problem.horizon / 1e3, hidden=hidden,
            took_ms=took * 1e3)
    return 0
