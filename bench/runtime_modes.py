"""Runs the example trainer (examples/mllm.py) in its three modes and prints, per round, each
mode's median step and the speed-ups of pybubble over megatron and coarse, then the median of the
per-round speed-ups with their range and each mode's prediction error.

The modes take turns (``--rounds`` launches per mode, megatron, coarse, pybubble, megatron, ...)
so that a change in the machine's load hits all three of a round alike: a round's ratios compare
launches that ran back to back, and their median over the rounds is what a noisy machine moves
least. The steps are spread over the rounds as evenly as they go. Each launch profiles and
re-plans on its own; a launch's first two steps (profiling, first adapted plan) are left out of
its figures. The prediction is the median of the runtime's per-step predictions.

    python bench/runtime_modes.py [--ranks 2] [--steps 48] [--rounds 6] [--encoder vit|timm|clip]
        [--schedule 1f1b|interleaved_1f1b|zbv|...] [--chunks V] [--out runtime_modes.json]
    python bench/runtime_modes.py --tp 2    # one stage tensor-parallel over the 2 ranks: the TP waits
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import mllm  # noqa: E402  (the example trainer, user code of pybubble.runtime)


def round_ratios(reports: dict[str, list[dict]]) -> list[dict[str, float]]:
    """Per round: each mode's median settled step and pybubble's speed-ups over megatron and coarse."""
    out = []
    for r in range(len(reports["pybubble"])):
        med = {m: reports[m][r]["median_step_s"] for m in mllm.PLACEMENTS}
        out.append({**{f"{m}_s": med[m] for m in mllm.PLACEMENTS},
                    "vs_megatron": med["megatron"] / med["pybubble"], "vs_coarse": med["coarse"] / med["pybubble"]})
    return out


def tp_line(tp: dict) -> str:
    """A launch's TP waits in a few words: the share of the gaps the encoder filled, the consumers
    delayed with a piece in flight and the overruns among them, and the consumers' lags (median /
    90th percentile, rank 0) with a piece in flight and without (all ranks, settled steps)."""
    ranks = tp["per_rank"]
    lags = " / ".join("-" if not ranks[0].get(k) else f"{ranks[0][k][0] * 1e3:.2f}, {ranks[0][k][1] * 1e3:.2f} ms"
                      for k in ("lag_s", "lag_free_s"))
    return (f"; TP gaps {sum(r['gap_s'] for r in ranks) * 1e3:.1f} ms, {tp['filled_fraction']:.0%} filled, "
            f"{sum(r.get('delays', 0) for r in ranks)} delays, {sum(r.get('overruns', 0) for r in ranks)} overruns, "
            f"lag with a piece / without {lags}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=48, help="steps per mode, over all rounds")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks of each stage (of the --ranks processes)")
    p.add_argument("--size", default="small")
    p.add_argument("--encoder", default="vit", help=f"{', '.join(mllm.ENCODERS)}")
    p.add_argument("--schedule", default="1f1b", help=f"the pipeline schedule: {', '.join(mllm.SCHEDULES)}")
    p.add_argument("--chunks", type=int, default=0, help="stages per rank (default: the schedule's)")
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
                                    "--mode", mode, "--encoder", a.encoder, "--schedule", a.schedule,
                                    "--chunks", str(a.chunks), "--tp", str(a.tp)])
            try:
                mllm.check_args(args)
                rep = mllm.run(args)
            except (ValueError, RuntimeError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2 if isinstance(e, ValueError) else 1
            reports[mode].append(rep)
            print(f"[{time.monotonic() - t0:6.1f} s] round {r + 1}/{a.rounds} {mode:<9} {steps} steps: median "
                  f"{rep['median_step_s'] * 1e3:.1f} ms, predicted {rep['predicted_step_s'] * 1e3:.1f} ms, "
                  f"overruns {sum(rep['overruns'])}" + (tp_line(rep["tp_waits"]) if a.tp > 1 else ""), flush=True)
        ratios = round_ratios({m: rs[r:r + 1] for m, rs in reports.items()})[0]
        load = os.getloadavg()[0]
        print(f"round {r + 1}: pybubble {ratios['vs_megatron']:.2f}x megatron, {ratios['vs_coarse']:.2f}x coarse "
              f"(load {load:.2f})", flush=True)
    rounds_out = round_ratios(reports)
    settled = {m: [r["step_times_s"][s] for r in rs for s in r["settled_steps"]] for m, rs in reports.items()}
    median = {m: statistics.median(ts) for m, ts in settled.items()}
    predicted = {m: statistics.median(p for r in rs for p in (r["predicted_steps_s"][s] for s in r["settled_steps"]))
                 for m, rs in reports.items()}
    sums = {m: rs[-1]["param_checksum"] for m, rs in reports.items()}
    print(f"{a.ranks} ranks (tp {a.tp}), schedule {a.schedule} ({mllm.chunks_of(args)} stage(s) per rank), "
          f"encoder {a.encoder}, {a.steps} steps per mode in {a.rounds} rounds, size {a.size}")
    print(f"{'round':<6} {'megatron':>10} {'coarse':>10} {'pybubble':>10} {'vs megatron':>12} {'vs coarse':>10}")
    for r, x in enumerate(rounds_out):
        print(f"{r + 1:<6} {x['megatron_s'] * 1e3:>7.1f} ms {x['coarse_s'] * 1e3:>7.1f} ms {x['pybubble_s'] * 1e3:>7.1f} ms "
              f"{x['vs_megatron']:>11.2f}x {x['vs_coarse']:>9.2f}x")
    summary = {}
    for key in ("vs_megatron", "vs_coarse"):
        values = [x[key] for x in rounds_out]
        summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    print(f"pybubble per round: median {summary['vs_megatron']['median']:.2f}x megatron "
          f"[{summary['vs_megatron']['min']:.2f}-{summary['vs_megatron']['max']:.2f}], "
          f"median {summary['vs_coarse']['median']:.2f}x coarse "
          f"[{summary['vs_coarse']['min']:.2f}-{summary['vs_coarse']['max']:.2f}]")
    print(f"{'mode':<10} {'median step':>12} {'predicted':>10} {'error':>7} {'overruns':>9}")
    for mode in mllm.PLACEMENTS:
        err = predicted[mode] / median[mode] - 1.0
        overruns = sum(sum(r["overruns"]) for r in reports[mode])
        print(f"{mode:<10} {median[mode] * 1e3:>9.1f} ms {predicted[mode] * 1e3:>7.1f} ms {err:>+7.1%} {overruns:>9}")
    same = [rs[-1]["param_checksum"] for rs in reports.values()]
    spread = (max(same) - min(same)) / abs(same[0])
    print(f"parameter checksums of the last launches ({per_round[-1]} steps) agree within {spread:.1e} (relative)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"median_step_s": median, "predicted_step_s": predicted, "checksums": sums,
                       "rounds": rounds_out, "per_round": summary, "reports": reports}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
