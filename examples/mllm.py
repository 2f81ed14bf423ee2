"""A small multimodal LLM trained with a pipeline (1F1B, or another torch.distributed.pipelining
schedule) over CPU ranks (gloo) or GPUs (NCCL, one per
rank), on a DeviceMesh ("pp", "dp") as torchtitan builds it, its LLM stages sharded with FSDP2 or
wrapped in DDP over "dp", its vision encoder run by pybubble.runtime.EncoderRuntime the Megatron
way (inside stage 0), coarse (spread over the ranks, before and after the LLM) or pybubble (its
pieces inside the pipeline's bubbles). User code of the runtime's API: the runtime does the
profiling, the plan and the encoder's gradient sync.

    python -m torch.distributed.run --nproc-per-node 2 examples/mllm.py --mode pybubble --steps 8
    python -m torch.distributed.run --nproc-per-node 4 examples/mllm.py --dp 2 --pp 2 --dp-wrap ddp
    python examples/mllm.py --ranks 2 --steps 20 --mode pybubble [--encoder vit|timm|clip] [--profile DIR]
        [--schedule 1f1b|gpipe|interleaved_1f1b|interleaved_zb|zbv|dualpipev] [--chunks V]
    pybubble measure DIR --predict DIR/plan.json

Without torchrun the example starts its ranks itself (pybubble.runtime.launch, the same code path).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import signal
import socket
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining

import pybubble
from pybubble.runtime import PLACEMENTS, EncoderRuntime, consumer_delays, exit_rank, launch, llm_stream, run_rank
from pybubble.runtime.cuda import serialised_streams_note

ENCODERS = ("vit", "timm", "clip")
SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "interleaved_1f1b": "ScheduleInterleaved1F1B",
             "interleaved_zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
             "dualpipev": "ScheduleDualPipeV"}
"""--schedule: torch.distributed.pipelining's schedule classes (the last two hold two stages per
rank in a V: the first and the last stage on rank 0)."""
PLANNED_SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b", "zbv")
"""--schedule values that --write-config can describe (the planner's own schedule names)."""
SINGLE_STAGE = ("1f1b", "gpipe")
V_SHAPED = ("zbv", "dualpipev")
SPLIT_BACKWARD = ("interleaved_zb", "zbv", "dualpipev")
"""Schedules that split some backwards into I and W."""
DP_WRAPS = ("fsdp", "ddp")
FAULTS = ("raise", "kill", "stall", "encoder", "slow", "tile_shape", "empty_step")
"""Injected faults (tests): raise before the step, SIGKILL in the middle of a forward, sleep far
past the timeout there, raise inside an encoder piece, run every LLM forward twice as long; with
varying data, hand the runtime a tile of the wrong shape, or a step without microbatches (on the
failing rank only: every rank must refuse the step)."""


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Sizes of the example's encoder and GPT, and of its batch."""

    microbatches: int = 4
    """LLM (and encoder) microbatches per step."""
    microbatch_size: int = 2
    """Samples per microbatch."""
    patches: int = 128
    """Image patches per sample (vit: the encoder's sequence length); timm and clip cut a square
    image into the largest square number of patches of ``patch`` x ``patch`` pixels that fits."""
    patch: int = 8
    """Patch side in pixels (vit: patch_dim = 3 * patch * patch)."""
    enc_dim: int = 128
    enc_layers: int = 12
    enc_heads: int = 4
    llm_dim: int = 256
    llm_layers_per_stage: int = 2
    """GPT blocks per pipeline rank (``--chunks V``: split over its V stages; the same GPT
    whatever the schedule)."""
    llm_heads: int = 4
    text_len: int = 64
    """Text tokens per sample."""
    vocab: int = 512
    lr: float = 0.05
    seed: int = 0
    pool: int = 1
    """Varying data: the encoder's tokens of a tile averaged in groups of this many into one LLM
    token (a pixel shuffle's reduction; 1 with ``--data fixed``)."""
    chunk_tiles: int = 8
    """Varying data: tiles the encoder's pieces run on at a time (a chunk of the pieces' fixed shape)."""
    max_tiles: int = 32
    """Varying data: the most tiles of one sample (its images' together); the LLM's sequence holds
    them all (``seq_len``)."""

    @property
    def seq_len(self) -> int:
        """Varying data: the LLM's fixed sequence per sample: the most image tokens and text."""
        return self.max_tiles * (self.patches // self.pool) + self.text_len

    def __post_init__(self) -> None:
        for name in ("microbatches", "microbatch_size", "patches", "patch", "enc_dim", "enc_layers", "enc_heads",
                     "llm_dim", "llm_layers_per_stage", "llm_heads", "text_len", "vocab", "pool", "chunk_tiles",
                     "max_tiles"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: {v!r} is not an integer >= 1")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr: {self.lr!r} is not a number > 0")
        if self.patches % self.pool:
            raise ValueError(f"pool: {self.pool} does not divide the {self.patches} patches of a tile")


SIZES = {
    "small": ModelConfig(),
    "tiny": ModelConfig(microbatches=2, microbatch_size=2, patches=4, patch=4, enc_dim=16, enc_layers=2,
                        enc_heads=2, llm_dim=16, llm_layers_per_stage=2, llm_heads=2, text_len=8, vocab=32),
}
VARYING_SIZES = {
    "small": dataclasses.replace(SIZES["small"], patches=16, pool=4, chunk_tiles=8, max_tiles=32),
    "tiny": dataclasses.replace(SIZES["tiny"], patches=4, pool=2, chunk_tiles=4, max_tiles=32),
}
"""The sizes under ``--data mix`` and ``--data-file``: a tile of ``patches`` patches, ``patches /
pool`` LLM tokens per tile, up to ``max_tiles`` tiles per sample (a 32-frame video), text up to
``text_len`` tokens: one sample's sequence is ``seq_len`` tokens."""
DATA = ("fixed", "mix", "file")
"""--data: one image per sample, the same shape every step (fixed); samples from a seeded open-VLM
mix (mix); a user's samples (--data-file)."""


# -- models ------------------------------------------------------------------------------------
class ViTBlock(nn.Module):
    """A pre-norm transformer block written with ``nn.Linear`` and ``scaled_dot_product_attention``
    (``causal=True`` for a GPT block)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4, causal: bool = False):
        super().__init__()
        self.head_dim, self.causal = dim // heads, causal
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # qkv's outputs grouped by head (q, k, v of head 0, then of head 1, ...): a column-wise
        # split over tensor-parallel ranks (apply_tp) gives each rank whole heads (-1: the heads here).
        q, k, v = self.qkv(self.norm1(x)).view(b, t, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class PatchEmbed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear = nn.Linear(3 * cfg.patch * cfg.patch, cfg.enc_dim)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.patches, cfg.enc_dim))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.linear(patches) + self.pos


def import_vision_libraries() -> None:
    """Makes timm and transformers importable beside a CPU-only torch: PyPI's torchvision wheels
    link CUDA torch libraries, so beside the CPU build their operator library does not load and
    ``import torchvision`` fails registering ``torchvision::nms``; defining the two operators' schemas
    lets its pure-Python models import (nothing here calls them)."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for name in ("nms", "qnms"):
            lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _keep.append(lib)
        for mod in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[mod]


_keep: list = []


class LastHidden(nn.Module):
    """A Hugging Face vision tower's ``last_hidden_state``."""

    def __init__(self, tower: nn.Module):
        super().__init__()
        self.tower = tower

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.tower(pixel_values=pixels).last_hidden_state


def image_grid(cfg: ModelConfig) -> int:
    """Patches per side of the square image timm and clip take: the most that ``patches`` allows."""
    return math.isqrt(cfg.patches)


def image_side(cfg: ModelConfig) -> int:
    return image_grid(cfg) * cfg.patch


def build_encoder(cfg: ModelConfig, kind: str = "vit") -> nn.Module:
    """The vision encoder and a projection to the LLM's width (random weights from the seed)."""
    torch.manual_seed(cfg.seed)
    if kind == "vit":
        tower = nn.Sequential(PatchEmbed(cfg), *(ViTBlock(cfg.enc_dim, cfg.enc_heads) for _ in range(cfg.enc_layers)),
                              nn.LayerNorm(cfg.enc_dim))
    elif kind == "timm":
        import_vision_libraries()
        from timm.models.vision_transformer import VisionTransformer

        tower = VisionTransformer(img_size=image_side(cfg), patch_size=cfg.patch, embed_dim=cfg.enc_dim,
                                  depth=cfg.enc_layers, num_heads=cfg.enc_heads, num_classes=0, global_pool="",
                                  class_token=False)
    elif kind == "clip":
        import_vision_libraries()
        from transformers import CLIPVisionConfig, CLIPVisionModel

        tower = LastHidden(CLIPVisionModel(CLIPVisionConfig(
            hidden_size=cfg.enc_dim, intermediate_size=4 * cfg.enc_dim, num_hidden_layers=cfg.enc_layers,
            num_attention_heads=cfg.enc_heads, image_size=image_side(cfg), patch_size=cfg.patch,
            attention_dropout=0.0)))
    else:
        raise ValueError(f"encoder: {kind!r} is not one of {', '.join(ENCODERS)}")
    head = [nn.Linear(cfg.enc_dim, cfg.llm_dim)] + ([TokenPool(cfg.pool)] if cfg.pool > 1 else [])
    return nn.Sequential(tower, *head)


class TokenPool(nn.Module):
    """A tile's tokens averaged in groups of ``pool`` (fewer LLM tokens per tile)."""

    def __init__(self, pool: int):
        super().__init__()
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(1, (-1, self.pool)).mean(2)


def encoder_tokens(cfg: ModelConfig, kind: str) -> int:
    """Image tokens the encoder gives per sample, or per tile with varying data (CLIP adds a class
    token)."""
    return (cfg.patches if kind == "vit" else image_grid(cfg) ** 2 + (kind == "clip")) // cfg.pool


class FirstStage(nn.Module):
    """Token embedding, image tokens from the encoder, the first GPT blocks. ``encoder_output(k)``
    gives the image tokens of microbatch k. Fixed data: each sample's image tokens in front of its
    text. Varying data (``packed``): each sample one row of ``seq_len`` tokens, its image tokens
    (``image_len`` of them, its tiles' in order) first, then its text, then padding."""

    def __init__(self, cfg: ModelConfig, image_tokens: int, blocks: list[nn.Module], packed: bool = False):
        super().__init__()
        self.packed = packed
        self.embed = nn.Embedding(cfg.vocab, cfg.llm_dim)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.seq_len if packed else image_tokens + cfg.text_len,
                                                   cfg.llm_dim))
        self.blocks = nn.Sequential(*blocks)
        self.encoder_output = None
        self.image_shape = (cfg.microbatch_size, image_tokens, cfg.llm_dim)

    def forward(self, tokens: torch.Tensor, microbatch: torch.Tensor, image_len: torch.Tensor | None = None
                ) -> torch.Tensor:
        if self.packed:
            return self.blocks(self.with_images(tokens, microbatch, image_len) + self.pos)
        if tokens.device.type == "meta":  # shape inference by torch.distributed.pipelining
            image = torch.zeros(self.image_shape, device="meta")
        else:
            image = self.encoder_output(int(microbatch[0]))
        return self.blocks(torch.cat([image, self.embed(tokens)], dim=1) + self.pos)

    def with_images(self, tokens: torch.Tensor, microbatch: torch.Tensor, image_len: torch.Tensor) -> torch.Tensor:
        """The rows' embeddings with each row's first ``image_len`` positions its image tokens."""
        x = self.embed(tokens)
        if tokens.device.type == "meta":
            return x
        image = self.encoder_output(int(microbatch[0])).reshape(-1, x.shape[-1])
        mask = (torch.arange(tokens.shape[1], device=tokens.device) < image_len[:, None])[..., None].expand_as(x)
        return torch.where(mask, x.new_zeros(()).expand_as(x).masked_scatter(mask, image), x)


