"""The examples as a user runs them: examples/own_loop.py under torchrun and examples/mllm.py on its
own ranks, on 2 CPU ranks (gloo), a few steps. Every mode trains the same model on the same data, so
the parameters after the last step agree between the modes; the report reads back."""

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.distributed

from pybubble.placement.run_report import read_report  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(*args, timeout=240) -> subprocess.CompletedProcess:
    """``python ARGS`` outside the source tree (the installed package is imported)."""
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=tempfile.gettempdir())


def test_own_loop_trains_the_same_parameters_in_every_mode():
    sums = {}
    for mode in ("megatron", "pybubble"):
        r = run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", 2, EXAMPLES / "own_loop.py",
                "--mode", mode, "--steps", 4)
        assert r.returncode == 0, r.stderr[-3000:]
        line = r.stdout.strip().splitlines()[-1]
        assert line.startswith(f"{mode}: parameters' sum ")
        sums[mode] = float(line.rsplit(" ", 1)[1])
    assert sums["pybubble"] == pytest.approx(sums["megatron"], rel=1e-9)


@pytest.mark.parametrize("data", [("--data", "fixed"), ("--data", "mix")], ids=["fixed", "mix"])
def test_the_example_trainer_reports_the_same_parameters_in_every_mode(tmp_path, data):
    reports = {}
    for mode in ("megatron", "pybubble"):
        path = tmp_path / f"{mode}.json"
        r = run(EXAMPLES / "mllm.py", "--ranks", 2, "--steps", 3, "--mode", mode, *data, "--report", path)
        assert r.returncode == 0, r.stderr[-3000:]
        (reports[mode],) = read_report(path).values()
        assert reports[mode].mode == mode and r.stdout.startswith(f"{mode}: median step ")
    for report in reports.values():
        assert len(report.doc["step_times_s"]) == 3 and report.doc["median_step_s"] > 0
        assert report.doc["data"]["layout"] and report.costs().stages == 2
    assert reports["pybubble"].doc["param_checksum"] == pytest.approx(reports["megatron"].doc["param_checksum"],
                                                                      rel=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--mode", "fast"], "error: mode: 'fast' is not one of megatron, coarse, pybubble"),
    (["--pp", 2, "--dp", 2, "--ranks", 2], "error: ranks: 2 processes, but the mesh is pp 2 x dp 2 x tp 1"),
    (["--rows", 3, "--dp", 2, "--pp", 1],
     "error: rows: 3 samples per microbatch over dp 2, 4 microbatches over pp 1: dp must divide the rows, pp at "
     "most the microbatches"),
])
def test_the_example_trainer_refuses_bad_options_in_one_line(args, message):
    r = run(EXAMPLES / "mllm.py", *args, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == message
