"""The test trainer's data: one image per sample, the same shape every step (``fixed``), or samples
of text and 0..N images of 1..T tiles that vary every step (the seeded open-VLM ``mix`` or a data
file), each sample one row of the GPT's fixed sequence; each replica's share of a step laid out over
the LLM's slots by the runtime (:meth:`~pybubble.runtime.EncoderRuntime.lay_out`); the losses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...data.mix import MixSpec, NativeMixSpec, mix, native_mix
from ...data.samples import Samples
from ...runtime import EncoderBatch, EncoderRuntime
from ...runtime.packed import PackedMicrobatch, packed_batch
from .job import data_samples
from ...config.processors import PROCESSORS
from .model import PACKED_KINDS, PATCH_VALUES, PROCESSOR_OF, ModelConfig, encoder_tokens, image_side


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


def example_mix(cfg: ModelConfig) -> MixSpec:
    """The open-VLM mix (pybubble.data.mix.MixSpec: its shares of text-only, single-image,
    multi-image and video samples, its tiles) with text scaled to the trainer's ``text_len``."""
    return MixSpec(text_median=cfg.text_len / 2, text_max=cfg.text_len)


NATIVE_SCALE = 0.25
"""The native mix's image sides at the test trainer's sizes: a quarter of the mix's (docs/dynamic.md)."""


def step_samples(args: Any, cfg: ModelConfig, step: int) -> Samples:
    """The whole step's samples (every rank takes the same): the mix's (from the seed; the native
    mix, its sides times :data:`NATIVE_SCALE`, for a native-resolution encoder), or the data file's in
    its order, from its start again when they run out (shuffle the file to replay a distribution)."""
    n = cfg.microbatches * cfg.microbatch_size
    if args.data == "mix" and args.encoder in PACKED_KINDS:
        return native_mix(n, seed=cfg.seed * 100003 + step, spec=NativeMixSpec(base=example_mix(cfg), scale=NATIVE_SCALE),
                          processor=PROCESSORS[PROCESSOR_OF[args.encoder]])
    if args.data == "mix":
        return mix(n, seed=cfg.seed * 100003 + step, spec=example_mix(cfg))
    samples = data_samples(args)
    return samples.take((step * n + np.arange(n)) % len(samples))


def sample_row(cfg: ModelConfig, kind: str, step: int, i: int, tiles: int, text: int, grids: Any = None
               ) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Sample ``i`` of step ``step`` (its own seed, whatever its place in the batch): its tiles'
    pixels (a native-resolution encoder: each of its images' patches, by their ``grids``), its row of
    ``seq_len`` token ids (image positions and padding 0) and its targets (the next text token at
    each text position, -100 elsewhere)."""
    g = torch.Generator().manual_seed((cfg.seed * 100003 + step) * 65537 + i)
    if kind in PACKED_KINDS:
        pixels = [torch.randn(int(np.prod(grid)), PATCH_VALUES[kind], generator=g) for grid in grids]
    else:
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
    """Each row's next token at its text positions, -100 elsewhere."""
    text_tokens: int
    """Targets of the whole step (every replica's): the loss is their sum over this."""
    packs: list[PackedMicrobatch] | None = None
    """A native-resolution encoder: per slot, where its images' tokens are in the encoder's output."""


def replica_step(args: Any, cfg: ModelConfig, step: int, replica: int, runtime: EncoderRuntime) -> StepInput:
    """Replica ``replica``'s samples of step ``step`` (its contiguous share), ``microbatch_size /
    dp`` rows per LLM microbatch, in the layout over the slots the runtime chooses
    (:meth:`~pybubble.runtime.EncoderRuntime.lay_out`: with ``balance.slots``, the one it predicts
    shortest; else as given)."""
    samples = step_samples(args, cfg, step)
    m, rows = cfg.microbatches, cfg.microbatch_size // args.dp
    mine = np.arange(replica * m * rows, (replica + 1) * m * rows)
    if args.encoder in PACKED_KINDS:
        return packed_step(cfg, args.encoder, step, samples, mine, runtime)
    tiles, text = samples.sample_tiles[mine], samples.text[mine]
    layout = runtime.lay_out(tiles)
    run = layout.order
    parts = [sample_row(cfg, args.encoder, step, int(mine[i]), int(tiles[i]), int(text[i])) for i in run]
    pixels = [torch.cat([parts[r][0] for r in range(k * rows, (k + 1) * rows)]) for k in range(m)]
    per_sample = np.split(samples.tiles, np.cumsum(samples.images)[:-1])  # each sample's images' tiles
    images = [[int(t) for r in run[k * rows:(k + 1) * rows] for t in per_sample[mine[r]]] for k in range(m)]
    per_tile = encoder_tokens(cfg, args.encoder)
    return StepInput(encoder=EncoderBatch(pixels, images), tokens=torch.stack([p[1] for p in parts]),
                     image_len=torch.as_tensor(tiles[run] * per_tile), targets=torch.stack([p[2] for p in parts]),
                     text_tokens=int(samples.text.sum()))


def packed_step(cfg: ModelConfig, kind: str, step: int, samples: Samples, mine: np.ndarray,
                runtime: EncoderRuntime) -> StepInput:
    """A native-resolution encoder's share of a step: its samples laid out over the slots by their
    patches (:meth:`~pybubble.runtime.EncoderRuntime.lay_out` with ``per_chunk``), each slot's images
    packed into chunks of the pieces' patches (:func:`~pybubble.runtime.packed.packed_batch`, the
    encoder's layout tensors)."""
    m = cfg.microbatches
    rows = len(mine) // m
    tiles, text = samples.sample_tiles[mine], samples.text[mine]
    grids = np.split(samples.grids, np.cumsum(samples.images)[:-1])  # each sample's images' grids
    layout = runtime.lay_out([int(grids[i].prod(axis=1).sum()) for i in mine], per_chunk=cfg.chunk_patches)
    run = layout.order
    parts = [sample_row(cfg, kind, step, int(mine[r]), int(tiles[r]), int(text[r]), grids[mine[r]]) for r in run]
    slot = [range(k * rows, (k + 1) * rows) for k in range(m)]
    batch, packs = packed_batch([[x for r in rs for x in parts[r][0]] for rs in slot],
                                [[tuple(map(int, g)) for r in rs for g in grids[mine[run[r]]]] for rs in slot],
                                patches=cfg.chunk_patches, width=PATCH_VALUES[kind], layout=runtime.encoder.encoder.layout)
    return StepInput(encoder=batch, tokens=torch.stack([p[1] for p in parts]), image_len=torch.as_tensor(tiles[run]),
                     targets=torch.stack([p[2] for p in parts]), text_tokens=int(samples.text.sum()), packs=packs)


def balanced(args: Any) -> bool:
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
    """The loss of fixed data: each microbatch's mean cross entropy over the microbatches (the
    gradients of the unsplit model on the whole batch)."""
    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten()) / cfg.microbatches
    return loss


def replica_slice(x: torch.Tensor, cfg: ModelConfig, dp: int, replica: int) -> torch.Tensor:
    """Data-parallel replica ``replica``'s share of a step's batch: its ``microbatch_size / dp``
    samples of every microbatch (the replicas' averaged gradients are the whole batch's)."""
    per = cfg.microbatch_size // dp
    m = cfg.microbatches
    return x.view(m, cfg.microbatch_size, *x.shape[1:])[:, replica * per:(replica + 1) * per].reshape(m * per, *x.shape[1:])
