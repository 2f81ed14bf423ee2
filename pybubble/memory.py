"""Memory per GPU of an MLLM step: model states and activations, for the planner's pruning.

The model is the usual back-of-the-envelope one (Optimus §4.2; Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", 2022):

- model states: ``STATE_BYTES`` = 6 bytes per trainable parameter held by the GPU (bf16 weight and
  gradient, plus the fp32 optimizer states sharded over data parallelism, which at the DP sizes of
  interest leaves about 2 bytes); a frozen encoder keeps only its bf16 weights (2 bytes);
- activations: ``34 · s · b · h / tp`` bytes per layer and microbatch in flight (tensor and
  sequence parallelism, FlashAttention: no ``s²`` term), held from a layer's forward until its
  backward (the weight-gradient part W where the schedule splits one off);
- LLM microbatches in flight are counted on the simulated timeline, stage by stage, so 1F1B,
  interleaved and zero-bubble schedules each get their own peak;
- an encoder stage keeps, at worst, the activations of every microbatch its pipeline runs (bubble
  scheduling may run all forwards before the first backward); a frozen encoder keeps none.

Everything is in bytes; ``GB`` is 1e9 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .models import TransformerShape

if TYPE_CHECKING:
    from .config import Config, Encoder
    from .encoder_plan import EncoderPlan
    from .timeline import Timeline

GB = 1e9
STATE_BYTES = 6
"""Bytes of model state per trainable parameter."""
FROZEN_STATE_BYTES = 2
"""Bytes per parameter of a frozen model (its bf16 weights)."""
ACTIVATION_FACTOR = 34
"""Activation bytes per layer are ``ACTIVATION_FACTOR · s · b · h / tp``."""


def activation_bytes(model: TransformerShape, micro_batch: int, seq_len: int, tp: int) -> float:
    """Activations one layer keeps for one microbatch until its backward."""
    return ACTIVATION_FACTOR * float(seq_len) * micro_batch * model.hidden / tp


def activation_peak(timeline: "Timeline", held: np.ndarray) -> np.ndarray:
    """Per pipeline stage, the peak activation bytes over the step: ``held[stage, chunk]`` bytes
    are taken when a forward F of that chunk starts and given back when the backward that frees
    them ends (W where the table splits one off, else B or I)."""
    ops = timeline.ops
    split = {(o.stage, o.chunk, o.microbatch) for o in ops if o.kind == "W"}
    peak = np.zeros(timeline.stages)
    events: dict[int, list[tuple[float, float]]] = {s: [] for s in range(timeline.stages)}
    for o in ops:
        w = float(held[o.stage, o.chunk])
        if o.kind == "F":
            events[o.stage].append((o.start, w))
        elif o.kind == "W" or (o.kind in ("B", "I") and (o.stage, o.chunk, o.microbatch) not in split):
            events[o.stage].append((o.end, -w))
    for s, ev in events.items():
        now = 0.0
        for _, delta in sorted(ev):  # at equal times the frees (negative) come first
            now += delta
            peak[s] = max(peak[s], now)
    return peak


def _encoder_layer_bytes(enc: "Encoder", images: int, tp: int) -> tuple[float, float]:
    """One encoder layer's model states and activations per microbatch on one GPU of a TP group."""
    per_state = FROZEN_STATE_BYTES if enc.frozen else STATE_BYTES
    act = 0.0 if enc.frozen else activation_bytes(enc.model, images, enc.model.tokens, tp)
    return per_state * float(enc.model.params_per_layer) / tp, act


def stage_bytes(config: "Config", timeline: "Timeline", encoder_layers: np.ndarray | None = None,
                llm_layers: np.ndarray | None = None, encoder_tp: int | None = None) -> np.ndarray:
    """Per pipeline stage, model states and peak activations on one GPU when chunk ``c`` of stage
    ``s`` holds ``llm_layers[s, c]`` LLM layers and ``encoder_layers[s, c]`` layers of the encoders.
    The encoders' weights are split over `encoder_tp` GPUs (default: the LLM's TP); their
    activations over all of the stage's GPUs (TP groups below the LLM's split the images). With
    several encoders, an encoder layer's bytes are their average weighted by layer count.
    Default: the LLM's even layout and no encoder."""
    llm, plan, tr = config.llm, config.llm_plan, config.training
    shape = (timeline.stages, timeline.chunks)
    if llm_layers is None:
        llm_layers = np.full(shape, llm.layers // (timeline.stages * timeline.chunks))
    if encoder_layers is None:
        encoder_layers = np.zeros(shape)
    states = STATE_BYTES * float(llm.params_per_layer) / plan.tp * llm_layers
    held = activation_bytes(llm, tr.micro_batch, tr.seq_len, plan.tp) * llm_layers
    images = encoder_images(config)
    for enc in config.encoders:
        s_bytes = _encoder_layer_bytes(enc, images, encoder_tp or plan.tp)[0]
        a_bytes = _encoder_layer_bytes(enc, images, plan.tp)[1]
        share = enc.model.layers / sum(e.model.layers for e in config.encoders)
        states = states + s_bytes * share * encoder_layers
        held = held + a_bytes * share * encoder_layers
    return states.sum(axis=1) + activation_peak(timeline, held)


def encoder_images(config: "Config") -> int:
    """Images in one encoder microbatch: the LLM micro batch times the images per sample (the
    largest over the encoders)."""
    images = max(max(1, e.tokens_per_sample // e.model.tokens) for e in config.encoders)
    return config.training.micro_batch * images


def encoder_lane_bytes(config: "Config", plan: "EncoderPlan", partition: Sequence[int]) -> np.ndarray:
    """Per lane (``stage · lanes_per_stage + k``), the encoders' model states and worst-case
    activations on one GPU of that lane's TP group."""
    out = np.zeros(plan.pp_llm * plan.lanes_per_stage)
    images = encoder_images(config)
    for enc in config.encoders:
        s_bytes, a_bytes = _encoder_layer_bytes(enc, images, plan.tp_enc)
        for pipeline, count in enumerate(partition):
            for e, layers in enumerate(plan.stage_layers(enc.model.layers)):
                out[plan.lane(pipeline, e)] += layers * (s_bytes + a_bytes * count)
    return out


def colocated_bytes(config: "Config", timeline: "Timeline", plan: "EncoderPlan",
                    partition: Sequence[int], llm: np.ndarray | None = None) -> float:
    """The largest memory of any GPU when the encoder runs on the LLM's GPUs under `plan`.
    `llm`: :func:`stage_bytes` of the timeline, when the caller has it already."""
    per_stage = stage_bytes(config, timeline) if llm is None else llm
    lanes = encoder_lane_bytes(config, plan, partition)
    return float((np.repeat(per_stage, plan.lanes_per_stage) + lanes).max())
