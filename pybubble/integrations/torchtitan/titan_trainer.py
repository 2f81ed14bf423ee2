"""torchtitan's ``Trainer`` with pybubble's runtime running the VLM's vision encoder: its
documented extension route (a subclass with a ``Config`` of its own, as torchtitan's torchft trainer
is). A torchtitan user switches with one config line and one flag (docs/torchtitan.md):

    # in the config function torchtitan's --module/--config name:
    return PybubbleTrainer.Config(**fields_of_your_trainer_config)
    # on the command line:
    torchrun ... -m torchtitan.train --module my_vlm --config my_vlm_config --pybubble.mode pybubble

It imports torchtitan (0.3.0, torch 2.14 or newer). What it changes of ``Trainer`` (everything else
is torchtitan's own):

- before torchtitan splits the model (its model spec's ``pipelining_fn``), the encoder is taken out
  of it (:meth:`~pybubble.integrations.torchtitan.TitanEncoder.take`): stage 0 keeps a
  parameter-free stand-in;
- after ``Trainer.__init__``: the encoder is materialised and made the same on every rank, its
  model part joins ``model_parts``, and the optimizers, LR schedulers and checkpointer torchtitan
  built over the model parts are built again over them, with torchtitan's own configs;
- ``pp_schedule`` is the runtime's (:class:`~pybubble.integrations.torchtitan.RuntimeSchedule`):
  torchtitan's ``train_step`` calls its ``step(arg_mbs=, kwarg_mbs=, target_mbs=, ...)`` as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn
from torchtitan.trainer import Trainer

from ...runtime.options import RuntimeOptions
from .adoption import ENCODER, PIXELS, TitanEncoder


@dataclass(kw_only=True, slots=True)
class PybubbleConfig:
    """``--pybubble.*``: where the encoder runs and how the runtime finds it."""

    mode: str = "pybubble"
    """``megatron``, ``coarse`` or ``pybubble`` (the runtime's modes)."""
    encoder: str = ENCODER
    """The encoder's name in the whole model."""
    pixels: str = PIXELS
    """The encoder's input in each microbatch's keyword arguments."""
    dp_reduce: str = "auto"
    """How the encoder's gradients are reduced over dp (``auto``: as the LLM's, the sum under
    torchtitan's global-token loss)."""

    def options(self) -> RuntimeOptions:
        """The runtime's options (checked by them: a ValueError names a bad field)."""
        return RuntimeOptions(mode=self.mode, dp_reduce=self.dp_reduce)


def splitting_after_taking(pipelining_fn, config: PybubbleConfig, taken: list[TitanEncoder]):
    """A model spec's ``pipelining_fn`` that first takes the encoder out of the whole model
    (appending the :class:`TitanEncoder` to ``taken``), then splits it as ``pipelining_fn`` does."""
    if pipelining_fn is None:
        raise ValueError("model_spec.pipelining_fn: None; pybubble's trainer needs pipeline parallelism")

    def pipelining(model: nn.Module, **kwargs):
        taken.append(TitanEncoder.take(model, name=config.encoder, pixels=config.pixels))
        return pipelining_fn(model, **kwargs)

    return pipelining


def materialize(encoder: nn.Module, device: torch.device) -> None:
    """The encoder, built on ``meta`` as torchtitan builds the model, given storage on ``device``
    and initialised (its ``init_states``, else each submodule's ``reset_parameters``)."""
    encoder.to_empty(device=device)
    with torch.no_grad():
        if callable(getattr(encoder, "init_states", None)):
            encoder.init_states(buffer_device=None)
        else:
            for m in encoder.modules():
                if callable(getattr(m, "reset_parameters", None)):
                    m.reset_parameters()


class PybubbleTrainer(Trainer):
    """torchtitan's ``Trainer`` whose VLM encoder runs under pybubble's runtime."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        pybubble: PybubbleConfig = field(default_factory=PybubbleConfig)

    def __init__(self, config: Config):
        options = config.pybubble.options()
        taken: list[TitanEncoder] = []
        spec = config.model_spec
        config.model_spec = dataclasses.replace(
            spec, pipelining_fn=splitting_after_taking(spec.pipelining_fn, config.pybubble, taken))
        super().__init__(config)
        if not taken:
            raise ValueError("parallelism.pipeline_parallel_degree: 1; pybubble's trainer fills a pipeline's bubbles")
        self.titan_encoder = adoption = taken[0]
        materialize(adoption.encoder, self.device)
        self.model_parts.append(adoption.attach(self.model_parts, self.parallel_dims))
        self._rebuild_over_model_parts(config)
        adoption.install(self.optimizers)
        self.pp_schedule = adoption.schedule(self.pp_schedule, options)

    def _rebuild_over_model_parts(self, config: Config) -> None:
        """The optimizers, LR schedulers and checkpointer built again as ``Trainer.__init__`` built
        them, over the model parts with the encoder's."""
        self.optimizers = config.optimizer.build(model_parts=self.model_parts)
        self.lr_schedulers = config.lr_scheduler.build(optimizers=self.optimizers,
                                                       training_steps=config.training.steps)
        self.metrics_processor.optimizers = self.optimizers
        self.metrics_processor.model_parts = self.model_parts
        spec = config.model_spec
        self.checkpointer = config.checkpoint.build(
            dataloader=self.dataloader, model_parts=self.model_parts, optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers, states={"train_state": self},
            sd_adapter=(spec.state_dict_adapter(spec.model, config.hf_assets_path) if spec.state_dict_adapter
                        else None),
            base_folder=config.dump_folder)


__all__ = ["PybubbleConfig", "PybubbleTrainer", "materialize", "splitting_after_taking"]
