"""The test trainer's ranks: the trainer's mesh (pp outermost, as torchtitan orders it), the LLM's
stages tensor-parallel over "tp" and data-parallel (FSDP2 or DDP) over the data-parallel dimension,
torch's pipeline schedule over "pp", the encoder run by :class:`~pybubble.runtime.EncoderRuntime`,
and the training loop; each mode of a launch trained from the seed in turn on the same ranks."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed import pipelining

from ...runtime import BalanceOptions, EncoderRuntime, PieceOptions, RuntimeOptions, gather_figures, llm_stream
from ...viz.chrome_trace import save_trace
from .faults import Fault
from .inputs import balanced, loss_fn, make_batch, packed_loss, replica_slice, replica_step, sample_row
from .job import TORCH_SCHEDULES, SINGLE_STAGE, SPLIT_BACKWARD, V_SHAPED, chunks_of, config, mode_args, mode_path
from .model import PACKED_KINDS, PATCH_VALUES, ModelConfig, apply_tp, build_encoder, build_stages, checksum, full_checksum


def stages_of_rank(rank: int, ranks: int, schedule: str, chunks: int) -> list[int]:
    """The pipeline stages rank ``rank`` holds: ``rank + c * ranks`` (looped schedules), or ``rank``
    and ``2 * ranks - 1 - rank`` (V-shaped ones), as torch's schedules place them."""
    if schedule in V_SHAPED:
        return [rank, 2 * ranks - 1 - rank]
    return [rank + c * ranks for c in range(chunks)]


def build_mesh(args: argparse.Namespace, device: torch.device):
    """The trainer's DeviceMesh, pp outermost as torchtitan orders its dimensions: ("pp", DP), and
    "tp" innermost with ``--tp`` > 1; DP is ``--dp-dim`` ("dp", or a torchtitan name such as
    "dp_shard")."""
    from torch.distributed.device_mesh import init_device_mesh

    if args.tp > 1:
        return init_device_mesh(device.type, (args.pp, args.dp, args.tp), mesh_dim_names=("pp", args.dp_dim, "tp"))
    return init_device_mesh(device.type, (args.pp, args.dp), mesh_dim_names=("pp", args.dp_dim))


def data_parallel(stage_module: nn.Module, args: argparse.Namespace, mesh) -> nn.Module:
    """A stage's module as the pipeline runs it: sharded with FSDP2 (each block, then the whole)
    or wrapped in DDP over the mesh's data-parallel dimension, or as it is without data parallelism."""
    dp_mesh = mesh[args.dp_dim]
    if args.dp > 1 and args.dp_wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # A schedule that splits the backward finds the weights its W differentiates in the
        # module's parameters at I: a block resharded after its forward shows its sharded ones
        # there, not the gathered ones of the microbatch's graph, and W computes no gradient for
        # them (docs/runtime.md, "Zero-bubble schedules beside data parallelism"). There the
        # blocks stay gathered from the forward on, as torchtitan keeps them under any pipeline.
        reshard = args.schedule not in SPLIT_BACKWARD
        for block in stage_module.blocks:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
        fully_shard(stage_module, mesh=dp_mesh)
        # The head's logits of a 3-D input are a view (F.linear reshapes); FSDP2 warns on every
        # forward that an in-place op on it would skip its pre-backward hook. Nothing here writes
        # into the logits in place, so the warning says nothing about this trainer.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")
        return stage_module
    if args.dp > 1:
        return nn.parallel.DistributedDataParallel(stage_module, process_group=dp_mesh.get_group())
    return stage_module


