"""Checks every rule of docs/formats.md (dependencies, windows, overlaps, F_k and B_k, step
time) and prints each violation. Exit code: 0 valid, 1 violations, 2 unreadable input.

example:
  pybubble validate problem.json schedule.json
"""

from __future__ import annotations

import argparse

from ..problem.problem import load_problem
from ..schedule.scheduler import load_schedule
from ..schedule.validator import validate
from .option_groups import Parser
from .terminal import console, summary


def add_options(p: Parser) -> None:
    """Adds the arguments of ``pybubble validate`` to its parser `p`."""
    p.add_argument("problem", help="a pybubble.problem/1 JSON file")
    p.add_argument("schedule", help="a pybubble.schedule/1 JSON file for that problem")


def run(args: argparse.Namespace) -> int:
    """Check a schedule against its problem; exit code 1 when it breaks any rule."""
    problem = load_problem(args.problem)
    violations = validate(problem, load_schedule(args.schedule))
    for v in violations:
        console.print(v)
    summary("validate", valid="yes" if not violations else "no", violations=len(violations))
    return 1 if violations else 0
