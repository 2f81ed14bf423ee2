"""A native-resolution vision encoder in the shape the runtime cuts (groundwork of packed pieces):
HF transformers' Qwen2.5-VL vision tower over a packed sequence of a fixed number of patches whose
per-step layout comes in as tensors, so that one trace serves every step's images.

The layout of a chunk's images is four tensors, from transformers' ``vision_utils``
(:func:`packed_layout`): each patch's rotary position (``position_ids``), each patch's segment in
the full-attention layers (one per frame of an image), the windows' order (``window_index``) and
each patch's window (window-attention layers). transformers takes them precomputed (its
``get_vision_*`` pop them from the forward's keyword arguments). Its vision attention splits the
sequence by Python lengths unless a flash attention is requested, where it hands its
``cu_seqlens`` argument on as a tensor without reading it: :func:`block_attention`, registered
under a name with "flash" in it (:data:`BLOCK_ATTENTION`), takes that tensor as the patches'
segments and attends within each
(:func:`~pybubble.runtime.spans.segment_attention`), so the trace does not specialise to the
traced layout. A step's patches short of the fixed count are one more "image" of padding whose
outputs are dropped (:func:`padded_grids`).

An image larger than a chunk is cut between rows of whole windows (:attr:`QwenLayout.cuts`): its
parts keep their rows' positions, its windows stay within a chunk, and the segments of its
frames are numbered over the microbatch, so the runtime runs its full attention over the chunks
of its span (:mod:`pybubble.runtime.spans`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ...runtime.packed import ImagePart, row_cuts
from ...runtime.spans import segment_attention
from .vision_libraries import import_vision_libraries

QWEN_PATCH = 14
"""Pixels of a patch's side (Qwen2.5-VL's)."""
QWEN_WINDOW = 56
"""Pixels of a window's side (Qwen2.5-VL's window attention)."""
QWEN_MERGE = 2
"""Patches merged into a token along each side (Qwen2.5-VL's)."""

BLOCK_ATTENTION = "pybubble_flash_blocks"
"""The attention implementation :func:`block_attention` is registered as ("flash" in the name:
transformers then passes ``cu_seqlens`` as a tensor instead of splitting by Python lengths)."""


def block_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None = None, scaling: float | None = None, dropout: float = 0.0,
                    cu_seq_lens_q: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention within each segment of ``cu_seq_lens_q`` (the layout's segment of each patch;
    ``query``: batch 1, heads, patches, head dim), as transformers' attention functions are called;
    returns (batch, patches, heads, head dim) as its flash attention does."""
    out = segment_attention(query, key, value, cu_seq_lens_q, scaling)
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


FRAMES = 1 << 20
"""Segment ids of one image's frames: ``image * FRAMES + frame``."""


@dataclass(frozen=True)
class PackedLayout:
    """A chunk's layout of its images over the packed sequence, as tensors."""

    position_ids: torch.Tensor
    """Each patch's (row, column) in its image, for the rotary embedding (patches x 2)."""
    segments: torch.Tensor
    """Each patch's segment in the full-attention layers (in window order): one per frame of an
    image, numbered over the microbatch; the padding's below 0."""
    window_index: torch.Tensor
    """The order of the merged patches in the window-attention layers."""
    window_segments: torch.Tensor
    """Each patch's window (in window order), numbered over the microbatch's chunks."""

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The four tensors, in :class:`PackedQwenVision`'s order."""
        return self.position_ids, self.segments, self.window_index, self.window_segments


def packed_layout(parts: Sequence[ImagePart], config, patches: int, chunk: int = 0) -> PackedLayout:
    """The layout tensors of chunk ``chunk`` of ``patches`` patches holding ``parts`` (the rest
    padding) for a tower of ``config`` (its merge, window and patch sizes): each part frame by
    frame as a grid of its own rows (windows are cut at the part's rows, which :attr:`QwenLayout.cuts`
    keeps at whole windows), its positions shifted to its rows in the image."""
    import_vision_libraries()
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    merge = config.spatial_merge_size
    rows = [(p.image, f, a, b, p.grid[2]) for p in parts for f, a, b in p.frames()]
    grids = padded_grids([(1, b - a, w) for _, _, a, b, w in rows], patches, merge)
    grid = torch.tensor([list(g) for g in grids])
    window_index, cu_window = get_vision_window_index(grid, merge, config.window_size, config.patch_size)
    position = get_vision_position_ids(grid, merge)
    sizes = [t * h * w for t, h, w in grids]
    shift = torch.tensor([a for _, _, a, _, _ in rows] + [0] * (len(grids) - len(rows)))
    position[:, 0] += shift.repeat_interleave(torch.tensor(sizes))
    full = torch.tensor([i * FRAMES + f for i, f, _, _, _ in rows] + [-1 - chunk] * (len(grids) - len(rows)))
    windows = torch.searchsorted(torch.as_tensor(cu_window, dtype=torch.int64)[1:], torch.arange(patches), right=True)
    return PackedLayout(position, full.repeat_interleave(torch.tensor(sizes)), window_index,
                        chunk * (patches + 1) + windows)


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
    on chunks of ``patches`` patches: a chunk's parts, its padding added (:func:`padded_grids`), as
    :func:`packed_layout`'s four tensors."""

    config: object
    """The tower's config (its merge, window and patch sizes)."""
    patches: int
    """Patches of a chunk."""

    @property
    def window_rows(self) -> int:
        """Patch rows of a row of windows (the tower's window size over its patch size)."""
        return self.config.window_size // self.config.patch_size

    def cuts(self, grid: Sequence[int]) -> list[int]:
        """Where an image of ``grid`` may be cut: between rows of whole windows and between frames."""
        return row_cuts(grid, self.window_rows)

    def __call__(self, parts: Sequence[ImagePart], chunk: int = 0) -> tuple[torch.Tensor, ...]:
        """The layout tensors of chunk ``chunk`` holding ``parts``."""
        return packed_layout(parts, self.config, self.patches, chunk).tensors()


def qwen_tower(hidden: int, depth: int, heads: int, out: int, attention: str | None = None) -> nn.Module:
    """transformers' Qwen2.5-VL vision tower at a small size (random weights from torch's seed):
    patch 14, merge 2, temporal patch 2, windows of 56 pixels, full attention at every other block
    (the last one included); ``attention``: its implementation (None: transformers' default)."""
    import_vision_libraries()
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = Qwen2_5_VLVisionConfig(
        depth=depth, hidden_size=hidden, intermediate_size=2 * hidden, num_heads=heads, out_hidden_size=out,
        patch_size=QWEN_PATCH, spatial_merge_size=QWEN_MERGE, temporal_patch_size=2, window_size=QWEN_WINDOW,
        in_channels=3,
        fullatt_block_indexes=list(range(depth - 1, -1, -2))[::-1],
        **({} if attention is None else {"attn_implementation": attention}))
    return Qwen2_5_VisionTransformerPretrainedModel(config)


class PackedQwenVision(nn.Module):
    """transformers' Qwen2.5-VL vision tower (its attention :func:`use_block_attention`'s) on a packed chunk
    of ``patches`` patches, its layout as tensor inputs: ``forward(pixels, position_ids, segments,
    window_index, window_segments)`` gives the merged tokens (``patches / merge^2`` rows, the
    images' in order, the padding's last)."""

    def __init__(self, tower: nn.Module, patches: int):
        super().__init__()
        self.tower, self.patches = use_block_attention(tower), patches
        self.layout = QwenLayout(tower.config, patches)
        """The layout tensors of a chunk's grids."""

    def forward(self, pixels: torch.Tensor, position_ids: torch.Tensor, segments: torch.Tensor,
                window_index: torch.Tensor, window_segments: torch.Tensor) -> torch.Tensor:
        """The merged tokens of the chunk (its layout's tensors in, no Python values of it; the
        segments go where transformers takes ``cu_seqlens``, which it hands on unread)."""
        return self.tower(pixels, grid_thw=None, position_ids=position_ids, cu_seqlens=segments,
                          window_index=window_index, cu_window_seqlens=window_segments, max_seqlen=self.patches,
                          max_window_seqlen=self.patches).pooler_output


__all__ = ["BLOCK_ATTENTION", "FRAMES", "QWEN_MERGE", "QWEN_PATCH", "QWEN_WINDOW", "PackedLayout", "PackedQwenVision", "QwenLayout", "qwen_tower", "block_attention", "packed_layout", "padded_grids",
           "register_block_attention", "use_block_attention"]
