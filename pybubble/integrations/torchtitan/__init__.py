"""pybubble inside torchtitan (docs/torchtitan.md): :class:`TitanEncoder` takes a VLM's vision
encoder out of the first pipeline stage and runs it with pybubble's runtime, trained by
torchtitan's own optimizer, LR schedule, clipping and checkpoint; ``PybubbleTrainer`` (in
:mod:`.titan_trainer`, which imports torchtitan) is torchtitan's ``Trainer`` with that step.
Importing this package does not import torchtitan."""

from __future__ import annotations

from .adoption import ENCODER, PIXELS, EncoderPart, EncoderStandIn, RuntimeSchedule, TitanEncoder, compute_dtype

__all__ = ["ENCODER", "PIXELS", "EncoderPart", "EncoderStandIn", "RuntimeSchedule", "TitanEncoder", "compute_dtype"]