def text_positions(x: torch.Tensor, text_len: int) -> torch.Tensor:
    """The last ``text_len`` positions of ``x`` (0: all of them, ``x`` itself)."""
    return x[:, -text_len:] if text_len else x


class MiddleStage(nn.Module):
    def __init__(self, cfg: ModelConfig, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class LastStage(MiddleStage):
    """The last GPT blocks and the head: logits of the text positions (fixed data), of every
    position (``packed``: the loss skips those without a target)."""

    def __init__(self, cfg: ModelConfig, blocks: list[nn.Module], packed: bool = False):
        super().__init__(cfg, blocks)
        torch.manual_seed(cfg.seed + 2)
        self.norm = nn.LayerNorm(cfg.llm_dim)
        self.head = nn.Linear(cfg.llm_dim, cfg.vocab)
        self.text_len = 0 if packed else cfg.text_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(text_positions(self.blocks(x), self.text_len)))


class OnlyStage(FirstStage):
    """The whole GPT as one stage (a pipeline of one rank)."""

    def __init__(self, cfg: ModelConfig, image_tokens: int, blocks: list[nn.Module], packed: bool = False):
        super().__init__(cfg, image_tokens, blocks, packed)
        torch.manual_seed(cfg.seed + 2)  # as LastStage's
        self.norm = nn.LayerNorm(cfg.llm_dim)
        self.head = nn.Linear(cfg.llm_dim, cfg.vocab)
        self.text_len = 0 if packed else cfg.text_len

    def forward(self, tokens: torch.Tensor, microbatch: torch.Tensor, image_len: torch.Tensor | None = None
                ) -> torch.Tensor:
        return self.head(self.norm(text_positions(super().forward(tokens, microbatch, image_len), self.text_len)))


