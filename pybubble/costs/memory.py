"""Memory per GPU of an MLLM step: model states and activations, for the planner's pruning.

The model is the usual back-of-the-envelope one (Optimus §4.2; Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", 2022):

- model states: ``STATE_BYTES`` = 6 bytes per trainable parameter held by the GPU (bf16 weight and
  gradient, plus the fp32 optimizer states sharded over data parallelism, which at the DP sizes of
  interest leaves about 2 bytes); a frozen encoder keeps only its bf16 weights (2 bytes);
- activations: ``34 · s · b · h / tp`` bytes per layer and microbatch in flight (tensor and
  sequence parallelism, FlashAttention: no ``s²`` term), held from a layer's forward until its
  backward (the weight-gradient part W where the schedule splits one off). Selective recomputation
  keeps the same: it drops only the attention's ``5·a·s²·b`` bytes, which FlashAttention never
  stores. Full recomputation keeps only each layer's input, ``2 · s · b · h / tp`` bytes (bf16,
  sequence-parallel split), and needs one layer's full activations again while that layer runs its
  backward: :func:`recompute_bytes`, once per GPU (Korthikanti et al., Table 2);
- LLM microbatches in flight are counted on the simulated timeline, stage by stage, so 1F1B,
  interleaved and zero-bubble schedules each get their own peak;
- an encoder stage keeps, at worst, the activations of every microbatch its pipeline runs (bubble
  scheduling may run all forwards before the first backward); a frozen encoder keeps none.

This module holds the per-layer figures; the per-stage peak over a simulated step is
:meth:`pybubble.llm.step.LLMStep.stage_memory`, an encoder plan's per-lane bytes
:meth:`pybubble.problem.encoder.EncoderWork.lane_bytes`. Everything is in bytes; ``GB`` is 1e9 bytes.
"""

from __future__ import annotations

from ..config.checks import one_of
from ..config.models import EncoderConfig, TransformerShape
from ..config.schema import RECOMPUTE

GB = 1e9
"""Bytes in a gigabyte (memory limits are given in GB)."""
STATE_BYTES = 6
"""Bytes of model state per trainable parameter."""
FROZEN_STATE_BYTES = 2
"""Bytes per parameter of a frozen model (its bf16 weights)."""
ACTIVATION_FACTOR = 34
"""Activation bytes per layer are ``ACTIVATION_FACTOR · s · b · h / tp`` (without full recomputation)."""


def activation_bytes(model: TransformerShape, micro_batch: int, seq_len: int, tp: int,
                     recompute: str = "none") -> float:
    """Activations one layer keeps for one microbatch until its backward: all of them, or only its
    input under full recomputation."""
    one_of(recompute, RECOMPUTE, "recompute")
    per = model.dtype_bytes if recompute == "full" else ACTIVATION_FACTOR
    return per * float(seq_len) * micro_batch * model.hidden / tp


def recompute_bytes(model: TransformerShape, micro_batch: int, seq_len: int, tp: int,
                    recompute: str = "none") -> float:
    """The transient memory of recomputation: under full recomputation, one layer's activations for
    one microbatch, rebuilt while that layer runs its backward; nothing otherwise."""
    if one_of(recompute, RECOMPUTE, "recompute") != "full":
        return 0.0
    return ACTIVATION_FACTOR * float(seq_len) * micro_batch * model.hidden / tp


def state_bytes(model: TransformerShape, tp: int, frozen: bool = False) -> float:
    """One layer's model states on one GPU of a TP group of `tp`."""
    return (FROZEN_STATE_BYTES if frozen else STATE_BYTES) * float(model.params_per_layer) / tp


def encoder_layer_bytes(model: EncoderConfig, images: int, tp: int, frozen: bool = False,
                        recompute: str = "none") -> tuple[float, float]:
    """One encoder layer's model states and activations per microbatch of `images` images on one
    GPU of a TP group of `tp` (a frozen encoder keeps no activations)."""
    act = 0.0 if frozen else activation_bytes(model, images, model.tokens, tp, recompute)
    return state_bytes(model, tp, frozen), act


__all__ = ["ACTIVATION_FACTOR", "FROZEN_STATE_BYTES", "GB", "STATE_BYTES", "activation_bytes",
           "encoder_layer_bytes", "recompute_bytes", "state_bytes"]