@dataclass
class RankParts:
    """What one rank trains: its place in the mesh, its LLM stages, the pipeline and the encoder."""

    mesh: object
    """The trainer's DeviceMesh."""
    device: torch.device
    """The rank's device."""
    pp_rank: int
    """Its place in the pipeline."""
    dp_rank: int
    """Its data-parallel replica."""
    tp_rank: int
    """Its place in its tensor-parallel group (0 without)."""
    stage_ids: list[int]
    """The pipeline stages it holds."""
    stage_modules: list[nn.Module]
    """Their modules."""
    llms: list[nn.Module]
    """Their modules as the pipeline runs them (FSDP2-sharded or DDP-wrapped)."""
    schedule: object = None
    """torch's pipeline schedule over them."""
    stages: list = dataclasses.field(default_factory=list)
    """Their PipelineStages."""
    encoder: nn.Module | None = None
    """The vision encoder (every rank holds it)."""
    loss_scale: list[float] = dataclasses.field(default_factory=lambda: [1.0])
    """Varying data: the loss's factor this step (:func:`packed_loss`)."""
    packs: list = dataclasses.field(default_factory=list)
    """A native-resolution encoder: this step's :class:`~pybubble.runtime.packed.PackedMicrobatch` per slot."""

    @property
    def first(self) -> bool:
        """Whether it holds the LLM's first stage."""
        return 0 in self.stage_ids


