"""The layouts users know, simulated with the same bubble predictor and cost model as pybubble's:

- ``megatron``: the encoders run in pipeline stage 0's pre-process (Megatron-LM's
  ``pre_process``): every microbatch's encoder forward before stage 0's first LLM chunk, its
  backward after that chunk's backward, with the LLM's TP degree;
- ``megatron_balanced``: the encoder and LLM layers as one sequence cut into the pp x vpp virtual
  stages so that the slowest virtual stage is as fast as it can be (contiguous cuts, encoder layers
  first, every virtual stage non-empty); virtual stage ``c`` is chunk ``c // pp`` of rank
  ``c % pp``;
- ``coarse`` (Megatron-Core's colocated MIMO schedule): the encoder, under its own parallel plan on
  the same GPUs, runs its forward for the whole batch before the LLM and its backward after; the
  planner reports the best plan under that policy (:attr:`pybubble.planner.Search.coarse`).

The encoders' data-parallel gradient traffic is left out of every layout alike (it is the same
bytes in each). Times are microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import Config
from .costmodel import CostModel
from .memory import encoder_images, stage_bytes
from .planner import encoder_tp_ok, llm_layer_times, llm_timeline
from .timeline import Timeline


@dataclass(kw_only=True, slots=True)
class Baseline:
    """One baseline layout, simulated."""

    name: str
    step_time: float
    """Step time (us)."""
    memory_bytes: float
    """The largest memory of any GPU (bytes)."""
    timeline: Timeline | None = None
    """The simulated step (megatron and megatron_balanced)."""
    layout: str = ""
    """How the layers are placed, in words."""


def encoder_tp(config: Config) -> int:
    """The encoders' TP degree in the Megatron layouts: the LLM's, or the largest divisor of it that
    splits every encoder's heads (Megatron's ``--encoder-tensor-model-parallel-size``)."""
    tp = config.llm_plan.tp
    return max(d for d in range(1, tp + 1) if tp % d == 0 and encoder_tp_ok(config, d))


def encoder_layer_times(config: Config, costs: CostModel) -> list[tuple[int, float, float]]:
    """Per encoder: (layers, forward, backward) of one layer for one microbatch on one LLM stage's
    GPUs, at :func:`encoder_tp`; with a TP degree below the LLM's, the stage's TP groups split the
    microbatch's images (the slowest group's share counts). A frozen encoder's backward is 0."""
    tp = encoder_tp(config)
    groups = config.llm_plan.tp // tp
    images = -(-encoder_images(config) // groups)
    out = []
    for enc in config.encoders:
        m = enc.model
        f = costs.layer_time(m, images, m.tokens, tp=tp, phase="fwd")
        b = 0.0 if enc.frozen else costs.layer_time(m, images, m.tokens, tp=tp, phase="bwd")
        out.append((m.layers, f, b))
    return out


def megatron(config: Config, costs: CostModel) -> Baseline:
    """Encoders in stage 0's pre-process."""
    p = config.llm_plan
    per_chunk = config.llm.layers // (p.pp * p.vpp)
    lf, lb = llm_layer_times(config, costs)
    fwd, bwd = np.full((p.pp, p.vpp), per_chunk * lf), np.full((p.pp, p.vpp), per_chunk * lb)
    enc = encoder_layer_times(config, costs)
    fwd[0, 0] += sum(n * f for n, f, _ in enc)
    bwd[0, 0] += sum(n * b for n, _, b in enc)
    tl = llm_timeline(config, costs, fwd=fwd, bwd=bwd)
    enc_layers = np.zeros((p.pp, p.vpp))
    enc_layers[0, 0] = sum(n for n, _, _ in enc)
    mem = stage_bytes(config, tl, encoder_layers=enc_layers, encoder_tp=encoder_tp(config))
    return Baseline(name="megatron", step_time=tl.step_time, memory_bytes=float(mem.max()), timeline=tl,
                    layout=f"encoders on stage 0 (TP {encoder_tp(config)})")


def balanced_cuts(costs: np.ndarray, parts: int) -> np.ndarray:
    """Cuts a sequence of layer costs into `parts` contiguous non-empty pieces minimising the
    largest piece's sum; returns the first layer of each piece (and the end). Binary search on the
    bottleneck over the candidate sums, greedy feasibility."""
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"parts: {parts} is not in [1, {n}] (one layer per virtual stage at least)")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])

    def cuts(limit: float) -> np.ndarray | None:
        out = [0]
        i = 0
        for piece in range(parts):
            left = parts - piece - 1  # pieces still to fill after this one
            if left == 0:
                j = n
            else:
                # the furthest end within the limit that leaves a layer for each remaining piece
                j = int(np.searchsorted(prefix, prefix[i] + limit * (1 + 1e-12), side="right")) - 1
                j = min(j, n - left)
            if j <= i or prefix[j] - prefix[i] > limit * (1 + 1e-12):
                return None
            out.append(j)
            i = j
        return np.array(out)

    lo, hi = float(costs.max()), float(prefix[-1])
    for _ in range(100):  # converges to the bottleneck within float precision
        mid = (lo + hi) / 2
        if cuts(mid) is not None:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    found = cuts(hi)
    assert found is not None
    return found


def megatron_balanced(config: Config, costs: CostModel) -> Baseline:
    """Encoder and LLM layers cut to balance the slowest virtual stage."""
    p = config.llm_plan
    lf, lb = llm_layer_times(config, costs)
    enc = encoder_layer_times(config, costs)
    f = np.array([f for n, f, _ in enc for _ in range(n)] + [lf] * config.llm.layers)
    b = np.array([b for n, _, b in enc for _ in range(n)] + [lb] * config.llm.layers)
    is_enc = np.arange(len(f)) < sum(n for n, _, _ in enc)
    v = p.pp * p.vpp
    ends = balanced_cuts(f + b, v)
    fwd, bwd = np.zeros((p.pp, p.vpp)), np.zeros((p.pp, p.vpp))
    llm_layers, enc_layers = np.zeros((p.pp, p.vpp)), np.zeros((p.pp, p.vpp))
    for c in range(v):
        s, k, sl = c % p.pp, c // p.pp, slice(ends[c], ends[c + 1])
        fwd[s, k], bwd[s, k] = f[sl].sum(), b[sl].sum()
        enc_layers[s, k], llm_layers[s, k] = is_enc[sl].sum(), (~is_enc[sl]).sum()
    tl = llm_timeline(config, costs, fwd=fwd, bwd=bwd)
    mem = stage_bytes(config, tl, encoder_layers=enc_layers, llm_layers=llm_layers, encoder_tp=encoder_tp(config))
    stages_with_encoder = int((enc_layers.sum(axis=1) > 0).sum())
    return Baseline(name="megatron_balanced", step_time=tl.step_time, memory_bytes=float(mem.max()),
                    timeline=tl, layout=f"layers balanced over {v} virtual stages; encoders on "
                                        f"{stages_with_encoder} stage(s)")
