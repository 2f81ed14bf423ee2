"""Generated problems: a uniform 1F1B LLM pipeline with TP gaps inside every op, and a ViT-like
encoder pipeline made of kernel chains (the generator itself lives in the C++ core)."""

from __future__ import annotations

import numpy as np

from .. import _core
from .problem import PROBLEM_FORMAT, Problem, load_problem


def synthetic(*, stages: int = 4, lanes_per_stage: int = 2, twin_lanes: int = 1, microbatches: int = 8,
              encoder_layers: int = 8, kernels_per_layer: int = 16, llm_fwd: float = 4000.0,
              llm_bwd: float = 8000.0, tp_gaps_per_op: int = 4, tp_gap: float = 150.0,
              encoder_scale: float = 1.0, jitter: float = 0.2, seed: int = 0) -> Problem:
    """A generated problem (times in us).

    stages: LLM pipeline stages (the encoder pipeline has as many); lanes_per_stage: encoder lanes
    on each stage's GPUs (microbatch j runs on lane j mod lanes_per_stage of each stage);
    twin_lanes: each encoder lane made this many twin lanes, the same windows and kernels, each
    kernel after its own lane's (task t becomes tasks t * twin_lanes + i), as encoder pipelines that
    share every microbatch evenly on the same LLM ranks (the Optimus plan's 8 per LLM stage);
    encoder_layers: split evenly over the stages; kernels_per_layer: kernels per layer and phase;
    llm_fwd / llm_bwd: one LLM op; tp_gaps_per_op, tp_gap: TP collectives inside each op, during
    which compute idles and the link is busy; encoder_scale: multiplies every encoder kernel;
    jitter: kernel durations vary by up to this fraction, drawn from `seed`.
    """
    core = _core.synthetic_problem(
        stages=stages, lanes_per_stage=lanes_per_stage, twin_lanes=twin_lanes, microbatches=microbatches,
        encoder_layers=encoder_layers, kernels_per_layer=kernels_per_layer, llm_fwd=llm_fwd,
        llm_bwd=llm_bwd, tp_gaps_per_op=tp_gaps_per_op, tp_gap=tp_gap,
        encoder_scale=encoder_scale, jitter=jitter, seed=seed)
    names = [f"pp{s}.enc{k}" + (f".twin{i}" if twin_lanes > 1 else "")
             for s in range(stages) for k in range(lanes_per_stage) for i in range(twin_lanes)]
    return Problem(core, names)


def vit22b_sized(seed: int = 0) -> Problem:
    """The benchmark's ViT-22B-sized problem: 8 stages x 2 lanes, 32 microbatches, 48 encoder
    layers of 16 kernels forward and backward (about 50,000 tasks), 12 TP gaps per LLM op
    (about 25,000 windows)."""
    return synthetic(stages=8, lanes_per_stage=2, microbatches=32, encoder_layers=48,
                     kernels_per_layer=16, llm_fwd=12000.0, llm_bwd=24000.0, tp_gaps_per_op=12,
                     tp_gap=300.0, encoder_scale=4.0, seed=seed)


def random_problem(seed: int, *, lanes: int = 2, microbatches: int = 3, max_windows: int = 3,
                   max_fwd: int = 3, max_bwd: int = 3, horizon: int = 100,
                   max_duration: int = 15, pieces: int = 1) -> Problem:
    """A small random problem with integer times, for property tests, fuzzing and exact
    comparisons: each lane gets up to `max_windows` windows per resource, each encoder microbatch
    a forward chain of 1..max_fwd tasks and a backward chain of 0..max_bwd tasks on random lanes and
    resources (with `pieces` above 1: 1..pieces such chains, independent of one another, as a
    microbatch split over pipelines), and the LLM microbatches increasing forward_needed <=
    grad_ready."""
    rng = np.random.default_rng(seed)

    def windows() -> list[list[float]]:
        k = int(rng.integers(0, max_windows + 1))
        cuts = sorted(set(int(x) for x in rng.integers(0, horizon + 1, size=2 * k)))
        pairs = [cuts[i:i + 2] for i in range(0, len(cuts) - 1, 2)]
        return [[float(a), float(b)] for a, b in pairs if a < b]

    lane_docs = [{"name": f"lane{i}", "compute_free": windows(), "link_free": windows()}
                 for i in range(lanes)]
    fn = sorted(int(x) for x in rng.integers(0, horizon // 2 + 1, size=microbatches))
    gr = sorted(max(f, int(x)) for f, x in zip(fn, rng.integers(horizon // 4, horizon + 1, size=microbatches)))
    gr = [max(g, f) for g, f in zip(gr, fn)]
    tasks: list[dict] = []
    for j in range(microbatches):
        for _ in range(1 if pieces == 1 else int(rng.integers(1, pieces + 1))):
            prev = None
            for phase, count in (("fwd", int(rng.integers(1, max_fwd + 1))),
                                 ("bwd", int(rng.integers(0, max_bwd + 1)))):
                for _ in range(count):
                    tasks.append({"id": len(tasks), "lane": int(rng.integers(0, lanes)),
                                  "duration": float(rng.integers(0, max_duration + 1)),
                                  "resource": "comm" if rng.random() < 0.25 else "compute",
                                  "phase": phase, "microbatch": j,
                                  "after": [] if prev is None else [prev]})
                    prev = len(tasks) - 1
    return load_problem({"format": PROBLEM_FORMAT, "horizon": float(horizon), "lanes": lane_docs,
                         "microbatches": [{"forward_needed": float(f), "grad_ready": float(g)}
                                          for f, g in zip(fn, gr)],
                         "tasks": tasks})


__all__ = ["random_problem", "synthetic", "vit22b_sized"]