def build_stages(cfg: ModelConfig, ranks: int, kind: str = "vit", chunks: int = 1,
                 packed: bool = False) -> list[nn.Module]:
    """The GPT (``ranks * llm_layers_per_stage`` blocks) cut into ``ranks * chunks`` pipeline
    stages: the same initial weights whatever the rank and the cut (one stage: the whole GPT);
    ``packed``: for varying data (:class:`FirstStage`)."""
    layers, count = ranks * cfg.llm_layers_per_stage, ranks * chunks
    if layers % count:
        raise ValueError(f"chunks: {layers} GPT blocks do not split into {ranks} x {chunks} stages")
    blocks = []
    for i in range(layers):
        torch.manual_seed(cfg.seed + 1000 + i)
        blocks.append(ViTBlock(cfg.llm_dim, cfg.llm_heads, causal=True))
    per = layers // count
    stages: list[nn.Module] = []
    for s in range(count):
        mine = blocks[s * per:(s + 1) * per]
        torch.manual_seed(cfg.seed + 1)
        stages.append(OnlyStage(cfg, encoder_tokens(cfg, kind), mine, packed) if count == 1
                      else FirstStage(cfg, encoder_tokens(cfg, kind), mine, packed) if s == 0
                      else LastStage(cfg, mine, packed) if s == count - 1 else MiddleStage(cfg, mine))
    return stages


def stages_of_rank(rank: int, ranks: int, schedule: str, chunks: int) -> list[int]:
    """The pipeline stages rank ``rank`` holds: ``rank + c * ranks`` (looped schedules), or ``rank``
    and ``2 * ranks - 1 - rank`` (V-shaped ones), as torch's schedules place them."""
    if schedule in V_SHAPED:
        return [rank, 2 * ranks - 1 - rank]
    return [rank + c * ranks for c in range(chunks)]


def make_batch(cfg: ModelConfig, step: int, kind: str = "vit") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic images (vit: flattened patches), tokens and next tokens of one step, from the seed."""
    g = torch.Generator().manual_seed(cfg.seed * 100003 + step)
    b = cfg.microbatches * cfg.microbatch_size
    if kind == "vit":
        images = torch.randn(b, cfg.patches, 3 * cfg.patch * cfg.patch, generator=g)
    else:
        images = torch.randn(b, 3, image_side(cfg), image_side(cfg), generator=g)
    tokens = torch.randint(0, cfg.vocab, (b, cfg.text_len + 1), generator=g)
    return images, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


# -- varying data: samples of text and 0..N images of 1..T tiles ---------------------------------
def example_mix(cfg: ModelConfig):
    """The open-VLM mix (pybubble.data.mix.MixSpec: its shares of text-only, single-image,
    multi-image and video samples, its tiles) with text scaled to the example's ``text_len``."""
    from pybubble.data.mix import MixSpec

    return MixSpec(text_median=cfg.text_len / 2, text_max=cfg.text_len)


def step_samples(args: argparse.Namespace, cfg: ModelConfig, step: int):
    """The whole step's samples (every rank takes the same): the mix's (from the seed), or the data
    file's in its order, from its start again when they run out (shuffle the file to replay a
    distribution)."""
    from pybubble.data.mix import mix

    n = cfg.microbatches * cfg.microbatch_size
    if args.data == "mix":
        return mix(n, seed=cfg.seed * 100003 + step, spec=example_mix(cfg))
    return args.samples.take((step * n + np.arange(n)) % len(args.samples))


def sample_row(cfg: ModelConfig, kind: str, step: int, i: int, tiles: int, text: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample ``i`` of step ``step`` (its own seed, whatever its place in the batch): its tiles'
    pixels, its row of ``seq_len`` token ids (image positions and padding 0) and its targets (the
    next text token at each text position, -100 elsewhere)."""
    g = torch.Generator().manual_seed((cfg.seed * 100003 + step) * 65537 + i)
    shape = (cfg.patches, 3 * cfg.patch * cfg.patch) if kind == "vit" else (3, image_side(cfg), image_side(cfg))
    pixels = torch.randn(tiles, *shape, generator=g)
    words = torch.randint(0, cfg.vocab, (text + 1,), generator=g)
    at = tiles * encoder_tokens(cfg, kind)
    ids = torch.zeros(cfg.seq_len, dtype=torch.long)
    target = torch.full((cfg.seq_len,), -100, dtype=torch.long)
    ids[at:at + text], target[at:at + text] = words[:-1], words[1:]
    return pixels, ids, target


@dataclass
class StepInput:
    """One replica's share of one step, its samples in the LLM slots they run in."""

    encoder: object
    """pybubble.runtime.EncoderBatch: each slot's tiles."""
    tokens: torch.Tensor
    """(microbatches x rows, seq_len) token ids, slot by slot."""
    image_len: torch.Tensor
    """Image tokens at the front of each row."""
    targets: torch.Tensor
    text_tokens: int
    """Targets of the whole step (every replica's): the loss is their sum over this."""
    slot_tiles: list[int]
    """Tiles of each slot, as run."""
    given_tiles: list[int]
    """Tiles of each slot in the given order (without balancing)."""
    layout: str = "given"
    """The layout chosen (pybubble.schedule.balance.row_layouts' name)."""


def replica_step(args: argparse.Namespace, cfg: ModelConfig, step: int, replica: int, runtime) -> StepInput:
    """Replica ``replica``'s samples of step ``step`` (its contiguous share), ``microbatch_size /
    dp`` rows per LLM microbatch: in the given order (``--balance off``), or in the layout over the
    slots (pybubble.schedule.balance.row_layouts: as given, balanced on their tiles, packed into the
    fewest chunks of ``chunk_tiles``, each ordered light first and last or heaviest in the most room
    of the last plan) whose step ``runtime`` predicts shortest."""
    from pybubble.runtime import EncoderBatch
    from pybubble.schedule.balance import deadline_gaps, row_layouts

    samples = step_samples(args, cfg, step)
    m, rows = cfg.microbatches, cfg.microbatch_size // args.dp
    mine = np.arange(replica * m * rows, (replica + 1) * m * rows)
    tiles, text = samples.sample_tiles[mine], samples.text[mine]
    given = np.arange(mine.size) // rows
    slot, layout = given, "given"
    if balanced(args) and runtime.costs is not None:
        problem = runtime.placement.problem if runtime.placement is not None else None
        layouts = row_layouts(tiles, m, rows, None if problem is None else deadline_gaps(problem), cfg.chunk_tiles)
        layout = min(layouts, key=lambda n: runtime.predict(np.bincount(layouts[n], weights=tiles, minlength=m)))
        slot = layouts[layout]
    run = np.lexsort((np.arange(mine.size), slot))  # samples by slot, in the given order within one
    parts = [sample_row(cfg, args.encoder, step, int(mine[i]), int(tiles[i]), int(text[i])) for i in run]
    pixels = [torch.cat([parts[r][0] for r in range(k * rows, (k + 1) * rows)]) for k in range(m)]
    per_sample = np.split(samples.tiles, np.cumsum(samples.images)[:-1])  # each sample's images' tiles
    images = [[int(t) for r in run[k * rows:(k + 1) * rows] for t in per_sample[mine[r]]] for k in range(m)]
    per_tile = encoder_tokens(cfg, args.encoder)
    return StepInput(encoder=EncoderBatch(pixels, images), tokens=torch.stack([p[1] for p in parts]),
                     image_len=torch.as_tensor(tiles[run] * per_tile), targets=torch.stack([p[2] for p in parts]),
                     text_tokens=int(samples.text.sum()), slot_tiles=[int(x.shape[0]) for x in pixels],
                     given_tiles=np.bincount(given, weights=tiles, minlength=m).astype(int).tolist(), layout=layout)


def balanced(args: argparse.Namespace) -> bool:
    """Whether this mode's steps are balanced (``--balance on``, pybubble only: megatron and coarse
    run the samples as given, each replica its own)."""
    return args.data != "fixed" and args.balance == "on" and args.mode == "pybubble"


def packed_loss(scale: list[float]):
    """The loss of varying data: the targets' cross entropy summed, times ``scale[0]`` (the data
    parallel degree over the step's targets: the replicas' averaged gradients are those of the
    step's mean over its targets, whatever the samples' order and slots)."""
    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum") * scale[0]
    return loss


def loss_fn(cfg: ModelConfig):
    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten()) / cfg.microbatches
    return loss


