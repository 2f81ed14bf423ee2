"""The ``pybubble`` command line.

Each command is a module of this package, named after it: its docstring is the rest of the
command's ``--help`` (a description, then an ``example:`` paragraph), ``add_options(p)`` adds its
options to its parser, and ``run(args) -> int`` runs it (its docstring is the command's help line).
The options several commands share are in :mod:`~pybubble.cli.option_groups` (the data options in
:mod:`pybubble.data.sources`), what they print with in :mod:`~pybubble.cli.terminal`. A command's
tables fit the terminal's width, anything over a couple of seconds shows progress on stderr, and the
last line on stdout is one summary line for scripts: ``<command>: key=value ...``. Bad input ends
with exit code 2 and one line ``error: ...`` on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from . import bubbles, calibrate, dynamic, generate, kernels, measure, plan, schedule, validate
from .option_groups import HelpFormatter, Parser, add_command

COMMANDS = (plan, bubbles, schedule, validate, generate, kernels, calibrate, dynamic, measure)
"""The commands' modules, in the order ``pybubble --help`` lists them."""
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = Parser(prog="pybubble", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"pybubble {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for command in COMMANDS:
        command.add_options(add_command(commands, command))
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
