"""A torchtitan VLM trainer with pybubble: torchtitan's llama3 ``debugmodel`` (SDPA) with a small
vision encoder feeding its first stage, built with torchtitan's own ``ParallelDims``,
``pipeline_vlm``, ``parallelize_llama``, loss, optimizer, LR schedule, clipping and checkpoint
wrapper, trained on CPU processes (gloo) under torchrun.

    python -m torch.distributed.run --nproc-per-node 4 examples/titan_vlm.py --pp 2 --dp-shard 2 --mode pybubble

``--mode titan`` is torchtitan's own placement: the encoder inside stage 0 (``pipeline_vlm``);
``megatron``, ``coarse`` and ``pybubble`` hand it to pybubble's runtime through
``pybubble.integrations.torchtitan.TitanEncoder`` (docs/torchtitan.md). Every mode starts from the
same weights (one whole model's, made with ``--seed``, loaded into each layout) and trains on the
same data; ``--report FILE`` writes what tells them apart or not: the encoder's and the LLM's
gradient norms of each step before clipping, the loss per step and the step times (JSON), and
every parameter after the last step (``FILE.pt``, whole tensors by name).
"""

import argparse
import json
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

import torchtitan.distributed.parallel_dims as titan_parallel_dims
from torchtitan.components.checkpointer.base import ModelWrapper
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed import utils as dist_utils
from torchtitan.distributed.pipeline_parallel import pipeline_vlm
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.model import Llama3Model
from torchtitan.models.llama3.parallelize import parallelize_llama

from pybubble.integrations.torchtitan import TitanEncoder
from pybubble.runtime import RuntimeOptions

SCHEDULES = {"1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B", "zbv": "ZBVZeroBubble"}
MODES = ("titan", "megatron", "coarse", "pybubble")
PATCHES, PATCH, SEQ, MICROBATCH = 8, 48, 32, 2  # image tokens, values per patch, tokens per sample, samples


class PatchEncoder(nn.Module):
    """A small ViT: each image's patches embedded, two transformer layers, projected to the LLM's
    width (its PATCHES tokens take the first positions of the sample)."""

    def __init__(self, dim: int, width: int = 64):
        super().__init__()
        self.embed = nn.Linear(PATCH, width)
        self.pos = nn.Parameter(torch.zeros(PATCHES, width))
        self.blocks = nn.Sequential(*[nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
                                      for _ in range(2)])
        self.proj = nn.Linear(width, dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embed(pixels.to(self.embed.weight.dtype))  # FSDP2 may compute in bfloat16 (--precision)
        return self.proj(self.blocks(x + self.pos.to(x.dtype)))


class TitanVLM(Llama3Model):
    """torchtitan's llama3 with a vision encoder: on the first stage (the one with
    ``tok_embeddings``) the image tokens replace the sample's first PATCHES positions."""

    def __init__(self, config: Llama3Model.Config):
        super().__init__(config)
        self.vision_encoder = PatchEncoder(config.dim)

    def forward(self, tokens: torch.Tensor, pixel_values: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, attention_masks=None):
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.vision_encoder is not None and pixel_values is not None:
                h = torch.cat([self.vision_encoder(pixel_values).to(h.dtype), h[:, PATCHES:]], dim=1)
        else:
            h = tokens
        for layer in self.layers.values():
            h = layer(h, attention_masks, positions)
        h = self.norm(h) if self.norm is not None else h
        return self.lm_head(h) if self.lm_head is not None else h


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp-shard", type=int, default=1)
    p.add_argument("--dp-replicate", type=int, default=1)
    p.add_argument("--schedule", default="1f1b", choices=tuple(SCHEDULES))
    p.add_argument("--mode", default="pybubble", choices=MODES)
    p.add_argument("--microbatches", type=int, default=4, help="pipeline microbatches per step")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-norm", type=float, default=1.0, help="gradient clipping's max norm")
    p.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                   help="torchtitan's training.mixed_precision_param (the encoder follows it)")
    p.add_argument("--dp-reduce", default="auto", choices=("auto", "mean", "sum"),
                   help="how the runtime reduces the encoder's gradients over dp (auto: as the LLM's)")
    p.add_argument("--report", help="write the run's figures (JSON) here (rank 0)")
    p.add_argument("--checkpoint", help="save a checkpoint here after the last step")
    p.add_argument("--resume", help="start from the checkpoint saved here (its steps are not run again)")
    p.add_argument("--first-step", type=int, default=0, help="the data's step to start from (with --resume)")
    p.add_argument("--total-steps", type=int, help="the LR schedule's steps (default: --first-step + --steps)")
    return p.parse_args(argv)


def titan_configs(args: argparse.Namespace) -> tuple:
    """torchtitan's model spec (debugmodel, SDPA) and the parallelism and training configs."""
    spec = model_registry("debugmodel")
    for layer in spec.model.layers:  # SDPA, causal (torchtitan's flex kernels need a GPU to be quick)
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    parallelism = ParallelismConfig(pipeline_parallel_degree=args.pp, data_parallel_shard_degree=args.dp_shard,
                                    data_parallel_replicate_degree=args.dp_replicate,
                                    pipeline_parallel_schedule=SCHEDULES[args.schedule],
                                    pipeline_parallel_microbatch_size=MICROBATCH, spmd_backend="partial_dtensor")
    training = TrainingConfig(local_batch_size=MICROBATCH * args.microbatches, seq_len=SEQ, steps=args.steps,
                              max_norm=args.max_norm, disable_cuda_graphs=True, mixed_precision_param=args.precision)
    return spec, parallelism, training


