"""A multimodal LLM trained with a pipeline, its vision encoder run by pybubble's EncoderRuntime: the
model, the mesh, the parallelisms and the loop of a trainer, and the runtime's calls (marked
``# pybubble``). Read it in one sitting; copy what your trainer lacks.

    python -m torch.distributed.run --nproc-per-node 2 examples/mllm.py --mode pybubble --steps 20
    python -m torch.distributed.run --nproc-per-node 4 examples/mllm.py --dp 2 --pp 2 --data mix
    python examples/mllm.py --ranks 2 --mode coarse --report report.json      # without torchrun

The model: a ViT (patches of each image tile, ``nn.TransformerEncoderLayer`` blocks, pooled to a few
tokens per tile) feeding a GPT whose blocks are cut into pipeline stages over the mesh's "pp"
dimension (torch's pipeline schedules), each stage sharded with FSDP2 (or wrapped in DDP) over "dp"
and, with ``--tp``, its MLPs tensor-parallel over "tp". Each sample is one row of the GPT's fixed
sequence: its images' tokens, then its text. The data: one single-tile image per sample
(``--data fixed``), the seeded open-VLM mix (``--data mix``) or your samples (``--data-file``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining
from torch.distributed.device_mesh import init_device_mesh

from pybubble.data.mix import MixSpec
from pybubble.data.samples import Samples
from pybubble.data.sources import add_data_options, data_name, data_source
from pybubble.runtime import (BalanceOptions, EncoderBatch, EncoderRuntime, RuntimeOptions, exit_rank, gather_report,
                              launch, run_rank)

SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "interleaved_1f1b": "ScheduleInterleaved1F1B",
             "zbv": "ScheduleZBVZeroBubble"}
"""--schedule: torch.distributed.pipelining's schedules (interleaved_1f1b and zbv: two stages per rank)."""