def checksum(modules) -> float:
    """float64 sum of all parameters."""
    return float(sum(p.detach().double().sum() for m in modules for p in m.parameters()))


def apply_tp(stage: nn.Module, tp_mesh) -> None:
    """The stage's GPT blocks tensor-parallel over ``tp_mesh`` (the mesh's "tp" dimension) with torch's
    own tensor parallelism, as torchtitan's ``apply_tp`` does for its llama: the attention's qkv and
    the MLP's first layer column-wise, their output projections row-wise (an all-reduce after each
    in the forward, one for the input gradient of each column-wise layer in the backward);
    embedding, norms and head replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in stage.blocks:
        parallelize_module(block, tp_mesh, {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                                            "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


def reference_checksum(cfg: ModelConfig, ranks: int, steps: int, kind: str = "vit") -> float:
    """The same training in one process, unsplit: the parameters the pipeline runs must reach."""
    encoder, stages = build_encoder(cfg, kind), build_stages(cfg, ranks, kind)
    params = [p for m in (encoder, *stages) for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr)
    loss = loss_fn(cfg)
    for step in range(steps):
        images, tokens, targets = make_batch(cfg, step, kind)
        for k in range(cfg.microbatches):
            sl = slice(k * cfg.microbatch_size, (k + 1) * cfg.microbatch_size)
            image = encoder(images[sl])
            stages[0].encoder_output = lambda _k, image=image: image
            x = stages[0](tokens[sl], torch.tensor([k]))
            for s in stages[1:]:
                x = s(x)
            loss(x, targets[sl]).backward()
        opt.step()
        opt.zero_grad()
    return checksum((encoder, *stages))


def reference_varying(args: argparse.Namespace, cfg: ModelConfig) -> float:
    """The same training on varying data in one process, unsplit, the step's samples in their
    given order: the parameters every mode and balance must reach."""
    kind = args.encoder
    encoder, stages = build_encoder(cfg, kind), build_stages(cfg, args.pp, kind, packed=True)
    opt = torch.optim.SGD([p for m in (encoder, *stages) for p in m.parameters()], lr=cfg.lr)
    scale = [0.0]
    loss, per_tile = packed_loss(scale), encoder_tokens(cfg, kind)
    for step in range(args.steps):
        samples = step_samples(args, cfg, step)
        scale[0] = 1.0 / max(int(samples.text.sum()), 1)
        tiles = samples.sample_tiles
        rows = [sample_row(cfg, kind, step, i, int(tiles[i]), int(samples.text[i])) for i in range(len(samples))]
        for k in range(cfg.microbatches):
            mine = range(k * cfg.microbatch_size, (k + 1) * cfg.microbatch_size)
            pixels = torch.cat([rows[i][0] for i in mine])
            image = encoder(pixels) if pixels.shape[0] else torch.zeros(0, per_tile, cfg.llm_dim)
            stages[0].encoder_output = lambda _k, image=image: image
            x = stages[0](torch.stack([rows[i][1] for i in mine]), torch.tensor([k]),
                          torch.as_tensor(tiles[list(mine)] * per_tile))
            for st in stages[1:]:
                x = st(x)
            loss(x, torch.stack([rows[i][2] for i in mine])).backward()
        opt.step()
        opt.zero_grad()
    return checksum((encoder, *stages))


# -- one rank: the training loop ---------------------------------------------------------------
def replica_slice(x: torch.Tensor, cfg: ModelConfig, dp: int, replica: int) -> torch.Tensor:
    """Data-parallel replica ``replica``'s share of a step's batch: its ``microbatch_size / dp``
    samples of every microbatch (the replicas' averaged gradients are the whole batch's)."""
    per = cfg.microbatch_size // dp
    m = cfg.microbatches
    return x.view(m, cfg.microbatch_size, *x.shape[1:])[:, replica * per:(replica + 1) * per].reshape(m * per, *x.shape[1:])


def full_checksum(module: nn.Module) -> float:
    """float64 sum of a module's parameters, FSDP2-sharded ones gathered (a collective over dp)."""
    return float(sum((p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().sum()
                     for p in module.parameters()))


class Fault:
    """An injected fault (``--fault`` on ``--fail-rank`` at ``--fail-step``): see :data:`FAULTS`."""

    def __init__(self, args: argparse.Namespace, rank: int):
        self.kind, self.step = args.fault, args.fail_step
        self.on = rank == args.fail_rank
        self.rank, self.timeout = rank, args.timeout
        self.now = -1
        """The running step."""

    def before_step(self, step: int) -> None:
        self.now = step
        if self.on and self.kind == "raise" and step == self.step:
            raise RuntimeError(f"injected fault on rank {self.rank} at step {step} (--fail-rank/--fail-step)")

    def data(self, step: tuple) -> tuple:
        """The step's inputs, spoilt on the failing rank (``tile_shape``, ``empty_step``)."""
        if not (self.on and self.now == self.step and self.kind in ("tile_shape", "empty_step")):
            return step
        from pybubble.runtime import EncoderBatch

        batch = step[0]
        if self.kind == "empty_step":
            return (EncoderBatch([]), *step[1:])
        first = batch.inputs[0][0]
        wrong = torch.zeros((1, *first.shape[1:-1], first.shape[-1] + 1), dtype=first.dtype)
        return (EncoderBatch([(wrong,), *batch.inputs[1:]]), *step[1:])

    def _here(self) -> bool:
        return self.on and self.now == self.step

    def stage_hooks(self, module: nn.Module) -> None:
        """Faults inside the LLM stage's forward (hooks on the failing rank only)."""
        if not self.on or self.kind not in ("kill", "stall", "slow"):
            return
        started: list[float] = []

        def pre(_m, _args):
            started.append(time.perf_counter())
            if self._here() and self.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self._here() and self.kind == "stall":
                time.sleep(20 * self.timeout)

        def post(_m, _args, _out):
            took = time.perf_counter() - started.pop()
            if self.on and self.kind == "slow":
                time.sleep(took)  # a straggler: every forward twice as long, every step

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def encoder_pieces(self, runtime: EncoderRuntime) -> None:
        """A fault inside the encoder's last piece."""
        if not (self.on and self.kind == "encoder"):
            return
        piece = runtime.kernels[-1]

        def fn(*state):
            if self._here():
                raise RuntimeError(f"injected fault in encoder piece {piece.name} on rank {self.rank} at step {self.now}")
            return piece.fn(*state)

        runtime.kernels[-1] = dataclasses.replace(piece, fn=fn)


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
    device: torch.device
    pp_rank: int
    dp_rank: int
    tp_rank: int
    stage_ids: list[int]
    stage_modules: list[nn.Module]
    llms: list[nn.Module]
    schedule: object = None
    stages: list = dataclasses.field(default_factory=list)
    encoder: nn.Module | None = None
    loss_scale: list[float] = dataclasses.field(default_factory=lambda: [1.0])
    """Varying data: the loss's factor this step (:func:`packed_loss`)."""
    tiles: list[dict] = dataclasses.field(default_factory=list)
    """Varying data: per step, this replica's tiles per slot as run and as given."""

    @property
    def first(self) -> bool:
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
    schedule_class = getattr(pipelining, SCHEDULES[args.schedule])
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
    else:
        example = sample_row(cfg, args.encoder, 0, 0, cfg.chunk_tiles, 0)[0]
    stage = parts.stages[0] if len(parts.stages) == 1 else parts.stages
    runtime = EncoderRuntime(parts.encoder, stage=stage, schedule=parts.schedule, mode=args.mode, mesh=parts.mesh,
                             microbatches=cfg.microbatches, example=example, device=parts.device,
                             balance_replicas=balanced(args) and args.dp > 1,
                             pack_chunks=balanced(args) and args.pp == 1,
                             piece_s=None if args.piece_ms is None else args.piece_ms / 1e3)
    fault.encoder_pieces(runtime)
    if parts.first:
        parts.stage_modules[parts.stage_ids.index(0)].encoder_output = runtime.encoder_output
    runtime.trace = bool(os.environ.get("PYBUBBLE_TRACE"))  # the last step's tasks, ops and waits per rank
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
    parts.tiles.append({"run": data.slot_tiles, "given": data.given_tiles, "layout": data.layout})
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
            pybubble.save_trace(runtime.placement.timeline, os.path.join(folder, "plan.json"))


def rank_figures(parts: RankParts, runtime: EncoderRuntime, ends: list[float], rank: int) -> dict:
    """This rank's figures for the report."""
    records = runtime.records
    stage_sum = sum(full_checksum(mod) for mod in parts.stage_modules)  # every rank: FSDP2 gathers over dp
    return {"starts": [r.start for r in records], "ends": ends, "predicted": [r.predicted_s for r in records],
            # each parameter once: the stage of dp replica 0, the encoder of rank 0
            "checksum": (stage_sum if parts.dp_rank == 0 and parts.tp_rank == 0 else 0.0)
            + (checksum([parts.encoder]) if rank == 0 else 0.0),
            "filler": asdict(records[-1].filler), "filled": [r.filler.filled for r in records],
            "waits": [{k: None if w is None else asdict(w) for k, w in r.waits.items()} for r in records],
            "costs": asdict(runtime.costs), "overruns": [r.filler.overruns for r in records],
            "held_max_s": [r.filler.held_max_s for r in records], "tp_waits": tp_waits(records),
            "host": socket.gethostname(), "encoder_s": [r.encoder_s for r in records], "llm_s": [r.llm_s for r in records],
            "tiles": [r.tiles for r in records], "chunks": [r.chunks for r in records], "imbalance": [r.imbalance for r in records], "data": parts.tiles,
            "dp_collectives_s": [r.dp_collectives_s for r in records], "dp_replicas_s": [r.dp_replicas_s for r in records]}


def train(rank: int, args: argparse.Namespace) -> dict[str, list[dict]] | None:
    """One rank's training (the process group is set up by torchrun or ``launch``), split as
    torchtitan splits its trainer: the mesh, then per mode (``--mode``, one or several in turn on
    the same ranks and mesh) the parallelized model, the pipeline, the encoder's runtime, the loop.
    Rank 0 returns every rank's figures by mode."""
    mesh = build_mesh(args, rank_device(args))
    figures = {mode: train_mode(rank, mode_args(args, mode), mesh) for mode in args.modes}
    return figures if rank == 0 else None


def mode_args(args: argparse.Namespace, mode: str) -> argparse.Namespace:
    """The options of one mode's training: ``args`` with ``--mode`` that mode (``modes`` stays the
    whole list: with several, each mode's rank files go apart, see :func:`mode_path`)."""
    return argparse.Namespace(**{**vars(args), "mode": mode})


def mode_path(args: argparse.Namespace, path: str) -> str:
    """The folder for this mode's files (``--profile``, ``--dump-plan``): ``path`` itself when one
    mode is trained, ``path/<mode>`` when several are."""
    return path if len(args.modes) == 1 else os.path.join(path, args.mode)


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
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, rank_figures(parts, runtime, ends, rank))
    return every