def rank_device(args: argparse.Namespace) -> torch.device:
    """The rank's device: its GPU (``--device cuda``) or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")


def parallelize(args: argparse.Namespace, cfg: ModelConfig, mesh, fault: Fault) -> RankParts:
    """The rank's LLM stages on the trainer's mesh, tensor-parallel over "tp" and data-parallel over DP."""
    device = rank_device(args)
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh[args.dp_dim].get_local_rank()
    chunks = chunks_of(args)
    mine = stages_of_rank(pp_rank, args.pp, args.schedule, chunks)  # this rank's stages
    every_stage = build_stages(cfg, args.pp, args.encoder, chunks, packed=args.data != "fixed")
    stage_modules = [every_stage[s].to(device) for s in mine]
    if args.tp > 1:  # the encoder stays replicated over "tp": each TP rank runs the same pieces
        for stage_module in stage_modules:
            apply_tp(stage_module, mesh["tp"])
    llms = []
    for s, stage_module in zip(mine, stage_modules):
        if s == 0:
            stage_module.image_shape = (cfg.microbatch_size // args.dp, *stage_module.image_shape[1:])
        fault.stage_hooks(stage_module)
        llms.append(data_parallel(stage_module, args, mesh))
    return RankParts(mesh=mesh, device=device, pp_rank=pp_rank, dp_rank=dp_rank,
                     tp_rank=mesh["tp"].get_local_rank() if args.tp > 1 else 0, stage_ids=mine,
                     stage_modules=stage_modules, llms=llms)


def build_pipeline(parts: RankParts, args: argparse.Namespace, cfg: ModelConfig) -> None:
    """The rank's pipeline stages over the mesh's "pp" and the schedule that runs them."""
    total = args.pp * chunks_of(args)
    parts.stages = [pipelining.PipelineStage(llm, s, total, parts.device, group=parts.mesh["pp"].get_group())
                    for llm, s in zip(parts.llms, parts.stage_ids)]
    schedule_class = getattr(pipelining, TORCH_SCHEDULES[args.schedule])
    loss = loss_fn(cfg) if args.data == "fixed" else packed_loss(parts.loss_scale)
    parts.schedule = schedule_class(parts.stages[0] if args.schedule in SINGLE_STAGE else parts.stages,
                                    cfg.microbatches, loss_fn=loss, scale_grads=False)


def build_runtime(parts: RankParts, args: argparse.Namespace, cfg: ModelConfig, fault: Fault) -> EncoderRuntime:
    """The encoder and the runtime on the trainer's mesh: pieces traced on one microbatch (varying
    data: on one chunk of ``chunk_tiles`` tiles); on CUDA the gradient sums go through the mesh's
    NCCL groups."""
    parts.encoder = build_encoder(cfg, args.encoder).to(parts.device)
    if args.data == "fixed":
        images, _, _ = make_batch(cfg, 0, args.encoder)
        example = replica_slice(images, cfg, args.dp, parts.dp_rank)[:cfg.microbatch_size // args.dp]
    elif args.encoder in PACKED_KINDS:  # one chunk (of padding: its layout is an input, not part of the trace)
        example = (torch.zeros(1, cfg.chunk_patches, PATCH_VALUES[args.encoder]),
                   *(t[None] for t in parts.encoder.encoder.layout([])))
    else:
        example = sample_row(cfg, args.encoder, 0, 0, cfg.chunk_tiles, 0)[0]
    stage = parts.stages[0] if len(parts.stages) == 1 else parts.stages
    options = RuntimeOptions(
        mode=args.mode, microbatches=cfg.microbatches, trace=bool(os.environ.get("PYBUBBLE_TRACE")),
        pieces=PieceOptions(min_s=None if args.piece_ms is None else args.piece_ms / 1e3),
        balance=BalanceOptions(slots=balanced(args), replicas=balanced(args) and args.dp > 1,
                               pack_chunks=balanced(args) and args.pp == 1))
    runtime = EncoderRuntime(parts.encoder, stage=stage, schedule=parts.schedule, example=example, groups=parts.mesh,
                             options=options, device=parts.device)
    fault.encoder_pieces(runtime)
    if parts.first:
        parts.stage_modules[parts.stage_ids.index(0)].encoder_output = (
            runtime.encoder_output if args.encoder not in PACKED_KINDS
            else lambda k: parts.packs[k].tokens(runtime.encoder_output(k)))  # the images' tokens, padding left out
    return runtime


def make_profiler(args: argparse.Namespace, device: torch.device):
    """torch.profiler for the last step (``--profile``), else None."""
    if not args.profile:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return torch.profiler.profile(activities=activities)


def train_loop(parts: RankParts, runtime: EncoderRuntime, args: argparse.Namespace, cfg: ModelConfig,
               rank: int, fault: Fault, profiler) -> list[float]:
    """The steps: each step's batch (this replica's share), the runtime's step in place of the
    schedule's, the optimizer; returns when each step ended."""
    last = args.pp * chunks_of(args) - 1 in parts.stage_ids
    opt = torch.optim.SGD([*parts.encoder.parameters(), *(p for llm in parts.llms for p in llm.parameters())],
                          lr=cfg.lr)
    ends = []
    for step in range(args.steps):
        fault.before_step(step)
        images, inputs, targets = fault.data(step_inputs(parts, runtime, args, cfg, step))
        if profiler is not None and step == args.steps - 1:
            profiler.start()  # the last step only
        # torch 2.13: the first step infers the stages' shapes by running them for real, outside
        # DDP's no_sync, and that extra backward breaks the reducer's first bucket rebuild
        # ("rebuilt parameter indices size is not same as original model parameters size",
        # plain Schedule1F1B too). Under no_sync it is not recorded; the schedule still prepares
        # and all-reduces the last microbatch's backward.
        with contextlib.ExitStack() as no_sync:
            for llm in parts.llms:
                if step == 0 and isinstance(llm, nn.parallel.DistributedDataParallel):
                    no_sync.enter_context(llm.no_sync())
            runtime.step(images, *inputs, **({"target": targets.to(parts.device)} if last else {}))
        opt.step()
        opt.zero_grad()
        if parts.device.type == "cuda":
            torch.cuda.synchronize(parts.device)
        if step == 0:  # what the setup and the profiling step made stays: Python's full collections skip it
            gc.collect()
            gc.freeze()
        ends.append(time.perf_counter())
        if rank == 0:  # progress, on stderr: the report stays the one line on stdout
            took = ends[-1] - (ends[-2] if len(ends) > 1 else runtime.records[-1].start)
            print(f"[{args.mode}] step {step + 1}/{args.steps}: {took * 1e3:.1f} ms", file=sys.stderr, flush=True)
    return ends


