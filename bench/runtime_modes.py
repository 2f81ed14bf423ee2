"""Runs the example trainer (examples/mllm.py) in its three modes and prints each mode's median
step, its prediction error and its speed-ups over megatron and coarse.

The modes take turns (``--rounds`` launches per mode, megatron, coarse, pybubble, megatron, ...)
so that a change in the machine's load hits all three alike; the steps are spread over the rounds
as evenly as they go. Each launch profiles and re-plans on its own; a launch's first two steps
(profiling, first adapted plan) are left out of its figures. Medians are over the settled steps
of a mode; the prediction is the median of the runtime's per-step predictions.

    python bench/runtime_modes.py --ranks 2 --steps 24 [--rounds 3] [--encoder vit|timm|clip] [--out runtime_modes.json]
    python bench/runtime_modes.py --tp 2    # one stage tensor-parallel over the 2 ranks: the TP waits
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import mllm  # noqa: E402  (the example trainer, user code of pybubble.runtime)


def tp_line(tp: dict) -> str:
    """A launch's TP waits in a few words: the share of the gaps the encoder filled, the consumers
    delayed by a piece and the overruns among them (all ranks, settled steps)."""
    ranks = tp["per_rank"]
    return (f"; TP gaps {sum(r['gap_s'] for r in ranks) * 1e3:.1f} ms, {tp['filled_fraction']:.0%} filled, "
            f"{sum(r['delays'] for r in ranks)} delays, {sum(r['overruns'] for r in ranks)} overruns")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=24, help="steps per mode, over all rounds")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks of each stage (of the --ranks processes)")
    p.add_argument("--size", default="small")
    p.add_argument("--encoder", default="vit", help=f"{', '.join(mllm.ENCODERS)}")
    p.add_argument("--out", help="write every launch's report (JSON) here")
    a = p.parse_args(argv)
    if a.rounds < 1:
        print(f"error: rounds: {a.rounds} is not >= 1", file=sys.stderr)
        return 2
    if a.steps < 1:
        print(f"error: steps: {a.steps} is not >= 1", file=sys.stderr)
        return 2
    rounds = max(1, min(a.rounds, a.steps // 3))  # a launch's first two steps profile and adapt
    if rounds != a.rounds:
        print(f"note: {a.steps} steps per mode: {rounds} round(s), not {a.rounds} (3 steps per launch at least)")
    a.rounds = rounds
    per_round = [a.steps // rounds + (r < a.steps % rounds) for r in range(rounds)]
    reports: dict[str, list[dict]] = {mode: [] for mode in mllm.PLACEMENTS}
    t0 = time.monotonic()
    for r, steps in enumerate(per_round):
        for mode in mllm.PLACEMENTS:
            args = mllm.parse_args(["--ranks", str(a.ranks), "--steps", str(steps), "--size", a.size,
                                    "--mode", mode, "--encoder", a.encoder, "--tp", str(a.tp)])
            try:
                mllm.check_args(args)
                rep = mllm.run(args)
            except (ValueError, RuntimeError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2 if isinstance(e, ValueError) else 1
            reports[mode].append(rep)
            print(f"[{time.monotonic() - t0:6.1f} s] round {r + 1}/{a.rounds} {mode:<9} {steps} steps: median "
                  f"{rep['median_step_s'] * 1e3:.1f} ms, predicted {rep['predicted_step_s'] * 1e3:.1f} ms"
                  + (tp_line(rep["tp_waits"]) if a.tp > 1 else ""), flush=True)
    settled = {m: [r["step_times_s"][s] for r in rs for s in r["settled_steps"]] for m, rs in reports.items()}
    median = {m: statistics.median(ts) for m, ts in settled.items()}
    predicted = {m: statistics.median(p for r in rs for p in (r["predicted_steps_s"][s] for s in r["settled_steps"]))
                 for m, rs in reports.items()}
    sums = {m: rs[-1]["param_checksum"] for m, rs in reports.items()}
    print(f"{a.ranks} ranks (tp {a.tp}), encoder {a.encoder}, {a.steps} steps per mode in {a.rounds} rounds, "
          f"size {a.size}")
    print(f"{'mode':<10} {'median step':>12} {'predicted':>10} {'error':>7} {'vs megatron':>12} {'vs coarse':>10}")
    for mode in mllm.PLACEMENTS:
        err = predicted[mode] / median[mode] - 1.0
        print(f"{mode:<10} {median[mode] * 1e3:>9.1f} ms {predicted[mode] * 1e3:>7.1f} ms {err:>+7.1%} "
              f"{median['megatron'] / median[mode]:>11.2f}x {median['coarse'] / median[mode]:>9.2f}x")
    rounds_ratio = [c["median_step_s"] / p["median_step_s"] for c, p in zip(reports["coarse"], reports["pybubble"])]
    print(f"pybubble vs coarse per round: median {statistics.median(rounds_ratio):.2f}x "
          f"[{min(rounds_ratio):.2f}-{max(rounds_ratio):.2f}]")
    same = [rs[-1]["param_checksum"] for rs in reports.values()]
    spread = (max(same) - min(same)) / abs(same[0])
    print(f"parameter checksums of the last launches ({per_round[-1]} steps) agree within {spread:.1e} (relative)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"median_step_s": median, "predicted_step_s": predicted, "checksums": sums,
                       "reports": reports}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