def settled_waits(every: list[dict], settled: list[int]) -> list[dict]:
    """Per rank, per kind of wait: seconds waited and seconds filled, summed over the settled
    steps (None: a kind not observed)."""
    out = []
    for e in every:
        kinds = {}
        for kind in ("pp", "dp", "tp"):
            seen = [e["waits"][s][kind] for s in settled if e["waits"][s][kind] is not None]
            kinds[kind] = None if not seen else {f: sum(w[f] for w in seen) for f in ("waited_s", "filled_s")}
        out.append(kinds)
    return out


def tp_waits(records: list) -> dict:
    """One rank's TP collectives over the settled steps (the first two profile and adapt): waits,
    the time waited and filled, the pieces launched in them as (measured duration, time taken,
    gap) triples, and per wait the collective's launch, the consumer's resumption and the
    measured duration of the piece then running (for the delays, measured across the TP group)."""
    settled = records[min(2, len(records) - 1):]
    keys = ("waits", "gap_s", "waited_s", "filled", "filled_s")
    out = {k: sum(getattr(r.tp, k) for r in settled) for k in keys}
    for k in ("gaps_s", "pieces", "launched_s", "resumed_s", "in_flight_s"):
        out[k] = [g for r in settled for g in getattr(r.tp, k)]
    return out


