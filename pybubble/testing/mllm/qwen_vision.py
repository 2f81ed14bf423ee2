"""A native-resolution vision encoder in the shape the runtime cuts (groundwork of packed pieces):
HF transformers' Qwen2.5-VL vision tower over a packed sequence of a fixed number of patches whose
per-step layout comes in as tensors, so that one trace serves every step's images.

The layout of a step's images (their ``grid_thw``) is four tensors, as transformers'
``vision_utils`` computes them (:func:`packed_layout`): each patch's rotary position
(``position_ids``), the images' boundaries (``cu_seqlens``, full-attention layers), the windows'
order and boundaries (``window_index``, ``cu_window_seqlens``, window-attention layers).
transformers takes them precomputed (its ``get_vision_*`` pop them from the forward's keyword
arguments). Its vision attention splits the sequence by Python lengths unless a flash attention is
requested, where it hands ``cu_seqlens`` on as a tensor: :func:`block_attention`, registered under
a name with "flash" in it (:data:`BLOCK_ATTENTION`), computes attention within each block from
that tensor with tensor ops (a mask from ``searchsorted``, torch's SDPA), so the trace does not
specialise to the traced layout. A step's patches short of the fixed count are one more
"image" of padding whose outputs are dropped (:func:`padded_grids`); ``cu_*`` tensors are padded to a
fixed length by repeating their last boundary (empty blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .vision_libraries import import_vision_libraries

BLOCK_ATTENTION = "pybubble_flash_blocks"
"""The attention implementation :func:`block_attention` is registered as ("flash" in the name:
transformers then passes ``cu_seqlens`` as a tensor instead of splitting by Python lengths)."""


def block_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None = None, scaling: float | None = None, dropout: float = 0.0,
                    cu_seq_lens_q: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention within each block of ``cu_seq_lens_q`` (``query``: batch 1, heads, patches,
    head dim), as transformers' attention functions are called; returns (batch, patches, heads,
    head dim) as its flash attention does."""
    n = query.shape[2]
    block = torch.searchsorted(cu_seq_lens_q[1:].to(torch.int64), torch.arange(n, device=query.device), right=True)
    mask = block[:, None] == block[None, :]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_block_attention() -> None:
    """:func:`block_attention` known to transformers as :data:`BLOCK_ATTENTION`."""
    import_vision_libraries()
    from transformers import AttentionInterface

    AttentionInterface.register(BLOCK_ATTENTION, block_attention)


