"""torchtitan's native-resolution vision encoders (``Qwen35VisionEncoder`` of ``models/qwen3_5``) on
the runtime's packed chunks (:mod:`pybubble.runtime.packed`).

torchtitan's encoder takes a padded batch, one visual item per row, and builds from its
``grid_thw`` (read to host ints) the learned position embeddings (its table interpolated to each
item's grid), a rotary cache and a FlexAttention ``BlockMask`` with a Python ``mask_mod``. None of
that traces once for every step. :class:`PackedTitanVision` runs the same modules (patch embedding,
blocks, merger: torchtitan's own, with their weights) on one chunk of packed patches whose layout
comes in as tensors (:meth:`PackedTitanVision.layout`):

- the learned position embedding of each patch as the few table entries it interpolates and their
  weights (the interpolation is linear in the table, so the same weights as torchtitan's, and the
  table's gradient flows through them);
- the rotary cache of each patch (torchtitan's own ``compute_position_embeddings``);
- each patch's image (a segment id numbered over the microbatch; a chunk's padding is a segment
  of its own): attention is masked from it (:class:`SegmentAttention`:
  :func:`~pybubble.runtime.spans.segment_attention`, torch's SDPA), in place of the flex attention,
  which has no backward on CPU and whose block mask is built from Python. An image larger than a
  chunk is cut between merged rows (:meth:`PackedTitanVision.cuts`) and its attention runs over the
  chunks of its span (:mod:`pybubble.runtime.spans`).

Images sit in a chunk at multiples of ``merge ** 2`` patches in torchtitan's block order, so the
merger's reshape folds each image's own patches. Imports torch; torchtitan only where it is given
an encoder of it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...runtime.packed import ImagePart, row_cuts
from ...runtime.spans import segment_attention


class SegmentAttention(nn.Module):
    """Attention within each segment, as torchtitan's inner attention is called
    (``(q, k, v, attention_masks=...)`` on (items, patches, heads, head dim)): ``attention_masks`` a
    tensor of each patch's segment (items x patches), or a flex ``BlockMask`` (its ``mask_mod``
    evaluated densely; a query with no key gets 0, as flex attention gives it)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, attention_masks) -> torch.Tensor:
        """The attention's output (items, patches, heads, head dim)."""
        n, p = q.shape[:2]
        if isinstance(attention_masks, torch.Tensor) and n == 1:  # a packed chunk: one op, a span's across chunks
            return segment_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                     attention_masks.reshape(p)).transpose(1, 2)
        if isinstance(attention_masks, torch.Tensor):
            seg = attention_masks.reshape(n, p)
            mask = seg[:, :, None] == seg[:, None, :]
        else:
            at = torch.arange(p, device=q.device)
            mask = attention_masks.mask_mod(torch.arange(n, device=q.device)[:, None, None], None, at[None, :, None],
                                            at[None, None, :])
        some = mask.any(-1, keepdim=True)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=(mask | ~some)[:, None])
        return torch.where(some[:, None], out, 0.0).transpose(1, 2)


def use_segment_attention(encoder: nn.Module) -> nn.Module:
    """``encoder`` (a torchtitan vision encoder) with :class:`SegmentAttention` in every block."""
    for layer in encoder.layers.values():
        layer.attn.flex_attention = SegmentAttention()
    return encoder


