"""The modality bubble model against the C++ 1F1B simulator, and its layer split against the even
and the Megatron splits.

Part 1 draws pipelines at random (seeded) and prints the relative error of the model's step
(pybubble.planner.modality.predict) against simulate_pipeline("1f1b", per-stage fwd/bwd, p2p):

- `stages`: any per-stage times: fwd in [0.1, 10], bwd / fwd in [0.05, 3], p2p in [0, 3],
  2-8 stages, 1-32 microbatches;
- `layers`: encoder layers then LLM layers cut at random into 2-8 stages; per-layer times drawn
  per case (encoder bwd / fwd in [0.05, 3], LLM bwd / fwd in [1.5, 3]).

Part 2 takes MLLM configs (cost model, H100), searches the split and prints predicted and simulated
steps for it, for equal layer counts per stage and for Megatron's (whole encoder on stage 0).

With `--worst N`, part 1 also hill-climbs from N random starts of each kind (150 mutations each,
keeping a mutation when the error gets more negative) and prints the worst error found: how far
below the simulator the model can be pushed, which the tests' error bounds are set from.

Usage: python bench/modality_error.py [--cases 2000] [--seed 0] [--worst 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pybubble.cli.terminal import progress_bar
from pybubble.llm.step import LLMStep
from pybubble.planner import modality
from pybubble.config.schema import load_config


# A case is a dict of parameters; draw_* makes one, mutate_* changes one a little, predict_* runs it.

def draw_stages(rng: np.random.Generator) -> dict:
    s = int(rng.integers(2, 9))
    return {"fwd": rng.uniform(0.1, 10.0, s), "ratio": rng.uniform(0.05, 3.0, s), "m": int(rng.integers(1, 33)),
            "p2p": float(rng.uniform(0.0, 3.0))}


def mutate_stages(c: dict, rng: np.random.Generator) -> dict:
    s = c["fwd"].size
    return {"fwd": np.clip(c["fwd"] * np.exp(rng.normal(0, 0.4, s)), 0.1, 10.0),
            "ratio": np.clip(c["ratio"] + rng.normal(0, 0.3, s), 0.05, 3.0),
            "m": int(np.clip(c["m"] + rng.integers(-1, 2), 1, 32)),
            "p2p": float(np.clip(c["p2p"] + rng.normal(0, 0.3), 0.0, 3.0))}


def predict_stages(c: dict) -> modality.Prediction:
    return modality.predict(c["fwd"], c["fwd"] * c["ratio"], c["m"], c["p2p"])


def draw_layers(rng: np.random.Generator) -> dict:
    s = int(rng.integers(2, 9))
    e, l_ = int(rng.integers(0, 49)), int(rng.integers(s, 97))
    cuts = np.sort(rng.choice(np.arange(1, e + l_), s - 1, replace=False)).tolist()
    return {"e": e, "l": l_, "cuts": cuts, "ef": rng.uniform(0.1, 10.0), "er": rng.uniform(0.05, 3.0),
            "lf": rng.uniform(0.1, 10.0), "lr": rng.uniform(1.5, 3.0), "m": int(rng.integers(1, 33)),
            "p2p": float(rng.uniform(0.0, 3.0))}


def mutate_layers(c: dict, rng: np.random.Generator) -> dict:
    d = dict(c, ef=float(np.clip(c["ef"] * np.exp(rng.normal(0, 0.3)), 0.1, 10.0)),
             lf=float(np.clip(c["lf"] * np.exp(rng.normal(0, 0.3)), 0.1, 10.0)),
             er=float(np.clip(c["er"] + rng.normal(0, 0.3), 0.05, 3.0)),
             lr=float(np.clip(c["lr"] + rng.normal(0, 0.2), 1.5, 3.0)),
             m=int(np.clip(c["m"] + rng.integers(-1, 2), 1, 32)),
             p2p=float(np.clip(c["p2p"] + rng.normal(0, 0.3), 0.0, 3.0)))
    cuts = list(c["cuts"])
    i = int(rng.integers(0, len(cuts)))
    moved = cuts[i] + int(rng.choice([-1, 1]))
    if (cuts[i - 1] if i else 0) < moved < (cuts[i + 1] if i + 1 < len(cuts) else c["e"] + c["l"]):
        cuts[i] = moved
    d["cuts"] = cuts
    return d


def predict_layers(c: dict) -> modality.Prediction:
    times = modality.LayerTimes(encoder_fwd=c["ef"], encoder_bwd=c["ef"] * c["er"], llm_fwd=c["lf"],
                                llm_bwd=c["lf"] * c["lr"])
    split = modality._split(c["e"], [0, *c["cuts"], c["e"] + c["l"]])
    return modality.predict_split(split, times, c["m"], c["p2p"])


def error(pred: modality.Prediction) -> float:
    return pred.step_time / pred.simulate().step_time - 1.0


def worst(draw, mutate, predict, starts: int, rng: np.random.Generator, progress=None) -> float:
    """The most negative error found by hill climbing from `starts` random cases;
    `progress(done, starts)` after each start."""
    low = 0.0
    for start in range(starts):
        case = draw(rng)
        err = error(predict(case))
        for _ in range(150):
            other = mutate(case, rng)
            e = error(predict(other))
            if e < err:
                case, err = other, e
        low = min(low, err)
        if progress is not None:
            progress(start + 1, starts)
    return low



CONFIGS = {
    "llama-3-8b + vit-l-14, 1 image": {
        "cluster": {"gpus": 16}, "llm": {"preset": "llama-3-8b"}, "encoders": [{"preset": "vit-l-14"}],
        "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 2048}, "llm_plan": {"dp": 2, "pp": 4, "tp": 2}},
    "llama-3-8b + vit-g-14, 16 images": {
        "cluster": {"gpus": 16}, "llm": {"preset": "llama-3-8b"},
        "encoders": [{"preset": "vit-g-14", "tokens_per_sample": 16 * 257}],
        "training": {"global_batch": 32, "micro_batch": 2, "seq_len": 4096}, "llm_plan": {"dp": 2, "pp": 4, "tp": 2}},
    "llama-3-8b + vit-22b, 4 images, 8 stages": {
        "cluster": {"gpus": 64}, "llm": {"preset": "llama-3-8b"},
        "encoders": [{"preset": "vit-22b", "tokens_per_sample": 4 * 256}],
        "training": {"global_batch": 128, "micro_batch": 1, "seq_len": 4096}, "llm_plan": {"dp": 2, "pp": 8, "tp": 4}},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worst", type=int, default=0, help="hill-climbing starts per kind (0: none)")
    args = parser.parse_args()
    print(f"model vs simulator, {args.cases} random pipelines each (relative error = model / simulator - 1)")
    print("(the textbook formula below is not part of the model: it shows what the relaxed schedule adds)")
    kinds = {"stages": (draw_stages, mutate_stages, predict_stages),
             "layers": (draw_layers, mutate_layers, predict_layers)}
    for name, (draw, mutate, predict) in kinds.items():
        rng = np.random.default_rng(args.seed)
        err, textbook, took = [], [], []
        with progress_bar(f"{name}: random pipelines", total=args.cases) as update:
            for i in range(args.cases):
                case = draw(rng)
                t0 = time.perf_counter()
                pred = predict(case)
                took.append(time.perf_counter() - t0)
                sim = pred.simulate().step_time
                err.append(pred.step_time / sim - 1.0)
                t, s, m = pred.fwd + pred.bwd, len(pred.stages), pred.stages[0].microbatches
                textbook.append(((m - 1) * t.max() + t.sum() + 2 * (s - 1) * pred.p2p) / sim - 1.0)
                update(i + 1, args.cases)
        e, tb = np.abs(np.array(err)), np.array(textbook)
        print(f"{name:7s} mean |error| {e.mean():.4%}  p95 {np.percentile(e, 95):.4%}  max {e.max():.4%}  "
              f"exact (< 1e-9) {np.mean(e < 1e-9):.1%}  above the simulator: {int(np.sum(np.array(err) > 1e-9))}  "
              f"predict median {np.median(took) * 1e3:.2f} ms")
        print(f"{'':7s} textbook (M-1)*max T + sum T + 2(S-1)*p2p: mean |error| {np.abs(tb).mean():.2%}, "
              f"from {tb.min():+.1%} to {tb.max():+.1%}")
        if args.worst:
            with progress_bar(f"{name}: hill climbing", total=args.worst) as update:
                low = worst(draw, mutate, predict, args.worst, np.random.default_rng(args.seed + 1), update)
            print(f"{'':7s} worst error after hill climbing from {args.worst} starts: {low:+.2%}")
    print()
    print("layer split per config (predicted / simulated step, ms)")
    for name, doc in CONFIGS.items():
        config = load_config(doc)
        times = modality.layer_times(LLMStep.of(config))
        e, l_, s, m = config.encoders[0].model.layers, config.llm.layers, config.llm_plan.pp, config.microbatches
        t0 = time.perf_counter()
        best = modality.search_split(e, l_, s, times, m)
        took = time.perf_counter() - t0
        print(f"{name}: {e} encoder + {l_} LLM layers, {s} stages, {m} microbatches")
        rows = [("search", best), ("even", modality.predict_split(modality.equal_split(e, l_, s), times, m)),
                ("megatron", modality.predict_split(modality.megatron_split(e, l_, s), times, m))]
        sim_best = best.simulate().step_time
        for label, pred in rows:
            sim = pred.simulate().step_time
            split = " ".join(f"{a}+{b}" for a, b in zip(pred.split.encoder_layers, pred.split.llm_layers))
            print(f"  {label:8s} {pred.step_time / 1e3:9.2f} / {sim / 1e3:9.2f}  "
                  f"simulated vs search {sim / sim_best:.3f}x   split (enc+llm) {split}")
        print(f"  search took {took * 1e3:.1f} ms, {best.evaluated} splits evaluated, optimal: {best.optimal}")


if __name__ == "__main__":
    main()