def report(args: argparse.Namespace, every: list[dict]) -> dict:
    """The run's report (pybubble.runtime_report/3): step s takes from the last rank's end of step
    s - 1 (for step 0: the first rank's start) to the last rank's end of step s, everything
    included (the runtime's planning and barriers, the optimizer)."""
    steps = args.steps
    ends = [max(e["ends"][s] for e in every) for s in range(steps)]
    step_times = [ends[0] - min(e["starts"][0] for e in every)] + [ends[s] - ends[s - 1] for s in range(1, steps)]
    settled = list(range(min(2, steps - 1), steps))  # step 0 profiles, step 1 is the first adapted plan
    # the replicas wait for each other: the step is its slowest replica's
    predicted = [max(e["predicted"][s] for e in every) for s in range(steps)]
    return {
        "format": "pybubble.runtime_report/3", "mode": args.mode, "encoder": args.encoder, "ranks": args.ranks,
        "schedule": args.schedule, "chunks": chunks_of(args),
        "pp": args.pp, "dp": args.dp, "dp_wrap": args.dp_wrap if args.dp > 1 else None,
        "launcher": "torchrun" if args.torchrun else "launch", "tp": args.tp, "tp_waits": tp_report(every, args.tp, args.device == "cuda"),
        "steps": steps, "size": args.size, "device": args.device, "step_times_s": step_times,
        "predicted_steps_s": predicted, "settled_steps": settled,
        "median_step_s": statistics.median(step_times[s] for s in settled),
        "predicted_step_s": statistics.median(predicted[s] for s in settled),
        "param_checksum": sum(e["checksum"] for e in every), "costs": every[0]["costs"],
        "filler": [e["filler"] for e in every], "filled_per_step": [e["filled"] for e in every],
        "waits": settled_waits(every, settled),
        # per rank, over the settled steps: LLM ops held up by a task longer than its estimate,
        # and the longest hold-up (at most one piece)
        "overruns": [sum(e["overruns"][s] for s in settled) for e in every],
        "held_max_s": [max(e["held_max_s"][s] for s in settled) for e in every],
        "prediction_error": statistics.median(abs(predicted[s] - step_times[s]) / step_times[s] for s in settled),
        # per rank, over the settled steps: what the prediction counts for the data-parallel replicas
        # (0 with one): the collectives' own time where they meet, the waits for the other replicas
        "predicted_dp_s": [{"collectives_s": sum(e["dp_collectives_s"][s] for s in settled),
                            "replicas_s": sum(e["dp_replicas_s"][s] for s in settled)} for e in every],
        "data": data_report(args, every, settled),
    }


def data_report(args: argparse.Namespace, every: list[dict], settled: list[int]) -> dict | None:
    """Varying data: per rank over the settled steps the encoder's and the LLM's seconds and the
    idle time by kind (waited, not filled); per step the tiles each replica ran per slot and its
    chunks per slot's deadline (packed chains: slots whose tiles earlier chains ran have 0), the slots'
    most over mean tiles as given and as run (rank 0's replica), the replicas' most over mean tiles
    before and after the moves; the tiles of a chunk."""
    if args.data == "fixed":
        return None
    waits = settled_waits(every, settled)
    rows = every[0]["data"]

    def spread(tiles: list[int]) -> float:
        return max(tiles) / statistics.mean(tiles) if sum(tiles) else 1.0

    return {"per_rank": [{"encoder_s": sum(e["encoder_s"][s] for s in settled),
                          "llm_s": sum(e["llm_s"][s] for s in settled),
                          "idle_s": {k: None if w[k] is None else w[k]["waited_s"] for k in ("pp", "dp", "tp")}}
                         for e, w in zip(every, waits)],
            "tiles": [e["tiles"] for e in every], "chunks": [e["chunks"] for e in every],
            "slot_imbalance_given": [spread(r["given"]) for r in rows],
            "slot_imbalance_run": [spread(r["run"]) for r in rows], "layout": [r["layout"] for r in rows],
            "replica_imbalance": every[0]["imbalance"], "chunk_tiles": config(args).chunk_tiles}


def chunks_of(args: argparse.Namespace) -> int:
    """Stages per rank: ``--chunks``, or the schedule's own count (2 for a V, else 1)."""
    return args.chunks or (2 if args.schedule in V_SHAPED else 1)


def tp_report(every: list[dict], tp: int, cuda: bool) -> dict:
    """The TP waits of the settled steps: per rank, the TP collectives' gaps, the seconds blocked in
    them with no piece running and the seconds the encoder filled, the consumers' delays and
    overruns; the share of the gaps filled; over all ranks, the distribution
    (10/50/90th percentile, max) of the pieces' durations against the gaps they went into."""
    import numpy as np

    def spread(values: list[float]) -> list[float]:
        return [float(v) for v in np.percentile(values, [10, 50, 90, 100])] if values else []

    lists = ("gaps_s", "pieces", "launched_s", "resumed_s", "in_flight_s")
    per_rank = [{k: v for k, v in e["tp_waits"].items() if k not in lists} for e in every]
    if tp > 1 and not cuda and len({e["host"] for e in every}) == 1:
        # one host, one clock: the consumers' delays against each TP group's last launch
        for g in range(0, len(every), tp):  # "tp" is the mesh's innermost dimension
            group = every[g:g + tp]
            delays = consumer_delays(*([e["tp_waits"][k] for e in group] for k in lists[2:]))
            for r, d in zip(per_rank[g:g + tp], delays):
                r.update({k: v for k, v in d.items() if k != "waits"})
    pieces = [p for e in every for p in e["tp_waits"]["pieces"]]
    gaps = sum(r["gap_s"] for r in per_rank)
    return {"per_rank": per_rank, "filled_fraction": sum(r["filled_s"] for r in per_rank) / gaps if gaps else 0.0,
            "gap_s": spread([g for e in every for g in e["tp_waits"]["gaps_s"]]),
            "piece_s": spread([p[1] for p in pieces]), "piece_measured_s": spread([p[0] for p in pieces]),
            "filled_gap_s": spread([p[2] for p in pieces])}


def config(args: argparse.Namespace) -> ModelConfig:
    """The size's config, with ``--microbatches`` when given."""
    cfg = (SIZES if args.data == "fixed" else VARYING_SIZES)[args.size]
    if args.microbatches:
        cfg = dataclasses.replace(cfg, microbatches=args.microbatches)
    if args.chunk_tiles:
        cfg = dataclasses.replace(cfg, chunk_tiles=args.chunk_tiles)
    return cfg


def planning_config(args: argparse.Namespace) -> dict:
    """The pybubble planning config that describes this run's models and ranks (``--write-config``):
    the GPT's blocks as the LLM (image tokens and text in one sequence), the vit encoder, its data- and
    pipeline-parallel degrees and its schedule on the CPU (``cluster.gpu: cpu``)."""
    cfg = config(args)
    if args.encoder != "vit":
        raise ValueError(f"write_config: the config describes the vit encoder, not {args.encoder!r}")
    if args.schedule not in PLANNED_SCHEDULES:
        raise ValueError(f"write_config: the planner has no schedule {args.schedule!r} "
                         f"(one of {', '.join(PLANNED_SCHEDULES)})")
    plan = {"dp": args.dp, "pp": args.pp, "tp": args.tp, "schedule": args.schedule}
    if args.schedule == "interleaved_1f1b":
        plan["vpp"] = chunks_of(args)
    return {"cluster": {"gpus": args.ranks, "gpu": "cpu", "gpus_per_node": args.ranks},
            "llm": {"name": "example-gpt", "layers": args.pp * cfg.llm_layers_per_stage, "hidden": cfg.llm_dim,
                    "heads": cfg.llm_heads, "ffn_hidden": 4 * cfg.llm_dim, "vocab": cfg.vocab},
            "encoders": [{"name": "example-vit", "layers": cfg.enc_layers, "hidden": cfg.enc_dim,
                          "heads": cfg.enc_heads, "ffn_hidden": 4 * cfg.enc_dim, "tokens": cfg.patches,
                          "tokens_per_sample": cfg.patches}],
            "training": {"global_batch": cfg.microbatches * cfg.microbatch_size, "micro_batch": cfg.microbatch_size // args.dp,
                         "seq_len": encoder_tokens(cfg, args.encoder) + cfg.text_len},
            "llm_plan": plan}