def whole_model_state(spec, seed: int) -> dict[str, torch.Tensor]:
    """One whole model's weights, by torchtitan's initialisation under ``seed`` (the same on every
    rank): each layout loads them, so every mode starts from the same weights."""
    torch.manual_seed(seed)
    model = TitanVLM(spec.model)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return {k: v.detach().clone() for k, v in [*model.named_parameters(), *model.named_buffers()]}


def load_whole(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``module`` (a model part, sharded or not) given its weights from the whole model's ``state``
    (each DTensor parameter takes its shard of the whole tensor)."""
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            whole = state[name]
            t.copy_(distribute_tensor(whole, t.device_mesh, t.placements) if isinstance(t, DTensor) else whole)


def build(args: argparse.Namespace, parallel_dims: ParallelDims):
    """The pipeline (torchtitan's ``pipeline_vlm``), its model parts with the whole model's weights
    and, in pybubble's modes, the encoder taken out of stage 0 (a ``TitanEncoder``)."""
    spec, parallelism, training = titan_configs(args)
    spec.model.update_from_config(config=argparse.Namespace(parallelism=parallelism, training=training,
                                                            debug=None, compile=CompileConfig()))
    with torch.device("meta"):
        model = TitanVLM(spec.model)
    adoption = None if args.mode == "titan" else TitanEncoder.take(model)
    loss = CrossEntropyLoss.Config().build()
    schedule, parts, first, last = pipeline_vlm(
        model, parallel_dims=parallel_dims, training=training, parallelism=parallelism, compile_config=CompileConfig(),
        ac_config=None, dump_folder="", device=torch.device("cpu"), model_config=spec.model,
        parallelize_fn=parallelize_llama, loss_fn=loss)
    state = whole_model_state(spec, args.seed)
    for part in parts:
        for m in part.modules():  # gloo has no PREMUL_SUM: FSDP2's reductions as plain sums (then divided)
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
        part.to_empty(device="cpu")
        load_whole(part, state)
        part.train()
    if adoption is not None:
        adoption.encoder.to_empty(device="cpu")
        adoption.encoder.load_state_dict({k.split(".", 1)[1]: v for k, v in state.items()
                                          if k.startswith("vision_encoder.")})
        parts = [*parts, adoption.attach(parts, parallel_dims)]
        schedule = adoption.schedule(schedule, RuntimeOptions(mode=args.mode, dp_reduce=args.dp_reduce))
    return schedule, parts, first, last, adoption


class SGDOptimizers(OptimizersContainer):
    """torchtitan's optimizers container building plain SGD (``--optimizer sgd``: the parameters
    move by exactly the gradients, which the tests compare). torchtitan 0.3.0 builds Adam, AdamW
    and DistMuon by name; a subclass's factory is its way to add one."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        pass

    @staticmethod
    def _resolve_optimizer_factory(name: str):
        if name != "SGD":
            raise ValueError(f"optimizer: {name!r}: SGDOptimizers builds SGD only")
        return torch.optim.SGD


def optimizers_of(args: argparse.Namespace, parts: list[nn.Module]):
    """torchtitan's optimizers container and LR schedulers over the model parts."""
    kwargs = ({"lr": args.lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1} if args.optimizer == "adamw"
              else {"lr": args.lr})
    container = OptimizersContainer if args.optimizer == "adamw" else SGDOptimizers
    optimizers = container.Config(
        param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name="AdamW" if args.optimizer == "adamw" else "SGD",
                                       optimizer_kwargs=kwargs)],
        implementation="foreach").build(model_parts=parts)
    schedulers = LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8, decay_type="linear",
                                              min_lr_factor=0.0).build(optimizers=optimizers,
                                                                       training_steps=args.total_steps or args.first_step + args.steps)
    return optimizers, schedulers


def batch(step: int, replica: int, microbatches: int) -> tuple[list, list]:
    """This replica's microbatches of ``step``: (kwargs with the pixels, labels), seeded by both."""
    g = torch.Generator().manual_seed(1000 * step + replica)
    tokens = torch.randint(0, 2048, (microbatches, MICROBATCH, SEQ + 1), generator=g)
    pixels = torch.randn(microbatches, MICROBATCH, PATCHES, PATCH, generator=g)
    labels = tokens[:, :, 1:].clone()
    labels[:, :, :PATCHES] = -100  # image positions predict nothing
    return [(tokens[k, :, :-1], {"pixel_values": pixels[k]}) for k in range(microbatches)], list(labels)


def grad_norm(parameters) -> float:
    """The norm of the gradients of ``parameters`` on this rank (DTensors: their full norm)."""
    total = 0.0
    for p in parameters:
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            total += float(g.double().pow(2).sum())
    return total


