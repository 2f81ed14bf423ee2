"""One launch of the example trainer (examples/mllm.py) that trains several configurations in
turn: the same ranks and default process group (started by pybubble.runtime.launch, or by
torchrun), each configuration its own mesh, models and runtime from the seed (mllm.train), its own
report (mllm.finish, mllm.write_report: the JSON the command writes with ``--report``).

    python tests/example_launch.py RUNS.json
    python -m torch.distributed.run --standalone --nproc-per-node N tests/example_launch.py RUNS.json

RUNS.json: a list of command lines of examples/mllm.py (each with ``--report``), all of the same
world size, device and timeout. Rank 0 prints each configuration's command line on stderr before
training it, so that a failure names the configuration it happened in. The tests' fixtures
(conftest.py's example_reports, test_runtime_torchrun.py's) write RUNS.json and read the reports."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # also in the spawned ranks

import mllm  # noqa: E402  (the example trainer, user code of pybubble.runtime)
from pybubble.runtime import exit_rank, launch, run_rank  # noqa: E402


def train_all(rank: int, runs: list) -> list | None:
    """Each configuration's training (mllm.train) in turn on this rank; rank 0 returns each one's
    figures."""
    every = []
    for argv, args in runs:
        if rank == 0:
            print(f"example_launch: {' '.join(argv)}", file=sys.stderr, flush=True)
        every.append(mllm.train(rank, args))
    return every if rank == 0 else None


def main(path: str) -> int:
    argvs = json.loads(Path(path).read_text())
    runs = [(argv, mllm.parse_args(argv)) for argv in argvs]
    first = runs[0][1]
    try:
        for argv, args in runs:
            mllm.check_args(args)
            if (args.ranks, args.device, args.timeout) != (first.ranks, first.device, first.timeout):
                raise ValueError(f"runs: {' '.join(argv)}: not the ranks, device and timeout of the first "
                                 "configuration (one launch trains them all)")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if first.torchrun:  # this process is one rank; torchrun ends the others when one fails
        every = run_rank(train_all, runs, backend=mllm.backend(first), timeout=first.timeout)
    else:
        try:
            every = launch(train_all, first.ranks, runs, backend=mllm.backend(first), timeout=first.timeout)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    for (_, args), figures in zip(runs, every or ()):
        mllm.write_report(args, mllm.finish(args, figures))
    if first.torchrun:
        exit_rank(0)  # as the example's own ranks end (mllm.main)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