def finish(args: argparse.Namespace, figures: dict[str, list[dict]]) -> dict:
    """The report, with the single-process reference's checksum when asked (computed once): one
    mode's, or with several a dict of each mode's report by mode."""
    reference = None
    if args.reference:
        reference = (reference_checksum(config(args), args.pp, args.steps, args.encoder) if args.data == "fixed"
                     else reference_varying(args, config(args)))
    out = {}
    for mode, every in figures.items():
        out[mode] = report(mode_args(args, mode), every)
        if reference is not None:
            out[mode]["reference_checksum"] = reference
    return out if len(args.modes) > 1 else out[args.mode]


def backend(args: argparse.Namespace) -> str:
    return "nccl" if args.device == "cuda" else "gloo"


def run(args: argparse.Namespace) -> dict:
    """Launches the ranks (pybubble.runtime.launch) and returns the report (raises
    ``RuntimeError`` when a rank failed)."""
    return finish(args, launch(train, args.ranks, args, backend=backend(args), timeout=args.timeout))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python examples/mllm.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=0,
                   help="processes to start (without torchrun; default dp x pp, or 2)")
    p.add_argument("--pp", type=int, default=0, help="pipeline stages, one rank each (default: ranks / dp)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas of the pipeline (default 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks of each stage (default 1)")
    p.add_argument("--dp-wrap", default="fsdp", help=f"how the LLM's stages are data-parallel: {', '.join(DP_WRAPS)}")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mode", default="pybubble",
                   help="megatron, coarse or pybubble; several, comma-separated (megatron,coarse,pybubble): trained "
                        "in turn by the same ranks, each from the seed, the report a dict by mode")
    p.add_argument("--encoder", default="vit", help=f"the vision encoder: {', '.join(ENCODERS)}")
    p.add_argument("--report", help="write the report (JSON) here")
    p.add_argument("--profile", help="write a torch.profiler Chrome trace of the last step per rank into this folder")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    p.add_argument("--size", default="small", help=f"model size: {', '.join(SIZES)}")
    p.add_argument("--microbatches", type=int, default=0, help="microbatches per step (default: the size's)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a rank waits for a failed peer")
    p.add_argument("--fail-rank", type=int, default=-1, help="inject a fault on this rank (tests)")
    p.add_argument("--fail-step", type=int, default=0, help="... at this step")
    p.add_argument("--fault", default="raise", help=f"... of this kind: {', '.join(FAULTS)}")
    p.add_argument("--reference", action="store_true", help="also train in one process and report its checksum")
    p.add_argument("--schedule", default="1f1b", help=f"the pipeline schedule: {', '.join(SCHEDULES)}")
    p.add_argument("--chunks", type=int, default=0,
                   help="stages per rank (default: 1; 2 for zbv and dualpipev, which need 2)")
    p.add_argument("--dp-dim", default="dp",
                   help="the mesh's data-parallel dimension's name (default dp; e.g. torchtitan's dp_shard)")
    p.add_argument("--data", default="fixed",
                   help=f"the step's samples: {', '.join(DATA[:2])} (fixed: one image per sample, the same shape "
                        "every step; mix: text and 0..N images of 1..13 tiles, videos, from a seeded open-VLM mix)")
    p.add_argument("--data-file", metavar="FILE",
                   help='replay your samples: JSON lines, one sample each, {"tiles": [t1, t2, ...], "text": N}')
    p.add_argument("--chunk-tiles", type=int, default=0,
                   help="varying data: tiles the encoder's pieces run on at a time (default: the size's)")
    p.add_argument("--balance", default="on",
                   help="varying data: on (samples balanced over the microbatches, heaviest in the most room) or off")
    p.add_argument("--piece-ms", type=float, metavar="MS",
                   help="pybubble's pieces: the encoder's kernels merged to at least MS ms forward and backward "
                        "(0: one kernel each; default: automatic, see docs/runtime.md; the baselines run it unsplit)")
    p.add_argument("--dump-plan", metavar="DIR", help="write each rank's plan of the last step (JSON) into DIR")
    p.add_argument("--write-config", metavar="FILE",
                   help="write the pybubble planning config of this run's models and ranks (YAML) and exit")
    args = p.parse_args(argv)
    args.torchrun = "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
    args.given_ranks = args.ranks
    args.modes = args.mode.split(",")
    args.given_data = args.data
    if args.data_file:
        args.data = "file"
    args.samples = None
    if args.torchrun:
        args.ranks = int(os.environ["WORLD_SIZE"])
    elif not args.ranks:
        args.ranks = args.dp * args.pp * max(args.tp, 1) if args.pp else 2 * args.dp
    if not args.pp and args.dp >= 1 and args.tp >= 1:
        args.pp = args.ranks // (args.dp * args.tp)
    return args


def check_ranks(args: argparse.Namespace) -> None:
    """The ranks and their mesh: ValueError naming the option."""
    if args.torchrun and args.given_ranks and args.given_ranks != args.ranks:
        raise ValueError(f"ranks: {args.given_ranks} but torchrun started {args.ranks} processes")
    if args.ranks < 2:
        raise ValueError(f"ranks: {args.ranks} is not >= 2")
    if args.dp < 1:
        raise ValueError(f"dp: {args.dp} is not >= 1")
    if args.tp < 1:
        raise ValueError(f"tp: {args.tp} is not >= 1")
    if args.dp * args.pp * args.tp != args.ranks:
        raise ValueError(f"pp: dp {args.dp} x pp {args.pp}{f' x tp {args.tp}' if args.tp > 1 else ''} is not the "
                         f"{args.ranks} ranks")
    if args.pp < (1 if args.tp > 1 or args.dp > 1 else 2):
        raise ValueError(f"pp: {args.pp} is not >= {1 if args.tp > 1 or args.dp > 1 else 2}")
    if args.tp > 1 and args.dp > 1:
        raise ValueError(f"tp: {args.tp} beside dp {args.dp}: the example runs tensor parallelism without data "
                         "parallelism")


