"""The calibration loop on the test trainer (pybubble.testing.mllm; docs/calibration.md): profile one step of the
megatron mode at one microbatch count, fit the cost model to it (``pybubble calibrate --trace``),
predict every mode at another microbatch count with ``pybubble plan`` on the calibrated config,
and launch each mode there to compare; the what-if of the profiled step against pybubble's measured
step at the profiled count.

Launches take turns (megatron, coarse, pybubble, megatron, ...) so that a change in the machine's
load hits every mode alike; a launch's figure is its report's median over its settled steps, a
mode's figure the median of its launches.

    python bench/calibration_loop.py [--ranks 2] [--fit-microbatches 4] [--microbatches 8] [--launches 3] [--steps 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("megatron", "coarse", "pybubble")


def trainer(*args: str) -> str:
    """Runs the test trainer; its stdout (a failure stops the loop)."""
    r = subprocess.run([sys.executable, "-m", "pybubble.testing.mllm", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: pybubble.testing.mllm {' '.join(args)}: {r.stderr.strip().splitlines()[-1]}")
    return r.stdout


def pybubble(*args: str) -> str:
    """Runs a pybubble command; its stdout."""
    r = subprocess.run([sys.executable, "-m", "pybubble", *args], capture_output=True, text=True, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise SystemExit(f"error: pybubble {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def fields(line: str) -> dict[str, str]:
    """The key=value pairs of a command's summary line."""
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2")
    p.add_argument("--fit-microbatches", default="4", help="microbatches of the profiled step")
    p.add_argument("--microbatches", default="8", help="microbatches of the predicted and measured steps")
    p.add_argument("--launches", type=int, default=3, help="launches per mode and microbatch count")
    p.add_argument("--steps", default="6", help="steps per launch (the first two are left out)")
    p.add_argument("--out", help="keep the traces, configs, calibration and reports in this folder")
    a = p.parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="calibration_loop"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    fit_cfg, cfg, prof, calib = out / "fit.yaml", out / "predict.yaml", out / "prof", out / "calib.json"
    base = ["--ranks", a.ranks]
    trainer(*base, "--microbatches", a.fit_microbatches, "--write-config", str(fit_cfg))
    trainer(*base, "--microbatches", a.microbatches, "--write-config", str(cfg))
    trainer(*base, "--microbatches", a.fit_microbatches, "--steps", a.steps, "--mode", "megatron", "--profile",
            str(prof), "--report", str(out / "profiled.json"))
    fit = pybubble("calibrate", "--trace", str(prof), "--config", str(fit_cfg), "-o", str(calib))
    print(fit.rstrip())
    text = cfg.read_text().replace("  gpu: cpu\n", f"  gpu: cpu\n  calibration: {calib.name}\n")
    cfg.write_text(text)
    planned = pybubble("plan", str(cfg))
    predicted = {m: float(next(line for line in planned.splitlines() if line.startswith(m + " ")).split()[1]
                          .replace(",", "")) for m in MODES}
    what_if = fields(pybubble("measure", str(prof), "--what-if", str(fit_cfg)).strip().splitlines()[-1])
    measured: dict[tuple[str, str], list[float]] = {}
    for i in range(a.launches):
        for mb in (a.microbatches, a.fit_microbatches):
            for mode in MODES if mb == a.microbatches else ("pybubble",):
                report = out / f"{mode}_{mb}_{i}.json"
                trainer(*base, "--microbatches", mb, "--steps", a.steps, "--mode", mode, "--report", str(report))
                ms = json.loads(report.read_text())["median_step_s"] * 1e3
                measured.setdefault((mode, mb), []).append(ms)
                print(f"[{time.monotonic() - t0:6.1f} s] {mode:<9} {mb} microbatches, launch {i + 1}: {ms:.1f} ms",
                      flush=True)
    print(f"\npredicted at {a.microbatches} microbatches from the {a.fit_microbatches}-microbatch megatron trace, "
          f"against the median of {a.launches} launches (each launch's median step):")
    rows = {}
    for mode in MODES:
        runs = measured[(mode, a.microbatches)]
        med = statistics.median(runs)
        rows[mode] = {"predicted_ms": predicted[mode], "measured_ms": med, "launches_ms": runs,
                      "error": predicted[mode] / med - 1}
        print(f"  {mode:<9} predicted {predicted[mode]:8.1f} ms, measured {med:8.1f} ms "
              f"({', '.join(f'{x:.1f}' for x in runs)}): {predicted[mode] / med - 1:+.1%}")
    runs = measured[("pybubble", a.fit_microbatches)]
    pb = float(what_if["pybubble_ms"])
    print(f"what-if on the {a.fit_microbatches}-microbatch trace: measured {float(what_if['measured_ms']):.1f} ms "
          f"(its layout predicted {float(what_if['predicted_ms']):.1f} ms), pybubble predicted {pb:.1f} ms, "
          f"measured {statistics.median(runs):.1f} ms ({', '.join(f'{x:.1f}' for x in runs)}): "
          f"{pb / statistics.median(runs) - 1:+.1%}; {float(what_if['hidden']):.1%} of the encoder hidden")
    (out / "loop.json").write_text(json.dumps({"modes": rows, "what_if": what_if, "what_if_measured_ms": runs,
                                               "calibration": json.loads(calib.read_text())}, indent=1))
    print(f"wrote {out / 'loop.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
