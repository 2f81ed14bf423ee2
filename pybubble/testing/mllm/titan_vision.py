"""The test trainer's ``titan_vit``: torchtitan's own Qwen3.5 vision encoder (``Qwen35VisionEncoder``
of ``torchtitan.models.qwen3_5``: learned position table interpolated per image, 2-D rotary
positions, a 2 x 2 merger) at a small size with random weights, and its unpacked reference
(torchtitan's own forward on a padded batch, one image per row). Needs torchtitan (and the
flash-linear-attention package its qwen3_5 model imports)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import nn

PATCH = 16
"""Pixels of a patch's side (Qwen3.5's)."""
TEMPORAL = 2
"""Frames of a temporal patch."""
MERGE = 2
"""Patches merged into a token along each side."""


def titan_tower(dim: int, layers: int, heads: int, out: int, seed: int) -> nn.Module:
    """torchtitan's ``Qwen35VisionEncoder`` of width ``dim``, ``layers`` blocks, ``heads`` heads, its
    merger's output ``out`` wide, an 8 x 8 learned position table; weights by torchtitan's own
    initialisation (``init_states``) from ``seed``, with its initialisers of linear layers and the
    table (normal, std 0.02; biases 0)."""
    from torchtitan.models.common import Linear
    from torchtitan.models.common.nn_modules import LayerNorm
    from torchtitan.models.common.vision_encoder import VisionAttention, VisionMLP, VisionTransformerBlock
    from torchtitan.models.qwen3_5.vision_encoder import PatchMerger, Qwen35VisionEncoder, VisionRotaryEmbedding

    init = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}

    def linear(a: int, b: int) -> Linear.Config:
        return Linear.Config(in_features=a, out_features=b, bias=True, param_init=init)

    def norm() -> LayerNorm.Config:
        return LayerNorm.Config(normalized_shape=dim, eps=1e-6)

    merged = 4 * dim
    config = Qwen35VisionEncoder.Config(
        dim=dim, num_layers=layers, num_heads=heads, patch_size=PATCH, temporal_patch_size=TEMPORAL, in_channels=3,
        spatial_merge_size=MERGE, num_position_embeddings=64, patch_embed_proj=linear(3 * TEMPORAL * PATCH * PATCH, dim),
        block=VisionTransformerBlock.Config(
            norm1=norm(), norm2=norm(),
            attn=VisionAttention.Config(dim=dim, num_heads=heads, wq=linear(dim, dim), wk=linear(dim, dim),
                                        wv=linear(dim, dim), proj=linear(dim, dim)),
            mlp=VisionMLP.Config(fc1=linear(dim, 2 * dim), fc2=linear(2 * dim, dim))),
        rotary_pos_emb=VisionRotaryEmbedding.Config(dim=dim // heads // 2),
        merger=PatchMerger.Config(spatial_merge_size=MERGE, merged_hidden_size=merged, norm=norm(),
                                  fc1=linear(merged, merged), fc2=linear(merged, out)),
        param_init={"pos_embed": partial(nn.init.trunc_normal_, std=0.02)})
    torch.manual_seed(seed)
    tower = config.build()
    tower.init_states(buffer_device=None)
    return tower


def unpacked(tower: nn.Module) -> Callable[[Sequence[torch.Tensor], Sequence[Sequence[int]]], torch.Tensor]:
    """The tokens of images (each its patches) of grids, in order, by torchtitan's own forward of
    ``tower`` on a padded batch (one image a row), its attention
    :class:`~pybubble.integrations.torchtitan.packed_vision.SegmentAttention` on torchtitan's block
    mask (flex attention has no backward on CPU); torch.compile off (its block mask compiled)."""
    from ...integrations.torchtitan.packed_vision import use_segment_attention

    use_segment_attention(tower)

    def tokens(images: Sequence[torch.Tensor], grids: Sequence[Sequence[int]]) -> torch.Tensor:
        longest = max(x.shape[0] for x in images)
        batch = torch.stack([torch.cat([x, x.new_zeros(longest - x.shape[0], x.shape[1])]) for x in images])
        with torch.compiler.set_stance("force_eager"):
            out = tower(batch, grid_thw=torch.tensor([list(g) for g in grids]))
        return torch.cat([out[i, :x.shape[0] // 4] for i, x in enumerate(images)])
    return tokens


__all__ = ["MERGE", "PATCH", "TEMPORAL", "titan_tower", "unpacked"]