def check_run(args: argparse.Namespace) -> None:
    """The run's options: ValueError naming the option."""
    if args.dp_wrap not in DP_WRAPS:
        raise ValueError(f"dp_wrap: {args.dp_wrap!r} is not one of {', '.join(DP_WRAPS)}")
    if args.steps < 1:
        raise ValueError(f"steps: {args.steps} is not >= 1")
    if args.piece_ms is not None and not args.piece_ms >= 0:  # NaN too
        raise ValueError(f"piece_ms: {args.piece_ms} is not a number of milliseconds >= 0")
    for mode in args.modes:
        if mode not in PLACEMENTS:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(PLACEMENTS)}")
    if len(set(args.modes)) < len(args.modes):
        raise ValueError(f"mode: {args.mode!r} names a mode twice")
    if args.encoder not in ENCODERS:
        raise ValueError(f"encoder: {args.encoder!r} is not one of {', '.join(ENCODERS)}")
    if args.size not in SIZES:
        raise ValueError(f"size: {args.size!r} is not one of {', '.join(SIZES)}")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"device: {args.device!r} is not one of cpu, cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' but no CUDA device is available (torch.cuda.is_available() is False)")
    if args.device == "cuda" and torch.cuda.device_count() < args.ranks and not args.torchrun:
        # NCCL refuses two ranks of one communicator on the same GPU.
        raise ValueError(f"device: 'cuda' needs one GPU per rank ({args.ranks} ranks, "
                         f"{torch.cuda.device_count()} GPUs)")
    if not args.timeout > 0:
        raise ValueError(f"timeout: {args.timeout} is not > 0")
    if args.fail_rank >= args.ranks:
        raise ValueError(f"fail_rank: {args.fail_rank} is not a rank (< {args.ranks})")
    if args.fault not in FAULTS:
        raise ValueError(f"fault: {args.fault!r} is not one of {', '.join(FAULTS)}")
    if not args.dp_dim.isidentifier() or args.dp_dim in ("pp", "tp"):
        raise ValueError(f"dp_dim: {args.dp_dim!r} is not a dimension name other than pp and tp")


def check_schedule(args: argparse.Namespace) -> None:
    """The schedule against the ranks and the model: ValueError naming the option."""
    if args.schedule not in SCHEDULES:
        raise ValueError(f"schedule: {args.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if not hasattr(pipelining, SCHEDULES[args.schedule]):
        raise ValueError(f"schedule: {args.schedule!r} needs torch.distributed.pipelining."
                         f"{SCHEDULES[args.schedule]}, which torch {torch.__version__} does not have")
    if args.chunks < 0:
        raise ValueError(f"chunks: {args.chunks} is not >= 1")
    chunks = chunks_of(args)
    if args.schedule in SINGLE_STAGE and chunks != 1:
        raise ValueError(f"chunks: {chunks} stages per rank, but {args.schedule} runs one")
    if args.schedule in V_SHAPED and chunks != 2:
        raise ValueError(f"chunks: {chunks} stages per rank, but {args.schedule} runs two (a V)")
    if args.schedule in SPLIT_BACKWARD and args.dp > 1 and args.dp_wrap == "ddp":
        raise ValueError(f"dp_wrap: 'ddp' beside --schedule {args.schedule}, which splits the backward (I, W): torch "
                         "computes W's weight gradients with autograd.grad, which DDP's all-reduce never sees "
                         "(pytorch/pytorch#144530), so the replicas' gradients are not averaged; see "
                         "docs/runtime.md, 'Zero-bubble schedules beside data parallelism'; use --dp-wrap fsdp")
    if args.tp > 1 and args.schedule in SPLIT_BACKWARD:
        raise ValueError(f"tp: {args.tp} beside --schedule {args.schedule}, which splits the backward (I, W): the "
                         "runtime predicts TP gaps in whole forwards and backwards only; use 1f1b, gpipe or "
                         "interleaved_1f1b")
    if args.pp == 1 and args.schedule not in SINGLE_STAGE:
        raise ValueError(f"schedule: {args.schedule!r} with --pp 1 (tensor parallelism alone) is not run by the "
                         "example; use 1f1b or gpipe")
    layers = args.pp * SIZES[args.size].llm_layers_per_stage
    if layers % (args.pp * chunks):
        raise ValueError(f"chunks: the {layers} GPT blocks of size {args.size!r} do not split into "
                         f"{args.pp} x {chunks} stages")
    if args.schedule == "dualpipev" and config(args).microbatches < args.pp * chunks:
        raise ValueError(f"microbatches: dualpipev needs at least one per stage ({args.pp * chunks}), "
                         f"size {args.size!r} has {config(args).microbatches}")
    if args.microbatches < 0:
        raise ValueError(f"microbatches: {args.microbatches} is not >= 1")
    cfg = config(args)
    if cfg.microbatches < args.pp:
        raise ValueError(f"pp: {args.pp} exceeds the {cfg.microbatches} microbatches of size {args.size!r}")
    if cfg.llm_heads % args.tp:
        raise ValueError(f"tp: {args.tp} does not divide the {cfg.llm_heads} heads of size {args.size!r}")
    if cfg.microbatch_size % args.dp:
        raise ValueError(f"dp: {args.dp} does not divide the microbatch size {cfg.microbatch_size} of size {args.size!r}")


def check_data(args: argparse.Namespace) -> None:
    """The data options, and the data file read (every sample within the limits of the size):
    ValueError naming the option, or the file's line."""
    if args.given_data not in DATA[:2]:
        raise ValueError(f"data: {args.given_data!r} is not one of {', '.join(DATA[:2])} (or give --data-file)")
    if args.data_file and args.given_data != "fixed":
        raise ValueError(f"data: --data {args.given_data} beside --data-file: give one")
    if args.chunk_tiles < 0 or (args.chunk_tiles and args.data == "fixed"):
        raise ValueError(f"chunk_tiles: {args.chunk_tiles} is not >= 1 with varying data (--data mix or --data-file)")
    if args.balance not in ("on", "off"):
        raise ValueError(f"balance: {args.balance!r} is not one of on, off")
    if args.data != "fixed" and args.encoder == "clip":
        raise ValueError("encoder: 'clip' with varying data: its class token per tile does not pool; use vit or timm")
    if args.data == "file":
        from pybubble.data.files import read_samples

        cfg = config(args)
        args.samples = read_samples(args.data_file, tokens_per_tile=encoder_tokens(cfg, args.encoder),
                                    max_tiles=cfg.max_tiles, max_tokens=cfg.seq_len)


def check_args(args: argparse.Namespace) -> None:
    """Every option: ValueError naming the option and the value."""
    check_ranks(args)
    check_run(args)
    check_schedule(args)
    check_data(args)


def write_report(args: argparse.Namespace, out: dict) -> None:
    if args.report:
        with open(args.report, "w") as f:
            json.dump(out, f, indent=1)
    for rep in out.values() if len(args.modes) > 1 else [out]:
        print(f"{rep['mode']} ({args.encoder}): median step {rep['median_step_s'] * 1e3:.1f} ms, predicted "
              f"{rep['predicted_step_s'] * 1e3:.1f} ms, param_checksum {rep['param_checksum']:.9g}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        if not args.torchrun or os.environ.get("RANK") == "0":
            print(f"error: {e}", file=sys.stderr)
        return 2
    if args.write_config:
        import yaml

        with open(args.write_config, "w") as f:
            yaml.safe_dump(planning_config(args), f, sort_keys=False)
        print(f"wrote {args.write_config}")
        return 0
    if args.device == "cuda" and (note := serialised_streams_note()):
        print(f"note: {note}", file=sys.stderr)
    if args.torchrun:  # this process is one rank; torchrun ends the others when one fails
        every = run_rank(train, args, backend=backend(args), timeout=args.timeout)
        if every is not None:
            write_report(args, finish(args, every))
        exit_rank(0)  # no interpreter finalization beside torch's leftover gloo threads (exit_rank)
    try:
        out = run(args)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_report(args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