def train_step(args, step, schedule, parts, parallel_dims, optimizers, schedulers, first, last, figures) -> None:
    """One step as torchtitan's ``Trainer.train_step`` runs it with pipeline parallelism: the
    global token count over the batch mesh, ``schedule.step(arg_mbs=, kwarg_mbs=, target_mbs=,
    losses=, loss_kwargs=)``, torchtitan's clipping over the pipeline, the optimizer and LR step."""
    replica = parallel_dims.get_mesh("batch").get_local_rank() if parallel_dims.dp_enabled else 0
    inputs, labels = batch(step, replica, args.microbatches)
    valid = sum(int((lab != -100).sum()) for lab in labels)
    total = torch.tensor(valid, dtype=torch.int64)
    if parallel_dims.dp_enabled:
        total = dist_utils.dist_sum_tensor(total, parallel_dims.get_mesh("batch"))
    losses = [] if last else None
    t = time.perf_counter()
    schedule.step(arg_mbs=[(tok,) for tok, _ in inputs] if first else None, kwarg_mbs=[kw for _, kw in inputs],
                  target_mbs=labels if last else None, losses=losses, loss_kwargs={"global_valid_tokens": total},
                  return_outputs=False)
    figures["step_s"].append(time.perf_counter() - t)
    encoder = [p for part in parts for n, p in part.named_parameters() if n.startswith("vision_encoder.")]
    llm = [p for part in parts for n, p in part.named_parameters() if not n.startswith("vision_encoder.")]
    figures["grad_sq"].append([grad_norm(encoder), grad_norm(llm)])
    figures["loss"].append(float(torch.stack(losses).detach().sum()) if last else 0.0)
    dist_utils.clip_grad_norm_([p for part in parts for p in part.parameters()], args.max_norm, foreach=True,
                               pp_mesh=parallel_dims.get_optional_mesh("pp"))
    optimizers.step()
    schedulers.step()
    optimizers.zero_grad()


def whole_parameters(parts: list[nn.Module]) -> dict[str, torch.Tensor]:
    """This rank's parameters as whole tensors (a DTensor's gathered), by their names in the whole
    model."""
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for part in parts for name, p in part.named_parameters()}


def gathered(parallel_dims: ParallelDims, figures: dict, parts: list[nn.Module]) -> dict | None:
    """The run's report on rank 0: every rank's parameters (each name once), the encoder's and the
    LLM's gradient norms before clipping (over the first replica's pipeline: DTensors count whole),
    the loss (each replica's last stage holds its share of the global mean)."""
    mine = {"params": whole_parameters(parts), **figures}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() != 0:
        return None
    params = {}
    for r in every:
        params.update(r["params"])
    world, steps = dist.get_world_size(), len(figures["loss"])
    pipeline = [every[r] for r in range(0, world, world // parallel_dims.pp)]  # replica 0's (pp outermost)
    grads = [[sum(r["grad_sq"][s][i] for r in pipeline) ** 0.5 for i in (0, 1)] for s in range(steps)]
    loss = [sum(r["loss"][s] for r in every) for s in range(steps)]  # each replica's last stage
    return {"params": params, "grad_norms": grads, "loss": loss, "step_s": figures["step_s"]}


def write_report(path: str, mode: str, report: dict) -> None:
    """``path``: the figures (JSON); ``path`` + ``.pt``: every parameter, whole, by name."""
    with open(path, "w") as f:
        json.dump({"mode": mode, **{k: v for k, v in report.items() if k != "params"}}, f)
    torch.save(report["params"], path + ".pt")


def main(argv=None) -> None:
    args = parse(argv)
    dist.init_process_group("gloo")  # torchrun's env:// rendezvous
    titan_parallel_dims.device_type = "cpu"  # torchtitan builds its meshes on its device type (CUDA by default)
    parallel_dims = ParallelDims(dp_replicate=args.dp_replicate, dp_shard=args.dp_shard, cp=1, tp=1, pp=args.pp,
                                 ep=1, world_size=dist.get_world_size(), spmd_backend="partial_dtensor")
    parallel_dims.build_mesh()
    schedule, parts, first, last, adoption = build(args, parallel_dims)
    optimizers, schedulers = optimizers_of(args, parts)
    if adoption is not None:
        adoption.install(optimizers)
    state = {"model": ModelWrapper(parts), "optimizer": optimizers, "lr_scheduler": schedulers}
    if args.resume:
        dcp.load(state, checkpoint_id=args.resume)
    figures = {"grad_sq": [], "loss": [], "step_s": []}
    for step in range(args.first_step, args.first_step + args.steps):
        train_step(args, step, schedule, parts, parallel_dims, optimizers, schedulers, first, last, figures)
    if args.checkpoint:
        dcp.save(state, checkpoint_id=args.checkpoint)
    report = gathered(parallel_dims, figures, parts)
    if report is not None:
        if args.report:
            write_report(args.report, args.mode, report)
        print(f"{args.mode}: loss {' '.join(f'{x:.6f}' for x in report['loss'])}; parameters' sum "
              f"{sum(float(v.double().sum()) for v in report['params'].values()):.9f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
