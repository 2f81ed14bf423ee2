"""Runs the example trainer in its three modes and prints each mode's median step, its speed-up
over megatron and its prediction error.

The modes take turns (``--rounds`` launches of ``steps / rounds`` steps each, megatron, coarse,
pybubble, megatron, ...) so that a change in the machine's load hits all three alike; each
launch profiles its costs and predicts its step anew. Medians are over all steps of a mode.

    python bench/runtime_modes.py --ranks 2 --steps 20 [--rounds 4] [--out runtime_modes.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from pybubble.examples import mllm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="steps per mode, over all rounds")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--size", default="small")
    p.add_argument("--out", help="write every launch's report (JSON) here")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.steps % a.rounds:
        print(f"error: rounds: {a.rounds} does not divide steps {a.steps}", file=sys.stderr)
        return 2
    reports: dict[str, list[dict]] = {mode: [] for mode in mllm.MODES}
    for _ in range(a.rounds):
        for mode in mllm.MODES:
            args = mllm.parse_args(["--ranks", str(a.ranks), "--steps", str(a.steps // a.rounds), "--size", a.size,
                                    "--mode", mode])
            mllm.check_args(args)
            reports[mode].append(mllm.launch(args))
    median = {m: statistics.median(t for r in rs for t in r["step_times_s"]) for m, rs in reports.items()}
    predicted = {m: statistics.median(r["predicted_step_s"] for r in rs) for m, rs in reports.items()}
    sums = {m: rs[-1]["param_checksum"] for m, rs in reports.items()}
    print(f"{a.ranks} ranks, {a.steps} steps per mode in {a.rounds} rounds, size {a.size}")
    print(f"{'mode':<10} {'median step':>12} {'predicted':>10} {'error':>7} {'vs megatron':>12} {'checksum':>16}")
    for mode in mllm.MODES:
        err = predicted[mode] / median[mode] - 1.0
        print(f"{mode:<10} {median[mode] * 1e3:>9.1f} ms {predicted[mode] * 1e3:>7.1f} ms {err:>+7.1%} "
              f"{median['megatron'] / median[mode]:>11.2f}x {sums[mode]:>16.9f}")
    spread = (max(sums.values()) - min(sums.values())) / abs(sums["megatron"])
    print(f"checksums agree within {spread:.1e} (relative)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"median_step_s": median, "predicted_step_s": predicted, "reports": reports}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
