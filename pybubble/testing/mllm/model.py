"""The test trainer's model: a vision encoder (its own ViT, timm's ``VisionTransformer`` or Hugging
Face's ``CLIPVisionModel``, random weights from the seed, nothing downloaded) with a projection to
the LLM's width, and a GPT cut into pipeline stages (the same initial weights whatever the cut), at
the sizes of :data:`SIZES` (one image per sample) and :data:`VARYING_SIZES` (varying data: tiles)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import qwen_vision, titan_vision
from .vision_libraries import import_vision_libraries


ENCODER_KINDS = ("vit", "timm", "clip", "qwen2_5_vl", "titan_vit")
PACKED_KINDS = ("qwen2_5_vl", "titan_vit")
"""The native-resolution encoders (transformers' Qwen2.5-VL tower, torchtitan's Qwen3.5 encoder):
images of any size, packed into chunks of ``chunk_patches`` patches (:mod:`pybubble.runtime.packed`);
a tile is one LLM token (a merged patch)."""
PATCH_VALUES = {"qwen2_5_vl": 3 * 2 * qwen_vision.QWEN_PATCH ** 2,
                "titan_vit": 3 * titan_vision.TEMPORAL * titan_vision.PATCH ** 2}
"""Values of one patch: 3 channels, 2 frames, 14 x 14 (Qwen2.5-VL) or 16 x 16 pixels (Qwen3.5)."""
PROCESSOR_OF = {"qwen2_5_vl": "qwen2_5_vl", "titan_vit": "qwen3_5"}
"""The processor (:data:`pybubble.config.processors.PROCESSORS`) whose rules size each encoder's images."""


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Sizes of the trainer's encoder and GPT, and of its batch."""

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
    """The encoder's width."""
    enc_layers: int = 12
    """The encoder's blocks."""
    enc_heads: int = 4
    """The encoder's attention heads."""
    llm_dim: int = 256
    """The GPT's width."""
    llm_layers_per_stage: int = 2
    """GPT blocks per pipeline rank (``--chunks V``: split over its V stages; the same GPT
    whatever the schedule)."""
    llm_heads: int = 4
    """The GPT's attention heads."""
    text_len: int = 64
    """Text tokens per sample."""
    vocab: int = 512
    """The GPT's vocabulary."""
    lr: float = 0.05
    """SGD's learning rate."""
    seed: int = 0
    """The seed of the weights and the data."""
    pool: int = 1
    """Varying data: the encoder's tokens of a tile averaged in groups of this many into one LLM
    token (a pixel shuffle's reduction; 1 with ``--data fixed``)."""
    chunk_tiles: int = 8
    """Varying data: tiles the encoder's pieces run on at a time (a chunk of the pieces' fixed shape)."""
    max_tiles: int = 32
    """Varying data: the most tiles of one sample (its images' together); the LLM's sequence holds
    them all (``seq_len``)."""
    chunk_patches: int = 512
    """Native-resolution encoders: patches of a chunk the pieces run on (the largest image's at least)."""

    @property
    def seq_len(self) -> int:
        """Varying data: the LLM's fixed sequence per sample: the most image tokens and text."""
        return self.max_tiles * (self.patches // self.pool) + self.text_len

    def __post_init__(self) -> None:
        for name in ("microbatches", "microbatch_size", "patches", "patch", "enc_dim", "enc_layers", "enc_heads",
                     "llm_dim", "llm_layers_per_stage", "llm_heads", "text_len", "vocab", "pool", "chunk_tiles",
                     "max_tiles", "chunk_patches"):
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


NATIVE_SIZES = {
    "small": dataclasses.replace(VARYING_SIZES["small"], patches=1, pool=1, max_tiles=512, chunk_patches=512,
                                 enc_layers=4),
    "tiny": dataclasses.replace(VARYING_SIZES["tiny"], patches=1, pool=1, max_tiles=512, chunk_patches=1536),
}
"""The sizes of a native-resolution encoder (:data:`PACKED_KINDS`): a tile is one LLM token, up to
``max_tiles`` image tokens per sample, chunks of ``chunk_patches`` patches (small: the native mix at a
quarter of its sides; tiny: a 448 x 672 image's 1536 patches)."""


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
        """The block on ``x`` (batch, tokens, width)."""
        b, t, _ = x.shape
        # qkv's outputs grouped by head (q, k, v of head 0, then of head 1, ...): a column-wise
        # split over tensor-parallel ranks (apply_tp) gives each rank whole heads (-1: the heads here).
        q, k, v = self.qkv(self.norm1(x)).view(b, t, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class PatchEmbed(nn.Module):
    """Flattened patches to the encoder's width, plus learnt positions."""
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear = nn.Linear(3 * cfg.patch * cfg.patch, cfg.enc_dim)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.patches, cfg.enc_dim))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """The patches embedded."""
        return self.linear(patches) + self.pos