def padded_grids(grids: Sequence[Sequence[int]], patches: int, merge: int = 2) -> list[tuple[int, int, int]]:
    """``grids`` and, where their patches fall short of ``patches``, one padding image of the rest
    (a single row of merged patches); ValueError where they exceed it or the rest is no whole
    number of merged patches."""
    used = sum(t * h * w for t, h, w in grids)
    rest = patches - used
    unit = merge * merge
    if rest < 0 or rest % unit:
        raise ValueError(f"grids: {used} patches for a chunk of {patches} (the rest must be >= 0 and a multiple "
                         f"of {unit})")
    return [tuple(g) for g in grids] + ([(1, merge, rest // merge)] if rest else [])


@dataclass(frozen=True)
class PackedLayout:
    """A step's layout of its images over the packed sequence, as tensors."""

    position_ids: torch.Tensor
    """Each patch's (row, column) in its image, for the rotary embedding (patches x 2)."""
    cu_seqlens: torch.Tensor
    """The images' boundaries in the sequence (per frame), padded by repeats: the full-attention blocks."""
    window_index: torch.Tensor
    """The order of the merged patches in the window-attention layers."""
    cu_window_seqlens: torch.Tensor
    """The windows' boundaries, padded by repeats: the window-attention blocks."""

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The four tensors, in :class:`PackedQwenVision`'s order."""
        return self.position_ids, self.cu_seqlens, self.window_index, self.cu_window_seqlens


def _pad_to(cu: torch.Tensor, length: int) -> torch.Tensor:
    if cu.numel() > length:
        raise ValueError(f"cu_seqlens: {cu.numel()} boundaries, more than the fixed {length}")
    return torch.cat([cu, cu[-1:].expand(length - cu.numel())])


def packed_layout(grids: Sequence[Sequence[int]], config, boundaries: int) -> PackedLayout:
    """The layout tensors of ``grids`` (the padded images of one chunk) for a tower of ``config``
    (its merge, window and patch sizes), each ``cu_*`` padded to ``boundaries`` entries."""
    import_vision_libraries()
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

    grid = torch.tensor([list(g) for g in grids])
    window_index, cu_window = get_vision_window_index(grid, config.spatial_merge_size, config.window_size,
                                                      config.patch_size)
    return PackedLayout(get_vision_position_ids(grid, config.spatial_merge_size),
                        _pad_to(get_vision_cu_seqlens(grid), boundaries), window_index,
                        _pad_to(torch.as_tensor(cu_window, dtype=torch.int32), boundaries))


def use_block_attention(tower: nn.Module) -> nn.Module:
    """``tower`` with :func:`block_attention` as its attention: set on its config after it is built,
    since transformers' constructors refuse a flash-named implementation they cannot find on their
    hub (transformers' private ``_attn_implementation``, named here only)."""
    register_block_attention()
    tower.config._attn_implementation = BLOCK_ATTENTION
    return tower


@dataclass(frozen=True)
class QwenLayout:
    """The runtime's :data:`~pybubble.runtime.packed.Layout` of a Qwen2.5-VL tower of ``config``
    on chunks of ``patches`` patches: a chunk's grids, its padding added (:func:`padded_grids`),
    as :func:`packed_layout`'s four tensors, each ``cu_*`` of :attr:`boundaries` entries."""

    config: object
    """The tower's config (its merge, window and patch sizes)."""
    patches: int
    """Patches of a chunk."""

    @property
    def boundaries(self) -> int:
        """Entries of each ``cu_*`` tensor: one per merged patch and one more, the most a chunk's
        frames or windows can need (each holds one merged patch at least)."""
        return self.patches // self.config.spatial_merge_size ** 2 + 1

    def __call__(self, grids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, ...]:
        """The layout tensors of a chunk of ``grids``."""
        merge = self.config.spatial_merge_size
        return packed_layout(padded_grids(grids, self.patches, merge), self.config, self.boundaries).tensors()


def qwen_tower(hidden: int, depth: int, heads: int, out: int, attention: str | None = None) -> nn.Module:
    """transformers' Qwen2.5-VL vision tower at a small size (random weights from torch's seed):
    patch 14, merge 2, temporal patch 2, windows of 56 pixels, full attention at every other block
    (the last one included); ``attention``: its implementation (None: transformers' default)."""
    import_vision_libraries()
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = Qwen2_5_VLVisionConfig(
        depth=depth, hidden_size=hidden, intermediate_size=2 * hidden, num_heads=heads, out_hidden_size=out,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56, in_channels=3,
        fullatt_block_indexes=list(range(depth - 1, -1, -2))[::-1],
        **({} if attention is None else {"attn_implementation": attention}))
    return Qwen2_5_VisionTransformerPretrainedModel(config)


class PackedQwenVision(nn.Module):
    """transformers' Qwen2.5-VL vision tower (its attention :func:`use_block_attention`'s) on a packed chunk
    of ``patches`` patches, its layout as tensor inputs: ``forward(pixels, position_ids, cu_seqlens,
    window_index, cu_window_seqlens)`` gives the merged tokens (``patches / merge^2`` rows, the
    images' in order, the padding's last)."""

    def __init__(self, tower: nn.Module, patches: int):
        super().__init__()
        self.tower, self.patches = use_block_attention(tower), patches
        self.layout = QwenLayout(tower.config, patches)
        """The layout tensors of a chunk's grids."""

    def forward(self, pixels: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor,
                window_index: torch.Tensor, cu_window_seqlens: torch.Tensor) -> torch.Tensor:
        """The merged tokens of the chunk (its layout's tensors in, no Python values of it)."""
        return self.tower(pixels, grid_thw=None, position_ids=position_ids, cu_seqlens=cu_seqlens,
                          window_index=window_index, cu_window_seqlens=cu_window_seqlens, max_seqlen=self.patches,
                          max_window_seqlen=self.patches).pooler_output


__all__ = ["BLOCK_ATTENTION", "PackedLayout", "PackedQwenVision", "QwenLayout", "qwen_tower", "block_attention", "packed_layout", "padded_grids",
           "register_block_attention", "use_block_attention"]