@functools.lru_cache(maxsize=256)
def interpolation_weights(side: int, height: int, width: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of a ``side x side`` table each of ``height x width`` positions reads, in
    torchtitan's block order (``merge x merge`` groups), and their weights: bilinear with aligned
    corners, as torchtitan interpolates its learned position table, from the interpolation of the
    identity along each axis (bilinear is the product of the two axes' weights); ``(height * width,
    4)`` each, shared between calls (not to be written)."""
    def axis(n: int) -> tuple[torch.Tensor, torch.Tensor]:  # per position, its 2 entries and weights
        eye = torch.eye(side, dtype=torch.float64).reshape(1, side, side, 1)
        w = F.interpolate(eye, size=[n, 1], mode="bilinear", align_corners=True)[0, :, :, 0].T  # (n, side)
        weights, index = w.topk(min(2, side), dim=-1)
        return F.pad(index, (0, 2 - index.shape[1])), F.pad(weights, (0, 2 - weights.shape[1]))

    (row, row_w), (col, col_w) = axis(height), axis(width)
    index = row[:, None, :, None] * side + col[None, :, None, :]
    weight = row_w[:, None, :, None] * col_w[None, :, None, :]

    def block_order(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(height // merge, merge, width // merge, merge, 4).permute(0, 2, 1, 3, 4).reshape(-1, 4)
    return block_order(index), block_order(weight)


class PackedTitanVision(nn.Module):
    """torchtitan's ``Qwen35VisionEncoder`` (its patch embedding, blocks and merger, their weights
    its own) on one chunk of ``patches`` packed patches: ``forward(pixels, pos_index, pos_weight,
    rope_cache, segments)``, the layout's tensors from :meth:`layout`, gives the chunk's merged
    tokens (``patches / merge**2`` rows, the images' in order, the padding's last)."""

    def __init__(self, encoder: nn.Module, patches: int):
        super().__init__()
        self.encoder, self.patches = use_segment_attention(encoder), patches
        self.merge = encoder.spatial_merge_size
        self.side = encoder.num_grid_per_side
        self._ropes: dict[tuple[int, int, int], torch.Tensor] = {}

    def forward(self, pixels: torch.Tensor, pos_index: torch.Tensor, pos_weight: torch.Tensor,
                rope_cache: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        """The chunk's merged tokens."""
        from torchtitan.models.common.rope import CosSinRoPE

        e = self.encoder
        table = e.pos_embed.float()
        learned = (table[pos_index] * pos_weight[..., None].to(table.dtype)).sum(-2).to(e.pos_embed.dtype)
        x = (e.patch_embed(pixels) + learned)[None]
        for layer in e.layers.values():
            x = layer(x, rope_cache=rope_cache[None], rope_apply=CosSinRoPE.apply_rotary_emb,
                      attention_mask=segments[None])
        return e.merger(x)[0]

    def cuts(self, grid: Sequence[int]) -> list[int]:
        """Where an image of ``grid`` may be cut: between merged rows and between frames."""
        return row_cuts(grid, self.merge)

    def layout(self, parts: Sequence[ImagePart], chunk: int = 0) -> tuple[torch.Tensor, ...]:
        """The layout tensors of chunk ``chunk`` of ``parts`` (in order from its start; the rest
        padding): each patch's table entries and weights, its rotary cache (torchtitan's), its
        segment (its image's index in the microbatch; the padding's ``-1 - chunk``)."""
        index = torch.zeros(self.patches, 4, dtype=torch.long)
        weight = torch.zeros(self.patches, 4, dtype=torch.float32)
        segments = torch.full((self.patches,), -1 - chunk, dtype=torch.long)
        some = self._rope(1, self.merge, self.merge)
        rope = some.new_zeros(self.patches, *some.shape[1:])
        rope[..., : some.shape[-1] // 2] = 1.0  # the padding's: cos 1, sin 0 (no rotation)
        at = 0
        for part in parts:
            (t, h, w), a, b, n = part.grid, part.first, part.end, part.patches
            idx, wt = interpolation_weights(self.side, h, w, self.merge)
            index[at:at + n], weight[at:at + n] = idx.repeat(t, 1)[a:b], wt.float().repeat(t, 1)[a:b]
            rope[at:at + n] = self._rope(t, h, w)[a:b]
            segments[at:at + n] = part.image
            at += n
        return tuple(x.to(self.encoder.pos_embed.device) for x in (index, weight, rope, segments))

    def _rope(self, t: int, h: int, w: int) -> torch.Tensor:
        """torchtitan's rotary cache of an image of grid ``(t, h, w)`` (one row a patch; kept for the
        last 256 grids: it depends on the grid only)."""
        if (t, h, w) not in self._ropes:
            if len(self._ropes) >= 256:
                self._ropes.clear()
            with torch.no_grad():
                self._ropes[t, h, w] = self.encoder.compute_position_embeddings([[t, h, w]], t * h * w)[1][0].cpu()
        return self._ropes[t, h, w]


__all__ = ["PackedTitanVision", "SegmentAttention", "interpolation_weights", "use_segment_attention"]
