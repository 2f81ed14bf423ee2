"""Launching the test trainer: one configuration (``python -m pybubble.testing.mllm ARGS``, or under
torchrun), or several in turn on the same ranks (``--runs RUNS.json``: a list of command lines of the
same world size, device and timeout, each configuration its own mesh, models and runtime from the
seed, its own report), as the tests and ``bench/`` drive it; the run's report
(``pybubble.runtime_report/3``, :func:`pybubble.placement.run_report.run_report`) with the
single-process reference's checksum when asked."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ...placement.run_report import run_report
from ...runtime import exit_rank, launch, run_rank
from ...runtime.cuda import serialised_streams_note
from .model import PACKED_KINDS
from .job import backend, check_args, chunks_of, config, mode_args, parse_args, planning_config
from .trainer import train
from .unsplit import reference_checksum, reference_varying


def report(args: argparse.Namespace, every: list[dict]) -> dict:
    """One mode's report of the run (``args`` with that mode) from every rank's figures."""
    run = {"mode": args.mode, "encoder": args.encoder, "ranks": args.ranks, "schedule": args.schedule,
           "chunks": chunks_of(args), "pp": args.pp, "dp": args.dp, "dp_wrap": args.dp_wrap if args.dp > 1 else None,
           "launcher": "torchrun" if args.torchrun else "launch", "size": args.size, "device": args.device}
    return run_report(every, run, tp=args.tp, one_clock=args.device != "cuda",
                      chunk_tiles=None if args.data == "fixed" else 1 if args.encoder in PACKED_KINDS
                      else config(args).chunk_tiles)


def finish(args: argparse.Namespace, figures: dict[str, list[dict]]) -> dict:
    """The report, with the single-process reference's checksum when asked (computed once): one
    mode's, or with several a dict of each mode's report by mode."""
    reference = None
    if args.reference:
        reference = (reference_checksum(config(args), args.pp, args.steps, args.encoder) if args.data == "fixed"
                     else reference_varying(args, config(args)))
    out = {}
    for mode, every in figures.items():
        out[mode] = report(mode_args(args, mode), every)
        if reference is not None:
            out[mode]["reference_checksum"] = reference
    return out if len(args.modes) > 1 else out[args.mode]


def launch_job(args: argparse.Namespace) -> dict:
    """Launches the ranks (pybubble.runtime.launch) and returns the report (raises
    ``RuntimeError`` when a rank failed)."""
    return finish(args, launch(train, args.ranks, args, backend=backend(args), timeout=args.timeout))


def write_report(args: argparse.Namespace, out: dict) -> None:
    """Writes the report to ``--report`` (when given) and one line per mode on stdout."""
    if args.report:
        with open(args.report, "w") as f:
            json.dump(out, f, indent=1)
    for rep in out.values() if len(args.modes) > 1 else [out]:
        print(f"{rep['mode']} ({args.encoder}): median step {rep['median_step_s'] * 1e3:.1f} ms, predicted "
              f"{rep['predicted_step_s'] * 1e3:.1f} ms, param_checksum {rep['param_checksum']:.9g}")


def main(argv: list[str] | None = None) -> int:
    """The trainer's command: one configuration; ``--runs RUNS.json`` several in one launch
    (:func:`main_runs`). Exit status 2 with one ``error:`` line for bad options."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--runs"]:
        return main_runs(argv[1])
    args = parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        if not args.torchrun or os.environ.get("RANK") == "0":
            print(f"error: {e}", file=sys.stderr)
        return 2
    if args.write_config:
        import yaml

        with open(args.write_config, "w") as f:
            yaml.safe_dump(planning_config(args), f, sort_keys=False)
        print(f"wrote {args.write_config}")
        return 0
    if args.device == "cuda" and (note := serialised_streams_note()):
        print(f"note: {note}", file=sys.stderr)
    if args.torchrun:  # this process is one rank; torchrun ends the others when one fails
        every = run_rank(train, args, backend=backend(args), timeout=args.timeout)
        if every is not None:
            write_report(args, finish(args, every))
        exit_rank(0)  # no interpreter finalization beside torch's leftover gloo threads (exit_rank)
    try:
        out = launch_job(args)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_report(args, out)
    return 0


def train_all(rank: int, runs: list) -> list | None:
    """Each configuration's training (:func:`~pybubble.testing.mllm.trainer.train`) in turn on this
    rank; rank 0 returns each one's figures. Rank 0 names each configuration on stderr before
    training it, so that a failure names the configuration it happened in."""
    every = []
    for argv, args in runs:
        if rank == 0:
            print(f"runs: {' '.join(argv)}", file=sys.stderr, flush=True)
        every.append(train(rank, args))
    return every if rank == 0 else None


def main_runs(path: str) -> int:
    """Several configurations in one launch: ``path``, a JSON list of command lines (each with
    ``--report``), all of the same world size, device and timeout."""
    argvs = json.loads(Path(path).read_text())
    runs = [(argv, parse_args(argv)) for argv in argvs]
    first = runs[0][1]
    try:
        for argv, args in runs:
            check_args(args)
            if (args.ranks, args.device, args.timeout) != (first.ranks, first.device, first.timeout):
                raise ValueError(f"runs: {' '.join(argv)}: not the ranks, device and timeout of the first "
                                 "configuration (one launch trains them all)")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if first.torchrun:  # this process is one rank; torchrun ends the others when one fails
        every = run_rank(train_all, runs, backend=backend(first), timeout=first.timeout)
    else:
        try:
            every = launch(train_all, first.ranks, runs, backend=backend(first), timeout=first.timeout)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    for (_, args), figures in zip(runs, every or ()):
        write_report(args, finish(args, figures))
    if first.torchrun:
        exit_rank(0)  # as a single configuration's ranks end (main)
    return 0


__all__ = ["finish", "main", "main_runs", "report", "launch_job", "train_all", "write_report"]
