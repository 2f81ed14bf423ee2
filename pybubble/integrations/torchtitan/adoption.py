"""A torchtitan trainer's vision encoder run by pybubble's runtime: taken out of the first pipeline
stage before torchtitan splits the model, run by :class:`~pybubble.runtime.EncoderRuntime` in the
pipeline's bubbles (or in stage 0's ops, or around the pipeline: the runtime's modes), and trained
by torchtitan's own optimizer, LR schedule, gradient clipping and checkpoint as one more model part.

torch only: torchtitan is not imported here (its ``Trainer`` subclass is
:mod:`pybubble.integrations.torchtitan.titan_trainer`). The rules it keeps (docs/torchtitan.md):

- **The same start.** The encoder's parameters and buffers are broadcast from global rank 0 to
  every rank (torchtitan seeds each pipeline rank differently).
- **The same reduction.** The runtime reduces the encoder's gradients over the data-parallel
  replicas as the stages' FSDP2 modules reduce the LLM's: torchtitan turns FSDP2's division off
  (divide factor 1.0) and divides the loss by the step's global token count, so the sum
  (``RuntimeOptions.dp_reduce`` ``auto``; a stated ``mean`` beside it is refused).
- **One norm.** The encoder's summed gradients land on the first stage's rank only
  (``grads_to="first_stage"``) until the optimizer steps, so torchtitan's clipping, which sums
  the squared norms over the pipeline ranks, counts them once, as it counts them where the
  encoder is part of stage 0; where the LLM's parameters are DTensors, the encoder's model part
  holds replicated DTensors on the LLM's mesh that share the encoder's storage. Just before the
  optimizer steps (its step pre-hook) the clipped gradients go to the pipeline's other ranks.
- **The trainer's precision.** Where the stages' FSDP2 mixed-precision policy computes the LLM in
  another dtype than the encoder's parameters (torchtitan's ``mixed_precision_param``, bfloat16 by
  default), the runtime computes the encoder in it too (``RuntimeOptions.compute_dtype``: its
  parameters cast for each piece, its inputs cast; the parameters, their gradients and their
  reduction stay float32, as FSDP2's ``reduce_dtype`` keeps the LLM's).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate

from ...runtime.batch import EncoderBatch
from ...runtime.encoder_runtime import EncoderRuntime
from ...runtime import torch_seams
from ...runtime.options import RuntimeOptions

ENCODER = "vision_encoder"
"""The name torchtitan's VLMs give their vision encoder (``pipeline_vlm`` puts it in stage 0)."""
PIXELS = "pixel_values"
"""The key of the encoder's input in each microbatch's keyword arguments (``kwarg_mbs``)."""


class EncoderStandIn(nn.Module):
    """What the first stage holds where its encoder was: no parameters; called as the encoder was,
    it returns the runtime's output for the microbatch whose forward is running (a ``meta`` tensor
    of that shape while torch infers the stage's shapes on ``meta`` inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.runtime: EncoderRuntime | None = None

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The runtime's encoder output for the running microbatch (the arguments, the encoder's
        input, are not read: the runtime has the step's)."""
        runtime = self.runtime
        if runtime is None:
            raise RuntimeError("vision encoder stand-in: called before TitanEncoder.start gave it the runtime "
                               "(run the step through TitanEncoder.schedule)")
        if any(isinstance(a, torch.Tensor) and a.is_meta for a in (*args, *kwargs.values())):
            return torch.empty(runtime.output_shape, dtype=runtime.output_dtype, device="meta")
        return runtime.encoder_output()


def llm_mesh(model_parts: Sequence[nn.Module]) -> Any:
    """The device mesh of the LLM's DTensor parameters (FSDP2, replicate, TP); None where they are
    plain tensors."""
    return next((p.device_mesh for part in model_parts for p in part.parameters() if isinstance(p, DTensor)), None)


def compute_dtype(model_parts: Sequence[nn.Module], encoder: nn.Module) -> torch.dtype | None:
    """The dtype the stages' FSDP2 mixed-precision policy computes the LLM in, where it is not the
    encoder's parameters' (the runtime then computes the encoder in it:
    ``RuntimeOptions.compute_dtype``); None where no policy casts. ValueError where the stages'
    policies cast to different dtypes (the encoder could follow only one)."""
    casts = {torch_seams.fsdp_param_dtype(m) for part in model_parts for m in part.modules()
             if isinstance(m, FSDPModule)} - {None}
    if len(casts) > 1:
        raise ValueError(f"mixed precision: the LLM's FSDP2 policies compute in {sorted(map(str, casts))}; the "
                         "encoder can follow one")
    dtypes = {p.dtype for p in encoder.parameters()}
    cast = next(iter(casts), None)
    return None if cast is None or {cast} == dtypes else cast


