"""Runs the test trainer (pybubble.testing.mllm) in its three modes and prints, per round, each
mode's median step and the speed-ups of pybubble over megatron and coarse, then the median of the
per-round speed-ups with their range and each mode's prediction error.

Each launch runs the same steps (with varying data, the same samples), so a round compares the
modes on the same work two ways: by the median step, and by the settled steps' total (the
throughput: with varying data the heavy steps, where balancing saves the most, count by their time;
the median step is that of a middling batch).

The modes take turns (``--rounds`` launches per mode, megatron, coarse, pybubble, megatron, ...)
so that a change in the machine's load hits all three of a round alike: a round's ratios compare
launches that ran back to back, and their median over the rounds is what a noisy machine moves
least. The steps are spread over the rounds as evenly as they go. Each launch profiles and
re-plans on its own; a launch's first two steps (profiling, first adapted plan) are left out of
its figures. The prediction is the median of the runtime's per-step predictions.

    python bench/runtime_modes.py [--ranks 2] [--steps 48] [--rounds 6] [--encoder vit|timm|clip]
        [--schedule 1f1b|interleaved_1f1b|zbv|...] [--chunks V] [--piece-ms MS] [--out runtime_modes.json]
    python bench/runtime_modes.py --tp 2    # one stage tensor-parallel over the 2 ranks: the TP waits
    python bench/runtime_modes.py --data mix [--data-file FILE] [--dp 2 --pp 1]
    python bench/runtime_modes.py --encoder qwen2_5_vl --data mix [--chunk-patches N]   # native resolution

With varying data (``--data mix`` or ``--data-file``) a fourth launch per round runs pybubble
with ``--balance off`` (``unbalanced``: re-planned every step, the samples as given, each replica
its own): pybubble over it is balancing's share of the gain, it over coarse filling's. It also
prints each mode's work bound (:func:`work_bound_s`: every rank of the busiest replica busy all step
with the encoder chunks that mode ran, at the costs it measured) and the ratios pybubble would reach
at its bound: how far the measured ones can go on this data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import pybubble.testing.mllm as mllm  # noqa: E402  (the test trainer: pybubble's launcher of the runtime in its modes)


UNBALANCED = "unbalanced"
"""pybubble with ``--balance off`` (varying data only)."""


def settled_total_s(report: dict) -> float:
    """A launch's settled steps' seconds summed: every launch of a round runs the same steps' samples,
    so with varying data this is the time each took for the same work (its throughput)."""
    return sum(report["step_times_s"][s] for s in report["settled_steps"])


def round_ratios(reports: dict[str, list[dict]]) -> list[dict[str, float]]:
    """Per round: each variant's median settled step and pybubble's speed-ups over the others, by
    the median step (``vs_*``) and by the settled steps' total (``total_vs_*``: with varying data
    the steps differ, and the heavy ones, where balancing saves the most, weigh in by their time)."""
    out = []
    for r in range(len(reports["pybubble"])):
        med = {m: reports[m][r]["median_step_s"] for m in reports}
        total = {m: settled_total_s(reports[m][r]) for m in reports}
        out.append({**{f"{m}_s": med[m] for m in reports}, **{f"{m}_total_s": total[m] for m in reports},
                    **{f"vs_{m}": med[m] / med["pybubble"] for m in reports if m != "pybubble"},
                    **{f"total_vs_{m}": total[m] / total["pybubble"] for m in reports if m != "pybubble"}})
    return out


def work_bound_s(report: dict, step: int) -> float | None:
    """A lower bound of a launch's step ``step`` (varying data, tp 1; None otherwise): every rank of
    the busiest replica busy the whole step with an even share of the LLM's stages and of the encoder
    chunks its replica ran (a rank of a pipeline may run any of its replica's chunks, none of another
    replica's), plus what follows the pipeline as the runtime's prediction counts it (gradient sum,
    optimizer and the step's other work outside the pipeline), at the launch's measured costs."""
    data, c = report.get("data"), report["costs"]
    if not data or report["tp"] != 1:
        return None
    chunk_s = sum(c["piece_fwd_s"]) + sum(c["piece_bwd_s"])
    slots = len(data["chunks"][0][step])
    llm_s = slots * (sum(c["stage_fwd_s"]) + sum(c["stage_bwd_s"]))
    encoder_s = max(sum(rank[step]) for rank in data["chunks"]) * chunk_s
    after_s = (0.0 if report["mode"] == "megatron" else c["grad_sync_s"]) + c["optimizer_s"]
    return (llm_s + encoder_s) / report["pp"] + after_s


def variants(data: str) -> list[tuple[str, str, str]]:
    """(name, mode, --balance) of each launch of a round."""
    out = [(m, m, "on") for m in mllm.PLACEMENTS]
    return out if data == "fixed" else out + [(UNBALANCED, "pybubble", "off")]


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
    p.add_argument("--encoder", default="vit", help=f"{', '.join(mllm.ENCODER_KINDS)}")
    p.add_argument("--schedule", default="1f1b", help=f"the pipeline schedule: {', '.join(mllm.TORCH_SCHEDULES)}")
    p.add_argument("--chunks", type=int, default=0, help="stages per rank (default: the schedule's)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas (of the --ranks processes)")
    p.add_argument("--pp", type=int, default=0, help="pipeline stages (default: ranks / dp / tp)")
    p.add_argument("--data", default="fixed", help="fixed or mix (the trainer's --data)")
    p.add_argument("--data-file", help="replay these samples (JSON lines, the trainer's --data-file)")
    p.add_argument("--chunk-patches", type=int, default=0,
                   help="native-resolution encoders: patches of a chunk (the trainer's --chunk-patches; default the size's)")
    p.add_argument("--piece-ms", type=float, help="pybubble's pieces (the trainer's --piece-ms; default automatic)")
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
    data = "file" if a.data_file else a.data
    reports: dict[str, list[dict]] = {name: [] for name, _, _ in variants(data)}
    t0 = time.monotonic()
    for r, steps in enumerate(per_round):
        for name, mode, balance in variants(data):
            args = mllm.parse_args(["--ranks", str(a.ranks), "--steps", str(steps), "--size", a.size,
                                    "--mode", mode, "--encoder", a.encoder, "--schedule", a.schedule,
                                    "--chunks", str(a.chunks), "--tp", str(a.tp), "--dp", str(a.dp),
                                    "--pp", str(a.pp), "--data", a.data, "--balance", balance]
                                   + (["--data-file", a.data_file] if a.data_file else [])
                                   + ([] if a.piece_ms is None else ["--piece-ms", str(a.piece_ms)])
                                   + (["--chunk-patches", str(a.chunk_patches)] if a.chunk_patches else []))
            try:
                mllm.check_args(args)
                rep = mllm.launch_job(args)
            except (ValueError, RuntimeError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2 if isinstance(e, ValueError) else 1
            reports[name].append(rep)
            print(f"[{time.monotonic() - t0:6.1f} s] round {r + 1}/{a.rounds} {name:<10} {steps} steps: median "
                  f"{rep['median_step_s'] * 1e3:.1f} ms, predicted {rep['predicted_step_s'] * 1e3:.1f} ms, "
                  f"overruns {sum(rep['overruns'])}, {len(rep['costs']['piece_fwd_s'])} pieces"
                  + (tp_line(rep["tp_waits"]) if a.tp > 1 else ""), flush=True)
        ratios = round_ratios({m: rs[r:r + 1] for m, rs in reports.items()})[0]
        load = os.getloadavg()[0]
        print(f"round {r + 1}: pybubble " + ", ".join(f"{ratios['vs_' + m]:.2f}x {m}" for m in reports if m != "pybubble")
              + "; by the total: " + ", ".join(f"{ratios['total_vs_' + m]:.2f}x" for m in reports if m != "pybubble")
              + f" (load {load:.2f})", flush=True)
    rounds_out = round_ratios(reports)
    settled = {m: [r["step_times_s"][s] for r in rs for s in r["settled_steps"]] for m, rs in reports.items()}
    median = {m: statistics.median(ts) for m, ts in settled.items()}
    predicted = {m: statistics.median(p for r in rs for p in (r["predicted_steps_s"][s] for s in r["settled_steps"]))
                 for m, rs in reports.items()}
    sums = {m: rs[-1]["param_checksum"] for m, rs in reports.items()}
    others = [m for m in reports if m != "pybubble"]
    print(f"{a.ranks} ranks (dp {args.dp}, pp {args.pp}, tp {a.tp}), schedule {a.schedule} ({mllm.chunks_of(args)} "
          f"stage(s) per rank), encoder {a.encoder}, data {data}, {a.steps} steps per mode in {a.rounds} rounds, "
          f"size {a.size}")
    print(f"{'round':<6} " + " ".join(f"{m:>10}" for m in reports) + " " + " ".join(f"{'vs ' + m:>14}" for m in others))
    for r, x in enumerate(rounds_out):
        print(f"{r + 1:<6} " + " ".join(f"{x[m + '_s'] * 1e3:>7.1f} ms" for m in reports) + " "
              + " ".join(f"{x['vs_' + m]:>13.2f}x" for m in others))
    print(f"{'total':<6} " + " ".join(f"{m:>10}" for m in reports) + " " + " ".join(f"{'vs ' + m:>14}" for m in others))
    for r, x in enumerate(rounds_out):
        print(f"{r + 1:<6} " + " ".join(f"{x[m + '_total_s']:>8.2f} s" for m in reports) + " "
              + " ".join(f"{x['total_vs_' + m]:>13.2f}x" for m in others))
    summary = {}
    for key in ("vs_", "total_vs_"):
        for m in others:
            values = [x[key + m] for x in rounds_out]
            summary[key + m] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    for key, what in (("vs_", "by the median step"), ("total_vs_", "by the settled steps' total")):
        print(f"pybubble per round, {what}: " + ", ".join(
            f"median {summary[key + m]['median']:.2f}x {m} [{summary[key + m]['min']:.2f}-{summary[key + m]['max']:.2f}]"
            for m in others))
    print(f"{'mode':<10} {'median step':>12} {'predicted':>10} {'error':>7} {'step error':>11} {'overruns':>9}")
    for mode in reports:
        err = predicted[mode] / median[mode] - 1.0
        step_err = statistics.median(r["prediction_error"] for r in reports[mode])
        overruns = sum(sum(r["overruns"]) for r in reports[mode])
        print(f"{mode:<10} {median[mode] * 1e3:>9.1f} ms {predicted[mode] * 1e3:>7.1f} ms {err:>+7.1%} "
              f"{step_err:>10.1%} {overruns:>9}")
    print("(step error: the median over the launches of each launch's median |predicted - measured| / measured per step)")
    bound = {m: [b for r in rs for b in (work_bound_s(r, s) for s in r["settled_steps"]) if b is not None]
             for m, rs in reports.items()}
    if all(bound.values()):
        floor = statistics.median(bound["pybubble"])
        print("work bound (median over the settled steps; every rank of the busiest replica busy all step with the "
              "chunks its mode ran): " + ", ".join(f"{m} {statistics.median(b) * 1e3:.1f} ms (its median step "
                                                   f"{median[m] / statistics.median(b) - 1:+.1%})" for m, b in bound.items()))
        print("so pybubble's median step at its work bound would be: "
              + ", ".join(f"{median[m] / floor:.2f}x {m}" for m in others) + " (the ceiling of the ratios above)")
    same = [rs[-1]["param_checksum"] for rs in reports.values()]
    spread = (max(same) - min(same)) / abs(same[0])
    print(f"parameter checksums of the last launches ({per_round[-1]} steps) agree within {spread:.1e} (relative)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"median_step_s": median, "predicted_step_s": predicted, "checksums": sums, "work_bound_s": bound,
                       "rounds": rounds_out, "per_round": summary, "reports": reports}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
