"""The example trainer as real processes (tiny models, two ranks, a few steps)."""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")


def mllm(*args, timeout=120):
    # Run outside the source tree so that the installed package (with its extension) is imported.
    return subprocess.run([sys.executable, "-m", "pybubble.examples.mllm", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=Path(tempfile.gettempdir()))


def test_three_modes_reach_the_single_process_parameters(tmp_path):
    sums = {}
    for mode in ("megatron", "coarse", "pybubble"):
        out = tmp_path / f"{mode}.json"
        extra = ["--reference"] if mode == "pybubble" else []
        r = mllm("--ranks", 2, "--steps", 3, "--size", "tiny", "--mode", mode, "--report", out, "--timeout", 30, *extra)
        assert r.returncode == 0, r.stderr
        report = json.loads(out.read_text())
        assert len(report["step_times_s"]) == 3 and report["median_step_s"] > 0 and report["predicted_step_s"] > 0
        sums[mode] = report["param_checksum"]
    reference = report["reference_checksum"]
    for mode, s in sums.items():
        assert s == pytest.approx(reference, rel=1e-6), mode


def test_a_failing_rank_ends_every_rank_within_the_timeout():
    t = time.monotonic()
    r = mllm("--ranks", 2, "--steps", 3, "--size", "tiny", "--mode", "pybubble", "--fail-rank", 1, "--fail-step", 1,
             "--timeout", 10)
    assert r.returncode == 1
    assert "rank 1: error: RuntimeError: injected fault on rank 1 at step 1" in r.stderr
    assert "rank 0: error:" in r.stderr  # the other rank ended with an error, not a hang
    assert r.stderr.strip().splitlines()[-1].startswith("error: training failed (rank 0 exit 1, rank 1 exit 1)")
    assert time.monotonic() - t < 60


@pytest.mark.parametrize("args, message", [
    (["--mode", "fast"], "error: mode: 'fast' is not one of megatron, coarse, pybubble"),
    (["--ranks", 1], "error: ranks: 1 is not >= 2"),
    (["--size", "huge"], "error: size: 'huge' is not one of small, tiny"),
    (["--fail-rank", 5], "error: fail_rank: 5 is not a rank (< 2)"),
])
def test_bad_arguments_exit_2_with_one_line(args, message):
    r = mllm(*args)
    assert r.returncode == 2
    assert r.stderr.strip() == message