def step_inputs(parts: RankParts, runtime: EncoderRuntime, args: argparse.Namespace, cfg: ModelConfig,
                step: int) -> tuple:
    """This replica's share of step ``step``: the encoder's input, the first stage's inputs (on
    its rank) and the targets. Varying data: the samples laid out over the slots as the runtime
    predicts best (:func:`replica_step`), the loss's factor set."""
    device = parts.device
    if args.data == "fixed":
        images, tokens, targets = (replica_slice(x, cfg, args.dp, parts.dp_rank)
                                   for x in make_batch(cfg, step, args.encoder))
        return images, (tokens.to(device), torch.arange(cfg.microbatches)) if parts.first else (), targets.to(device)
    data = replica_step(args, cfg, step, parts.dp_rank, runtime)
    parts.loss_scale[0] = args.dp / max(data.text_tokens, 1)
    parts.packs = data.packs
    inputs = (data.tokens.to(device), torch.arange(cfg.microbatches), data.image_len.to(device)) if parts.first else ()
    return data.encoder, inputs, data.targets.to(device)


def write_rank_files(runtime: EncoderRuntime, args: argparse.Namespace, rank: int, profiler) -> None:
    """The last step's own trace (``PYBUBBLE_TRACE``), plan (``--dump-plan``) and profile (``--profile``)."""
    if trace_path := os.environ.get("PYBUBBLE_TRACE"):
        with open(f"{trace_path}{'' if len(args.modes) == 1 else '.' + args.mode}.rank{rank}.json", "w") as f:
            json.dump({"start": runtime.records[-1].start, "events": runtime.records[-1].trace}, f)
    if args.dump_plan:
        folder = mode_path(args, args.dump_plan)
        os.makedirs(folder, exist_ok=True)
        runtime.plan.write(os.path.join(folder, f"rank{rank}.plan.json"))
    if profiler is not None:
        profiler.stop()
        folder = mode_path(args, args.profile)
        os.makedirs(folder, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(folder, f"rank{rank}.json"))
        if rank == 0:  # the LLM step the last step's plan predicted (pybubble measure --predict)
            save_trace(runtime.placement.timeline, os.path.join(folder, "plan.json"))


def rank_checksum(parts: RankParts, rank: int) -> float:
    """This rank's share of the parameters' float64 sum, each parameter once: the stages of dp
    replica 0 (tp rank 0), the encoder of rank 0 (every rank takes part: FSDP2 gathers over dp)."""
    stage_sum = sum(full_checksum(mod) for mod in parts.stage_modules)
    return ((stage_sum if parts.dp_rank == 0 and parts.tp_rank == 0 else 0.0)
            + (checksum([parts.encoder]) if rank == 0 else 0.0))


def train(rank: int, args: argparse.Namespace) -> dict[str, list[dict]] | None:
    """One rank's training (the process group is set up by torchrun or ``launch``), split as
    torchtitan splits its trainer: the mesh, then per mode (``--mode``, one or several in turn on
    the same ranks and mesh) the parallelized model, the pipeline, the encoder's runtime, the loop.
    Rank 0 returns every rank's figures by mode."""
    mesh = build_mesh(args, rank_device(args))
    figures = {mode: train_mode(rank, mode_args(args, mode), mesh) for mode in args.modes}
    return figures if rank == 0 else None


def train_mode(rank: int, args: argparse.Namespace, mesh) -> list[dict]:
    """One mode's training from a fresh model (the seed's weights): every rank's figures."""
    cfg, fault = config(args), Fault(args, rank)
    parts = parallelize(args, cfg, mesh, fault)
    build_pipeline(parts, args, cfg)
    runtime = build_runtime(parts, args, cfg, fault)
    profiler = make_profiler(args, parts.device)
    cuda = parts.device.type == "cuda"
    with torch.cuda.stream(llm_stream(parts.device)) if cuda else contextlib.nullcontext():
        ends = train_loop(parts, runtime, args, cfg, rank, fault, profiler)
    write_rank_files(runtime, args, rank, profiler)
    every = gather_figures(runtime, ends=ends, checksum=rank_checksum(parts, rank))
    return every
