"""pybubble inside torchtitan (docs/torchtitan.md): :class:`TitanEncoder` takes a VLM's vision
encoder out of the first pipeline stage and runs it with pybubble's runtime, trained by
torchtitan's own optimizer, LR schedule, clipping and checkpoint; ``PybubbleTrainer`` (in
:mod:`.titan_trainer`, which imports torchtitan) is torchtitan's ``Trainer`` with that step;
:class:`PackedTitanVision` runs torchtitan's native-resolution vision encoder on the runtime's packed
chunks.
Importing this package does not import torchtitan."""

from __future__ import annotations

from .adoption import ENCODER, PIXELS, EncoderPart, EncoderStandIn, RuntimeSchedule, TitanEncoder, compute_dtype
from .packed_vision import PackedTitanVision, SegmentAttention

__all__ = ["ENCODER", "PIXELS", "EncoderPart", "EncoderStandIn", "PackedTitanVision", "RuntimeSchedule",
           "SegmentAttention", "TitanEncoder", "compute_dtype"]