class EncoderPart(nn.Module):
    """The model part torchtitan's optimizer, LR schedule, clipping and checkpoint take for the
    encoder: its parameters under the names they have in the whole model (``vision_encoder.…``).
    With ``mesh``, each is a replicated DTensor on it sharing the encoder parameter's storage (its
    gradient likewise, set by :meth:`expose_grads`), so that a norm over the part and the LLM's
    DTensors counts it once; without, the part holds the encoder itself."""

    def __init__(self, encoder: nn.Module, name: str, mesh: Any = None):
        super().__init__()
        self.mesh = mesh
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []
        """Each encoder parameter and its replicated view (with a mesh)."""
        if mesh is None:
            self.add_module(name, encoder)
            return
        self.placements = [Replicate()] * mesh.ndim
        mirror = copy.deepcopy(encoder).requires_grad_(False)
        for original, copied in zip(encoder.modules(), mirror.modules()):
            for key, param in original.named_parameters(recurse=False):
                with torch.no_grad():
                    view = nn.Parameter(DTensor.from_local(param.detach(), mesh, self.placements, run_check=False))
                setattr(copied, key, view)
                self.pairs.append((param, view))
            for key, buffer in original.named_buffers(recurse=False):
                copied._buffers[key] = buffer  # the same tensors: a checkpoint saves the encoder's own
        self.add_module(name, mirror)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not called: the part only holds parameters."""
        raise RuntimeError("EncoderPart holds the encoder's parameters for the trainer; the runtime runs the encoder")

    def expose_grads(self) -> None:
        """The part's gradients: the encoder's (replicated DTensors sharing their storage where
        the part has a mesh, else the encoder's own already; None where the encoder has none on
        this rank)."""
        for param, view in self.pairs:
            view.grad = (None if param.grad is None else
                         DTensor.from_local(param.grad, self.mesh, self.placements, run_check=False))


class TitanEncoder:
    """One torchtitan trainer's encoder under pybubble's runtime. In order: :meth:`take` it out of
    the whole model (before ``pipeline_vlm`` / ``pipeline_llm`` split it), :meth:`attach` it to the
    model parts (the same start on every rank; :attr:`part` joins the trainer's model parts),
    :meth:`install` on the trainer's optimizers, and run each step through :meth:`schedule`, which
    stands where the trainer keeps its pipeline schedule."""

    def __init__(self, encoder: nn.Module, *, name: str = ENCODER, pixels: str = PIXELS):
        self.encoder, self.name, self.pixels = encoder, name, pixels
        self.runtime: EncoderRuntime | None = None
        self.part: EncoderPart | None = None
        self.compute_dtype: torch.dtype | None = None
        """The dtype the LLM's mixed precision computes in, where the encoder follows it."""
        self.model_parts: list[nn.Module] = []
        self.parallel_dims: Any = None

    @classmethod
    def take(cls, model: nn.Module, *, name: str = ENCODER, pixels: str = PIXELS) -> TitanEncoder:
        """The encoder ``model.<name>`` taken out of the whole model; a parameter-free
        :class:`EncoderStandIn` takes its place (the split keeps it in stage 0)."""
        encoder = getattr(model, name, None)
        if not isinstance(encoder, nn.Module) or isinstance(encoder, EncoderStandIn):
            raise ValueError(f"model: {type(model).__name__}.{name} is {type(encoder).__name__}, not the vision "
                             "encoder module (pass name= where the model calls it otherwise)")
        setattr(model, name, EncoderStandIn())
        return cls(encoder, name=name, pixels=pixels)

    def attach(self, model_parts: Sequence[nn.Module], parallel_dims: Any) -> EncoderPart:
        """After the split: the encoder made the same on every rank (broadcast from global rank 0),
        checked against the stages' precision, and its model part built (returned; the trainer
        adds it to its model parts, for its optimizer, LR schedule, clipping and checkpoint)."""
        self.model_parts, self.parallel_dims = list(model_parts), parallel_dims
        self.compute_dtype = compute_dtype(self.model_parts, self.encoder)
        with torch.no_grad():
            for t in [*self.encoder.parameters(), *self.encoder.buffers()]:
                dist.broadcast(t.data, src=0)
        self.part = EncoderPart(self.encoder, self.name, llm_mesh(self.model_parts))
        return self.part

    def install(self, optimizers: torch.optim.Optimizer) -> None:
        """The clipped gradients go from the first stage's rank to the others just before
        ``optimizers`` step (a step pre-hook, torch's public extension point)."""
        optimizers.register_step_pre_hook(lambda *_: self.before_optimizer())

    def stand_ins(self) -> Iterator[EncoderStandIn]:
        """The stand-ins in this rank's model parts (one where it holds the first stage)."""
        for part in self.model_parts:
            yield from (m for m in part.modules() if isinstance(m, EncoderStandIn))

    def start(self, schedule: Any, example: torch.Tensor, options: RuntimeOptions | None = None) -> EncoderRuntime:
        """The runtime over the trainer's ``schedule`` and ``parallel_dims`` (``example``: one
        microbatch of encoder input), its gradients landing on the first stage's rank."""
        if self.part is None:
            raise RuntimeError("TitanEncoder.start: attach the encoder to the model parts first")
        options = options or RuntimeOptions()
        if options.compute_dtype not in (None, self.compute_dtype):
            raise ValueError(f"compute_dtype: {options.compute_dtype}, but the LLM's mixed precision computes in "
                             f"{self.compute_dtype}: the encoder follows the trainer's (leave it None)")
        options = dataclasses.replace(options, grads_to="first_stage", compute_dtype=self.compute_dtype)
        device = next(self.encoder.parameters()).device
        self.runtime = EncoderRuntime(self.encoder, schedule=schedule, example=example, groups=self.parallel_dims,
                                      options=options, device=device)
        for stand_in in self.stand_ins():
            stand_in.runtime = self.runtime
        return self.runtime

    def schedule(self, schedule: Any, options: RuntimeOptions | None = None) -> RuntimeSchedule:
        """What stands where the trainer keeps ``schedule``: its ``step`` runs the runtime's."""
        return RuntimeSchedule(self, schedule, options)

    def step(self, schedule: Any, options: RuntimeOptions | None, args: tuple, kwargs: dict) -> Any:
        """One step: the encoder's input read from each microbatch's ``kwarg_mbs[k][pixels]``, the
        runtime started on the first, its step run in place of ``schedule.step(*args, **kwargs)``."""
        kwarg_mbs = kwargs.get("kwarg_mbs")
        if not kwarg_mbs or any(self.pixels not in kw for kw in kwarg_mbs):
            raise ValueError(f"kwarg_mbs: each microbatch's keyword arguments need the encoder's input "
                             f"{self.pixels!r} (got {None if not kwarg_mbs else sorted(kwarg_mbs[0])})")
        pixels = [kw[self.pixels] for kw in kwarg_mbs]
        if self.runtime is None:
            self.start(schedule, pixels[0], options)
        self.encoder.zero_grad(set_to_none=True)
        result = self.runtime.step(EncoderBatch(pixels), *args, **kwargs)
        self.part.expose_grads()
        return result

    def before_optimizer(self) -> None:
        """The encoder's (clipped) gradients sent from the first stage's rank to the pipeline's
        other ranks, and the part's gradients set to them."""
        if self.runtime is not None:
            self.runtime.share_grads()
            self.part.expose_grads()


class RuntimeSchedule:
    """Stands where a torchtitan trainer keeps its pipeline schedule (``trainer.pp_schedule``):
    ``step`` runs the encoder runtime's step, which runs the schedule's; anything else is the
    schedule's own."""

    def __init__(self, adoption: TitanEncoder, schedule: Any, options: RuntimeOptions | None):
        self.adoption, self.schedule, self.options = adoption, schedule, options

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """The runtime's step in place of the schedule's (:meth:`TitanEncoder.step`)."""
        return self.adoption.step(self.schedule, self.options, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.schedule, name)


__all__ = ["ENCODER", "PIXELS", "EncoderPart", "EncoderStandIn", "RuntimeSchedule", "TitanEncoder", "compute_dtype",
           "llm_mesh"]
