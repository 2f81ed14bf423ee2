"""Native-resolution encoders: a step's images of any size packed into chunks of a fixed number of
patches, so that the encoder's pieces are traced once and run every step.

The vision encoders of Qwen2-VL/2.5-VL, Kimi's MoonViT and torchtitan's VLMs take each image at its
own resolution: its patches are packed into one sequence, attention is block-diagonal (one block
per image, or windows inside one), rotary positions come from each image's grid, and a merger
folds ``merge x merge`` patches into one LLM token. A trace of such an encoder specialises to the
grids it saw, unless the per-step layout comes in as tensors.

Here the runtime's unit of work (its *tile*, dim 0 of an :class:`~pybubble.runtime.batch.EncoderBatch`)
is one *chunk* of ``patches`` patches: a microbatch's images fill as few chunks as first-fit
decreasing finds (:func:`pack_images`); the rest of a chunk is padding, one more block of its own whose outputs are
dropped (no gradient reaches them). Each chunk's inputs are its pixels and the layout tensors a
``layout`` function makes from the chunk's grids (:class:`PackedEncoder` documents what an encoder
must satisfy). Every chunk has the same shapes, whatever its images: the pieces traced on one chunk
serve every step, and moving work between replicas or slots moves whole chunks.

An image of more patches than a chunk is refused (its attention would span chunks): size the
chunk for the largest image of the data (:func:`chunk_patches`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .batch import EncoderBatch

Grid = tuple[int, int, int]
"""An image's ``(temporal patches, rows, columns)`` of patches."""

Layout = Callable[[Sequence[Grid]], Sequence[torch.Tensor]]
"""The layout tensors of one chunk's images (their grids, in order; the chunk's rest is padding):
the same shapes whatever the grids."""


def grid_patches(grid: Sequence[int]) -> int:
    """Patches of an image of ``grid``."""
    t, h, w = (int(x) for x in grid)
    return t * h * w


def pack_images(patches: Sequence[int], size: int, where: str = "images") -> list[list[int]]:
    """The images of ``patches`` patches each over the fewest chunks of ``size`` patches first-fit
    decreasing finds (the largest image first, each into the first chunk with room; ties in
    order): per chunk, its images' indices in the order they sit in it. ValueError naming ``where``
    for an image larger than a chunk."""
    sizes = [int(x) for x in patches]
    for i, p in enumerate(sizes):
        if p < 1 or p > size:
            raise ValueError(f"{where}[{i}]: {p} patches, but a chunk holds {size} (an image's attention does not "
                             "span chunks: raise the chunk's patches to the largest image's)")
    chunks: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        c = next((c for c, r in enumerate(room) if r >= sizes[i]), len(chunks))
        if c == len(chunks):
            chunks.append([])
            room.append(size)
        chunks[c].append(i)
        room[c] -= sizes[i]
    return chunks