@dataclass(frozen=True, kw_only=True)
class Options:
    """The trainer's options (each one a command-line flag, ``--mode`` for ``mode``)."""

    mode: str = field(default="pybubble", metadata={"help": "megatron, coarse or pybubble"})
    """Where the encoder runs: inside the first stage, before and after the LLM, or in its bubbles."""
    ranks: int = field(default=0, metadata={"help": "processes to start without torchrun (default dp x pp x tp)"})
    """Processes to start without torchrun (0: dp x pp x tp)."""
    pp: int = field(default=2, metadata={"help": "pipeline ranks"})
    """Pipeline ranks."""
    dp: int = field(default=1, metadata={"help": "data-parallel replicas"})
    """Data-parallel replicas of the pipeline."""
    tp: int = field(default=1, metadata={"help": "tensor-parallel ranks of each stage (its MLPs)"})
    """Tensor-parallel ranks of each stage."""
    dp_wrap: str = field(default="fsdp", metadata={"help": "fsdp (FSDP2) or ddp"})
    """How the stages are data-parallel."""
    schedule: str = field(default="1f1b", metadata={"help": ", ".join(SCHEDULES)})
    """torch's pipeline schedule."""
    steps: int = field(default=20, metadata={"help": "training steps"})
    """Training steps."""
    microbatches: int = field(default=4, metadata={"help": "microbatches per step"})
    """Microbatches per step."""
    rows: int = field(default=2, metadata={"help": "samples per microbatch (of every replica together)"})
    """Samples per microbatch, over every replica."""
    balance: bool = field(default=True, metadata={"help": "pybubble lays out each step's samples (on/off)"})
    """pybubble mode: each step's samples laid out over the slots, the encoder work over the replicas."""
    device: str = field(default="cpu", metadata={"help": "cpu (gloo) or cuda (NCCL, one GPU per rank)"})
    """Where the ranks run."""
    report: str = field(default="", metadata={"help": "write the run's report (JSON) here"})
    """The report's file (pybubble.runtime_report/3; empty: none)."""
    data: str = "fixed"
    """The samples' source (``--data``, ``--data-file``: pybubble.data.sources)."""
    data_file: str | None = None
    """A file of samples (JSON lines)."""
    seed: int = 0
    """The seed of the weights and the data."""

    @property
    def world(self) -> int:
        """The ranks of the mesh."""
        return self.pp * self.dp * self.tp

    @property
    def chunks(self) -> int:
        """Pipeline stages per rank."""
        return 2 if self.schedule in ("interleaved_1f1b", "zbv") else 1

    def __post_init__(self) -> None:
        for name, choices in (("mode", ("megatron", "coarse", "pybubble")), ("dp_wrap", ("fsdp", "ddp")),
                              ("schedule", tuple(SCHEDULES)), ("device", ("cpu", "cuda"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not one of {', '.join(choices)}")
        for name in ("pp", "dp", "tp", "steps", "microbatches", "rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)} is not >= 1")
        if self.rows % self.dp or self.microbatches < self.pp:
            raise ValueError(f"rows: {self.rows} samples per microbatch over dp {self.dp}, {self.microbatches} "
                             f"microbatches over pp {self.pp}: dp must divide the rows, pp at most the microbatches")
        if HEADS % self.tp or (self.tp > 1 and self.schedule == "zbv") or (self.dp_wrap == "ddp" and self.schedule == "zbv"):
            raise ValueError(f"tp: {self.tp} with --schedule {self.schedule} and --dp-wrap {self.dp_wrap}: tp must divide "
                             f"{HEADS} heads; zbv splits the backward, which neither tp nor ddp runs here")


# -- the model --------------------------------------------------------------------------------------
PATCHES, PATCH_DIM, POOL = 16, 48, 4
"""Each image tile: 16 patches of 4 x 4 pixels x 3 channels, pooled 4 to 1 into 4 LLM tokens."""
ENC_DIM, ENC_LAYERS, DIM, HEADS, LAYERS, VOCAB, TEXT, MAX_TILES = 128, 8, 256, 4, 4, 512, 64, 32
"""Encoder width and depth; the GPT's width, heads, blocks (over every stage), vocabulary; the most
text tokens and image tiles of a sample."""
SEQ = MAX_TILES * PATCHES // POOL + TEXT
"""The GPT's sequence: the most image tokens of a sample, then its text."""


def block(dim: int) -> nn.Module:
    """A pre-norm transformer block (torch's own)."""
    return nn.TransformerEncoderLayer(dim, HEADS, 4 * dim, dropout=0.0, activation="gelu", batch_first=True,
                                      norm_first=True)


class Encoder(nn.Module):
    """A ViT: image tiles (tiles, patches, patch_dim) to LLM tokens (tiles, patches / POOL, DIM)."""

    def __init__(self):
        super().__init__()
        self.embed, self.pos = nn.Linear(PATCH_DIM, ENC_DIM), nn.Parameter(0.02 * torch.randn(PATCHES, ENC_DIM))
        self.blocks = nn.Sequential(*(block(ENC_DIM) for _ in range(ENC_LAYERS)))
        self.norm, self.proj = nn.LayerNorm(ENC_DIM), nn.Linear(ENC_DIM, DIM)

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        x = self.proj(self.norm(self.blocks(self.embed(tiles) + self.pos)))
        return x.unflatten(1, (-1, POOL)).mean(2)


class Stage(nn.Module):
    """Stage ``index`` of ``count`` of the GPT: the first embeds the text and takes the encoder's
    image tokens (``encoder_output``), the last ends in the head."""

    def __init__(self, index: int, count: int, rows: int):
        super().__init__()
        self.first, self.last, self.rows = index == 0, index == count - 1, rows
        self.embed = nn.Embedding(VOCAB, DIM) if self.first else None
        self.pos = nn.Parameter(0.02 * torch.randn(SEQ, DIM)) if self.first else None
        self.blocks = nn.ModuleList(block(DIM) for _ in range(LAYERS // count))
        self.head = nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)) if self.last else None
        self.encoder_output = None

    def forward(self, x: torch.Tensor, image_len: torch.Tensor | None = None, microbatch: torch.Tensor | None = None
                ) -> torch.Tensor:
        if self.first:
            x = self.embed(x)  # each row: its image positions (image_len of them) first
            if x.device.type != "meta":  # torch's pipelining infers the shapes on meta tensors first
                image = self.encoder_output(int(microbatch[0])).reshape(-1, DIM)  # pybubble
                front = (torch.arange(SEQ, device=x.device) < image_len[:, None])[..., None].expand_as(x)
                x = torch.where(front, x.new_zeros(()).expand_as(x).masked_scatter(front, image), x)
            x = x + self.pos
        causal = nn.Transformer.generate_square_subsequent_mask(SEQ, device=x.device)
        for b in self.blocks:
            x = b(x, src_mask=causal, is_causal=True)
        return self.head(x) if self.last else x


def stage_ids(rank: int, opts: Options) -> list[int]:
    """The stages rank ``rank`` holds, as torch's schedules place them (looped, or a V)."""
    if opts.schedule == "zbv":
        return [rank, 2 * opts.pp - 1 - rank]
    return [rank + c * opts.pp for c in range(opts.chunks)]


# -- the mesh and the parallelisms ----------------------------------------------------------------
def parallelize(stage: nn.Module, opts: Options, mesh) -> nn.Module:
    """A stage tensor-parallel over "tp" (its MLPs: torch's tensor parallelism) and data-parallel over
    "dp" (FSDP2, each block then the stage; or DDP)."""
    if opts.tp > 1:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for b in stage.blocks:
            parallelize_module(b, mesh["tp"], {"linear1": ColwiseParallel(), "linear2": RowwiseParallel()})
    if opts.dp == 1:
        return stage
    if opts.dp_wrap == "ddp":
        return nn.parallel.DistributedDataParallel(stage, process_group=mesh["dp"].get_group())
    from torch.distributed.fsdp import fully_shard

    for b in stage.blocks:  # zbv's W differentiates the weights the forward gathered: keep them
        fully_shard(b, mesh=mesh["dp"], reshard_after_forward=opts.schedule != "zbv")
    return fully_shard(stage, mesh=mesh["dp"])


def build(opts: Options, device: torch.device):
    """This rank's mesh, GPT stages, pipeline schedule, encoder and runtime."""
    dims, names = ((opts.pp, opts.dp, opts.tp), ("pp", "dp", "tp")) if opts.tp > 1 else ((opts.pp, opts.dp), ("pp", "dp"))
    mesh = init_device_mesh(device.type, dims, mesh_dim_names=names)
    rank, count = mesh["pp"].get_local_rank(), opts.pp * opts.chunks
    modules = []
    for s in stage_ids(rank, opts):
        torch.manual_seed(opts.seed + 1 + s)  # each stage's weights from its own seed, whatever the layout
        modules.append(Stage(s, count, opts.rows // opts.dp).to(device))
    stages = [pipelining.PipelineStage(parallelize(m, opts, mesh), s, count, device, group=mesh["pp"].get_group())
              for m, s in zip(modules, stage_ids(rank, opts))]
    scale = [1.0]  # the loss's factor this step: dp over the step's targets (set each step)

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum") * scale[0]

    schedule_class = getattr(pipelining, SCHEDULES[opts.schedule])
    schedule = schedule_class(stages[0] if opts.chunks == 1 else stages, opts.microbatches, loss_fn=loss,
                              scale_grads=False)
    torch.manual_seed(opts.seed)
    encoder = Encoder().to(device)
    balance = opts.balance and opts.mode == "pybubble" and opts.data != "fixed"
    runtime = EncoderRuntime(  # pybubble (1): the encoder, traced on one chunk of 8 tiles and cut into pieces
        encoder, stage=stages if opts.chunks > 1 else stages[0], schedule=schedule, groups=mesh,
        example=torch.zeros(8, PATCHES, PATCH_DIM, device=device), device=device,
        options=RuntimeOptions(mode=opts.mode, balance=BalanceOptions(
            slots=balance, replicas=balance and opts.dp > 1, pack_chunks=balance and opts.pp == 1)))
    for m in modules:
        if m.first:
            m.encoder_output = runtime.encoder_output  # pybubble (2): the first stage's image tokens
    return mesh, modules, schedule, encoder, runtime, scale


# -- the data -------------------------------------------------------------------------------------
def step_samples(opts: Options, step: int, source: MixSpec | Samples | None) -> Samples:
    """The whole step's samples, the same on every rank: one single-tile image each (fixed), the
    mix's (from the seed), or the file's in its order."""
    n = opts.microbatches * opts.rows
    if source is None:
        return Samples.of([[1]] * n, [TEXT] * n)
    if isinstance(source, MixSpec):
        return source.draw(n, np.random.default_rng(opts.seed * 100003 + step))
    return source.take((step * n + np.arange(n)) % len(source))


def sample_row(opts: Options, step: int, i: int, tiles: int, text: int) -> tuple[torch.Tensor, ...]:
    """Sample ``i`` of step ``step`` from its own seed: its tiles, its token row (image positions
    and padding 0) and its targets (the next text token, -100 elsewhere)."""
    g = torch.Generator().manual_seed((opts.seed * 100003 + step) * 65537 + i)
    pixels = torch.randn(tiles, PATCHES, PATCH_DIM, generator=g)
    words = torch.randint(0, VOCAB, (text + 1,), generator=g)
    at = tiles * PATCHES // POOL
    ids, target = torch.zeros(SEQ, dtype=torch.long), torch.full((SEQ,), -100, dtype=torch.long)
    ids[at:at + text], target[at:at + text] = words[:-1], words[1:]
    return pixels, ids, target


def replica_batch(opts: Options, step: int, replica: int, samples: Samples, runtime: EncoderRuntime):
    """This replica's share of the step, laid out over the slots as the runtime chooses: the encoder's
    batch, the first stage's inputs, the targets."""
    m, rows = opts.microbatches, opts.rows // opts.dp
    mine = np.arange(replica * m * rows, (replica + 1) * m * rows)
    tiles = samples.sample_tiles[mine]
    layout = runtime.lay_out(tiles)  # pybubble: the samples' slots (balanced and priced, or as given)
    order = mine[layout.order]
    parts = [sample_row(opts, step, int(i), int(samples.sample_tiles[i]), int(samples.text[i])) for i in order]
    per_sample = np.split(samples.tiles, np.cumsum(samples.images)[:-1])
    slots = [order[k * rows:(k + 1) * rows] for k in range(m)]
    batch = EncoderBatch([torch.cat([parts[k * rows + r][0] for r in range(rows)]) for k in range(m)],
                         [[int(t) for i in slot for t in per_sample[i]] for slot in slots])
    image_len = torch.as_tensor(samples.sample_tiles[order] * PATCHES // POOL)
    return batch, torch.stack([p[1] for p in parts]), image_len, torch.stack([p[2] for p in parts])


# -- the loop -------------------------------------------------------------------------------------
def train(rank: int, opts: Options) -> None:
    """One rank's training; rank 0 writes the report."""
    device = torch.device("cuda", torch.cuda.current_device()) if opts.device == "cuda" else torch.device("cpu")
    mesh, modules, schedule, encoder, runtime, scale = build(opts, device)
    first, last = any(m.first for m in modules), any(m.last for m in modules)
    params = [*encoder.parameters(), *(p for m in modules for p in m.parameters())]
    opt = torch.optim.SGD(params, lr=0.05)
    source = data_source(argparse.Namespace(data=opts.data, data_file=opts.data_file), tokens_per_tile=PATCHES // POOL,
                         max_tiles=MAX_TILES, max_tokens=SEQ, mix=MixSpec(text_median=TEXT / 2, text_max=TEXT))
    ends = []
    for step in range(opts.steps):
        samples = step_samples(opts, step, source)
        scale[0] = opts.dp / max(int(samples.text.sum()), 1)  # the step's mean over its targets, on every replica
        batch, tokens, image_len, targets = replica_batch(opts, step, mesh["dp"].get_local_rank(), samples, runtime)
        inputs = (tokens.to(device), image_len.to(device), torch.arange(opts.microbatches)) if first else ()
        runtime.step(batch, *inputs, **({"target": targets.to(device)} if last else {}))  # pybubble (3)
        opt.step()
        opt.zero_grad()
        ends.append(time.perf_counter())
        if rank == 0:
            print(f"[{opts.mode}] step {step + 1}/{opts.steps}", file=sys.stderr, flush=True)
    run = {"mode": opts.mode, "schedule": opts.schedule, "chunks": opts.chunks, "pp": opts.pp, "dp": opts.dp,
           "dp_wrap": opts.dp_wrap if opts.dp > 1 else None, "device": opts.device}
    report = gather_report(runtime, run, ends=ends, checksum=checksum(encoder, modules, mesh, rank))
    if report is not None:
        if opts.report:
            with open(opts.report, "w") as f:
                json.dump(report, f, indent=1)
        print(f"{opts.mode}: median step {report['median_step_s'] * 1e3:.1f} ms, predicted "
              f"{report['predicted_step_s'] * 1e3:.1f} ms, param_checksum {report['param_checksum']:.9g}")


def checksum(encoder: nn.Module, modules: list[nn.Module], mesh, rank: int) -> float:
    """This rank's share of the parameters' float64 sum (each parameter counted once: the stages on
    replica 0's tp rank 0, the encoder on rank 0; FSDP2's shards gathered on every rank)."""
    def total(module: nn.Module) -> float:
        return float(sum((p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().sum()
                         for p in module.parameters()))
    stages = sum(total(m) for m in modules)
    owner = mesh["dp"].get_local_rank() == 0 and ("tp" not in (mesh.mesh_dim_names or ()) or mesh["tp"].get_local_rank() == 0)
    return (stages if owner else 0.0) + (total(encoder) if rank == 0 else 0.0)


def parse(argv: list[str] | None = None) -> Options:
    """The options of command line ``argv`` (ValueError naming a bad one)."""
    p = argparse.ArgumentParser(prog="python examples/mllm.py", description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(Options):
        if "help" in f.metadata:
            kind = (lambda v: v == "on") if f.type == "bool" else int if f.type == "int" else str
            p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default, help=f.metadata["help"]
                           + (" (on or off)" if f.type == "bool" else ""))
    add_data_options(p, ("fixed", "mix"), default="fixed", file_use="replayed in the file's order")
    a = p.parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    values = {f.name: getattr(a, f.name) for f in dataclasses.fields(Options) if "help" in f.metadata}
    opts = Options(**values, data=data_name(a), data_file=a.data_file)
    ranks = int(os.environ["WORLD_SIZE"]) if torchrun else (opts.ranks or opts.world)
    if ranks != opts.world:
        raise ValueError(f"ranks: {ranks} processes, but the mesh is pp {opts.pp} x dp {opts.dp} x tp {opts.tp}")
    return dataclasses.replace(opts, ranks=ranks)


def main(argv: list[str] | None = None) -> int:
    try:
        opts = parse(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    backend = "nccl" if opts.device == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun started this rank
        run_rank(train, opts, backend=backend)
        exit_rank(0)
    try:
        launch(train, opts.ranks, opts, backend=backend)  # the same path, its ranks started here
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
