"""The parts of the command line that several commands share: the parser and its help format, a
command's subparser, and the option groups more than one command takes (the planning config, the
output files --json, --plot, --trace and --window, the pipeline's --stages and --microbatches, the
--seed). The data options (--data, --data-file) belong to the library: :mod:`pybubble.data.sources`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..config.checks import interval


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


def add_command(commands: Any, command: ModuleType) -> Parser:
    """The subcommand of `commands` (the subparsers) that the module `command` of this package is: named
    after the module, its help line is the docstring of the module's ``run``, and the rest of its help
    the module's docstring, a description then the ``example:`` paragraph (the epilog). Parsing it
    sets ``args.func`` to ``run``."""
    run: Callable[[argparse.Namespace], int] = command.run
    summary_line = (run.__doc__ or "").strip()
    about, _, example = (command.__doc__ or "").strip().partition("\n\nexample:\n")
    p = commands.add_parser(command.__name__.rpartition(".")[2],
                            help=summary_line[0].lower() + summary_line[1:].rstrip("."),
                            description=f"{summary_line}\n\n{about}", epilog=f"example:\n{example}",
                            formatter_class=HelpFormatter)
    p.set_defaults(func=run)
    return p


def add_config(parser: argparse.ArgumentParser, help: str) -> None:
    """The planning config (YAML), the positional ``config`` (read by
    :func:`pybubble.config.schema.load_config`)."""
    parser.add_argument("config", help=help)


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    """``--json FILE``: write `what` here."""
    parser.add_argument("--json", metavar="FILE", help=f"write {what} here")


def add_plot(parser: argparse.ArgumentParser, chart: str) -> None:
    """``--plot FILE``: write `chart` here (.png or .svg)."""
    parser.add_argument("--plot", metavar="FILE", help=f"write {chart} here (.png or .svg)")


def add_seed(parser: argparse.ArgumentParser, drawn: str) -> None:
    """``--seed N`` (default 0): the seed of what the command draws at random (`drawn`)."""
    parser.add_argument("--seed", type=int, default=0, metavar="N", help=f"seed of {drawn}")


def add_picture_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--trace, --plot and --window of a command that simulates a step (`what`: the step drawn)."""
    parser.add_argument("--trace", metavar="FILE", help=f"write {what} as a Chrome trace (open in ui.perfetto.dev)")
    add_plot(parser, f"a Gantt chart of {what}")
    parser.add_argument("--window", metavar="START:END",
                        help="draw only this part of the step in --plot: ms from the step's start, e.g. 100:250")


def window_us(text: str | None, plot: str | None) -> tuple[float, float] | None:
    """``--window START:END`` (ms) as (start, end) in us; an error without ``--plot``."""
    if text is None:
        return None
    if not plot:
        raise ValueError("window: draws a part of --plot; give --plot too")
    start, end = interval(text, "window")
    return start * 1e3, end * 1e3


def add_pipeline_options(parser: argparse.ArgumentParser, stages: str) -> None:
    """--stages (described as `stages`) and --microbatches, as `bubbles` and `generate` take them."""
    parser.add_argument("--stages", type=int, default=4, metavar="N", help=stages)
    parser.add_argument("--microbatches", type=int, default=8, metavar="N", help="microbatches per step")
