"""Calibration on the CPU at tiny shapes (a second or two), and the kernels / calibrate commands."""

import json

import pytest

from pybubble import presets
from pybubble.cli import main
from pybubble.costs.roofline import CostModel

TINY = ((1, 16, 32, 2), (1, 32, 64, 2), (1, 64, 64, 4))


def test_calibrate_fits_every_kind_and_the_cost_model_loads_it(tmp_path):
    pytest.importorskip("torch")
    from pybubble.costs.calibration import FIT_X, calibrate, error_table

    doc = calibrate("cpu", shapes=TINY, repeats=2)
    assert doc["format"] == "pybubble.calibration/1" and set(doc["kinds"]) == set(FIT_X)
    assert all(s["measured_us"] > 0 and s["predicted_us"] > 0 for s in doc["samples"])
    assert {s["fit"] for s in doc["samples"]} == {True, False}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    cm = CostModel("cpu", calibration=path)
    assert cm.hardware.peak_flops == doc["peak_flops"]
    table = error_table(doc)
    assert "| gemm |" in table and "held out" in table
    with pytest.raises(ValueError, match="device: 'tpu'"):
        calibrate("tpu")
    with pytest.raises(ValueError, match="held_out: 3"):
        calibrate("cpu", shapes=TINY, held_out=3)


def test_calibrate_command_writes_both_files(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import pybubble.costs.calibration as calibration

    monkeypatch.setattr(calibration, "CPU_SHAPES", TINY)
    out, errors = tmp_path / "c.json", tmp_path / "c.md"
    assert main(["calibrate", "--device", "cpu", "--repeats", "2", "-o", str(out), "--errors", str(errors)]) == 0
    assert json.loads(out.read_text())["format"] == "pybubble.calibration/1"
    assert errors.read_text().startswith("# Calibration errors")


def test_kernels_command_prints_the_table(capsys):
    assert main(["kernels", "vit-22b", "--micro-batch", "2", "--tp", "8", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    for word in ("qkv_gemm", "fc1_wgrad", "attn_all_reduce", "compute", "memory", "GFLOP"):
        assert word in out
    assert main(["kernels", "llama-70b", "--tp", "8", "--sequence-parallel", "--seq-len", "4096"]) == 0
    assert "reduce_scatter" in capsys.readouterr().out
    assert main(["kernels", "vit-99b"]) == 2
    assert "unknown preset 'vit-99b'" in capsys.readouterr().err
    assert main(["kernels", "vit-22b", "--gpu", "tpu"]) == 2


def test_committed_cpu_calibration_loads():
    from pathlib import Path

    path = Path(__file__).parent.parent / "bench" / "results" / "calibration_cpu.json"
    if not path.exists():
        pytest.skip("no committed calibration next to the tests")
    cm = CostModel("cpu", calibration=path)
    assert cm.layer_time(presets.encoder("vit-l-14"), 1, 257) > 0