def chunk_patches(grids: Sequence[Grid], unit: int) -> int:
    """The fewest patches of a chunk that holds the largest of ``grids``, a multiple of ``unit``
    (the merger's ``merge * merge``)."""
    largest = max((grid_patches(g) for g in grids), default=unit)
    return -(-largest // unit) * unit


@dataclass(frozen=True)
class PackedMicrobatch:
    """One microbatch's images packed into chunks: which rows of the encoder's output are its
    images' tokens."""

    chunks: tuple[tuple[int, ...], ...]
    """Per chunk, its images' indices in the order they sit in it."""
    token_index: torch.Tensor
    """The rows of the flattened output (chunks x tokens per chunk) that are the images' tokens, in
    the images' order (the padding's rows left out)."""

    def tokens(self, output: torch.Tensor) -> torch.Tensor:
        """The images' tokens (their rows, in order) of ``output`` (chunks x tokens per chunk x width)."""
        return output.reshape(-1, output.shape[-1])[self.token_index.to(output.device)]


class PackedEncoder(nn.Module):
    """A packed encoder as the runtime cuts it: ``encoder(pixels, *layout)`` on one chunk (pixels:
    ``patches`` x patch values; the layout: the tensors of a :data:`Layout`) gives the chunk's
    tokens (``patches / merge**2`` rows, its images' in order, the padding's after them); this module
    runs it on a batch of chunks (dim 0 of each input, as the runtime's tiles) and stacks them.

    What the encoder must satisfy (else tracing specialises to one layout, or the pieces mix
    chunks): it takes the layout as tensors and reads no Python value of it (no ``.item()``, no
    ``.tolist()``, no lengths from a tensor); its attention is masked from those tensors (a chunk's
    padding is a block of its own); its output rows come in the images' order, the padding's last;
    nothing mixes chunks (no batch norm in training mode). :func:`check_traceable` refuses an
    encoder that reads its layout's values; :class:`~pybubble.runtime.EncoderRuntime` calls it."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, pixels: torch.Tensor, *layout: torch.Tensor) -> torch.Tensor:
        """The chunks' tokens (chunks x tokens per chunk x width)."""
        return torch.stack([self.encoder(pixels[i], *(t[i] for t in layout)) for i in range(pixels.shape[0])])


def check_traceable(encoder: nn.Module, example: Sequence[torch.Tensor]) -> None:
    """Refuses (ValueError naming the reason) a packed encoder that reads a value of its inputs as a
    Python number (``.item()``, ``.tolist()``, a length taken from a tensor): traced on real
    tensors it would bake the example's layout into its pieces, and every other step would run the
    example's. The check traces it once with fake tensors (``make_fx``'s fake mode), where no such
    value exists."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.func import functional_call

    state = {**dict(encoder.named_parameters()), **dict(encoder.named_buffers())}
    try:
        make_fx(lambda s, *x: functional_call(encoder, s, x), tracing_mode="fake")(state, *example)
    except Exception as e:  # what a trace without values cannot follow
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = next((line.strip() for line in str(e).splitlines() if line.strip().startswith("Caused by")), "")
        raise ValueError(f"encoder: its layout inputs are read as Python values, so one trace would serve one "
                         f"layout only (see pybubble.runtime.packed.PackedEncoder for what an encoder must "
                         f"satisfy): {type(e).__name__}: {first}{' ' + where if where else ''}") from None


def packed_batch(pixels: Sequence[Sequence[torch.Tensor]], grids: Sequence[Sequence[Grid]], *, patches: int,
                 width: int, layout: Layout, merge: int = 2) -> tuple[EncoderBatch, list[PackedMicrobatch]]:
    """A step's images as the runtime's batch of chunks: ``pixels[k][i]`` (patches x ``width``
    values of a patch) and ``grids[k][i]`` of microbatch k's image i, packed into chunks of ``patches``
    patches (:func:`pack_images`), each chunk's pixels padded with zeros and its ``layout`` tensors made;
    the batch's units (what balancing moves) are the chunks. Also each microbatch's
    :class:`PackedMicrobatch`, to find its images' tokens in the encoder's output."""
    unit = merge * merge
    if patches % unit:
        raise ValueError(f"patches: {patches} is not a multiple of the merge's {unit}")
    per_chunk = patches // unit
    batch, packs = [], []
    for k, (mine, shapes) in enumerate(zip(pixels, grids, strict=True)):
        sizes = [grid_patches(g) for g in shapes]
        for i, (x, p) in enumerate(zip(mine, sizes, strict=True)):
            if tuple(x.shape) != (p, width) or p % unit:
                raise ValueError(f"pixels: microbatch {k} image {i} has shape {tuple(x.shape)}, its grid "
                                 f"{tuple(shapes[i])} has {p} patches (a multiple of {unit}) of {width} values each")
        chunks = pack_images(sizes, patches, f"microbatch {k}: images")
        inputs, first = [], [0] * len(sizes)  # first: each image's first token in the flattened output
        for c, ids in enumerate(chunks):
            at = c * per_chunk
            for i in ids:
                first[i], at = at, at + sizes[i] // unit
            x = torch.cat([mine[i] for i in ids])
            inputs.append((torch.cat([x, x.new_zeros(patches - x.shape[0], x.shape[1])]),
                           *layout([tuple(shapes[i]) for i in ids])))
        index = [torch.arange(first[i], first[i] + sizes[i] // unit) for i in range(len(sizes))]
        if inputs:
            stacked = tuple(torch.stack(parts) for parts in zip(*inputs))
        else:  # a microbatch without images: no chunk, the shapes of one
            stacked = tuple(t.new_zeros((0, *t.shape)) for t in (torch.zeros(patches, width), *layout([])))
        batch.append(stacked)
        packs.append(PackedMicrobatch(tuple(tuple(c) for c in chunks),
                                      torch.cat(index) if index else torch.zeros(0, dtype=torch.long)))
    return EncoderBatch(batch, [[1] * t[0].shape[0] for t in batch]), packs


__all__ = ["Grid", "Layout", "PackedEncoder", "PackedMicrobatch", "check_traceable", "chunk_patches", "grid_patches", "pack_images",
           "packed_batch"]
