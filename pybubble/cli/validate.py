"""``pybubble validate``: a schedule checked against its problem, every rule of docs/formats.md."""

from __future__ import annotations

import argparse
from typing import Any

from ..problem.problem import load_problem
from ..schedule.scheduler import load_schedule
from ..schedule.validator import validate
from .option_groups import add_command
from .terminal import console, summary


def add_parser(commands: Any) -> None:
    """Adds ``validate`` and its arguments to `commands` (the subparsers)."""
    p = add_command(commands, "validate", run,
                    "Checks every rule of docs/formats.md (dependencies, windows, overlaps, F_k and B_k, step\n"
                    "time) and prints each violation. Exit code: 0 valid, 1 violations, 2 unreadable input.",
                    "pybubble validate problem.json schedule.json")
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