class LastHidden(nn.Module):
    """A Hugging Face vision tower's ``last_hidden_state``."""

    def __init__(self, tower: nn.Module):
        super().__init__()
        self.tower = tower

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """The tower's last hidden state on ``pixels``."""
        return self.tower(pixel_values=pixels).last_hidden_state


def image_grid(cfg: ModelConfig) -> int:
    """Patches per side of the square image timm and clip take: the most that ``patches`` allows."""
    return math.isqrt(cfg.patches)


def image_side(cfg: ModelConfig) -> int:
    """The side in pixels of the square image timm and clip take."""
    return image_grid(cfg) * cfg.patch


def build_encoder(cfg: ModelConfig, kind: str = "vit") -> nn.Module:
    """The vision encoder and a projection to the LLM's width (random weights from the seed); a
    native-resolution one (:data:`PACKED_KINDS`) runs on chunks of packed patches, its merger's
    output the LLM's width."""
    torch.manual_seed(cfg.seed)
    if kind in PACKED_KINDS:
        from ...runtime.packed import PackedEncoder

        if kind == "titan_vit":
            from ...integrations.torchtitan.packed_vision import PackedTitanVision
            from .titan_vision import titan_tower

            return PackedEncoder(PackedTitanVision(titan_tower(cfg.enc_dim, cfg.enc_layers, cfg.enc_heads, cfg.llm_dim,
                                                               cfg.seed), cfg.chunk_patches))
        from .qwen_vision import PackedQwenVision

        return PackedEncoder(PackedQwenVision(seeded_qwen_tower(cfg), cfg.chunk_patches))
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
        raise ValueError(f"encoder: {kind!r} is not one of {', '.join(ENCODER_KINDS)}")
    head = [nn.Linear(cfg.enc_dim, cfg.llm_dim)] + ([TokenPool(cfg.pool)] if cfg.pool > 1 else [])
    return nn.Sequential(tower, *head)


def unpacked_encoder(cfg: ModelConfig, kind: str) -> tuple[nn.Module, object]:
    """A native-resolution encoder unpacked, as its library runs it (the weights of
    :func:`build_encoder`'s): the module, and the function of a microbatch's images (each its
    patches) and their grids that gives their tokens in order (transformers' tower with its own
    attention on ``grid_thw``; torchtitan's forward on a padded batch)."""
    if kind == "titan_vit":
        from .titan_vision import titan_tower, unpacked

        tower = titan_tower(cfg.enc_dim, cfg.enc_layers, cfg.enc_heads, cfg.llm_dim, cfg.seed)
        return tower, unpacked(tower)
    tower = seeded_qwen_tower(cfg, "sdpa")
    return tower, lambda images, grids: tower(torch.cat(images), grid_thw=torch.tensor(grids)).pooler_output


def seeded_qwen_tower(cfg: ModelConfig, attention: str | None = None) -> nn.Module:
    """transformers' Qwen2.5-VL vision tower at the encoder's sizes (random weights from the seed),
    its merger's output the LLM's width."""
    from .qwen_vision import qwen_tower

    torch.manual_seed(cfg.seed)
    return qwen_tower(cfg.enc_dim, cfg.enc_layers, cfg.enc_heads, cfg.llm_dim, attention)


class TokenPool(nn.Module):
    """A tile's tokens averaged in groups of ``pool`` (fewer LLM tokens per tile)."""

    def __init__(self, pool: int):
        super().__init__()
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``'s tokens averaged in groups of ``pool``."""
        return x.unflatten(1, (-1, self.pool)).mean(2)


def encoder_tokens(cfg: ModelConfig, kind: str) -> int:
    """Image tokens the encoder gives per sample, or per tile with varying data (CLIP adds a class
    token; a native-resolution encoder's tile is one token)."""
    if kind in PACKED_KINDS:
        return 1
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
        """The first stage on ``tokens`` of microbatch ``microbatch[0]`` (with varying data, each
        row's ``image_len`` image tokens)."""
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
    """GPT blocks between the first and the last stage."""
    def __init__(self, cfg: ModelConfig, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks on ``x``."""
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
        """The logits."""
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
        """The whole GPT's logits."""
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


def checksum(modules) -> float:
    """float64 sum of all parameters."""
    return float(sum(p.detach().double().sum() for m in modules for p in m.parameters()))


def full_checksum(module: nn.Module) -> float:
    """float64 sum of a module's parameters, FSDP2-sharded ones gathered (a collective over dp)."""
    return float(sum((p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().sum()
                     for p in module.parameters()))


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
