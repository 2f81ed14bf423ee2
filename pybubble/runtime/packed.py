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
``layout`` function makes from the chunk's images (:class:`ImagePart`; :class:`PackedEncoder`
documents what an encoder must satisfy). Every chunk has the same shapes, whatever its images: the
pieces traced on one chunk serve every step, and moving work between replicas or slots moves whole
chunks.

An image of more patches than a chunk spans several chunks (a *span*) where the encoder's layout
says where an image may be cut (``layout.cuts``: rows of whole windows and merged patches) and
its attention is :func:`~pybubble.runtime.spans.segment_attention`: the span's chunks then run
each attention together, over all their patches (:mod:`pybubble.runtime.spans`), and move between
replicas as one. Elsewhere such an image is refused: size the chunk for the largest image of the
data (:func:`chunk_patches`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .batch import EncoderBatch

Grid = tuple[int, int, int]
"""An image's ``(temporal patches, rows, columns)`` of patches."""


@dataclass(frozen=True)
class ImagePart:
    """An image in a chunk: all of it, or the rows ``first .. end`` of its patches (a span's part:
    rows of its frames one after the other, ``w`` patches each, in the patches' order)."""

    image: int
    """The image's index in its microbatch."""
    grid: Grid
    """The whole image's grid."""
    first: int
    """Its first patch in the chunk (of the image's patches)."""
    end: int
    """One past its last patch in the chunk."""

    @property
    def patches(self) -> int:
        """Patches of the part."""
        return self.end - self.first

    def frames(self) -> list[tuple[int, int, int]]:
        """The part's rows frame by frame: ``(frame, first row, end row)`` within each frame."""
        t, h, w = self.grid
        a, b = self.first // w, self.end // w
        return [(f, max(a, f * h) - f * h, min(b, (f + 1) * h) - f * h) for f in range(a // h, -(-b // h))]


def whole_images(grids: Sequence[Sequence[int]]) -> list[ImagePart]:
    """Images of ``grids``, each whole, in order (one chunk's, as a layout takes them)."""
    return [ImagePart(i, tuple(int(x) for x in g), 0, grid_patches(g)) for i, g in enumerate(grids)]


Layout = Callable[[Sequence[ImagePart], int], Sequence[torch.Tensor]]
"""The layout tensors of one chunk (chunk ``c`` of its microbatch) of images (in order; the chunk's
rest is padding): the same shapes whatever the images. A layout that splits images across chunks
also has ``cuts(grid)`` (or, a bound method, its object has): the patches of an image of ``grid``
before each place it may be cut."""


def grid_patches(grid: Sequence[int]) -> int:
    """Patches of an image of ``grid``."""
    t, h, w = (int(x) for x in grid)
    return t * h * w


def row_cuts(grid: Sequence[int], rows: int) -> list[int]:
    """Where an image of ``grid`` may be cut at every ``rows`` rows of a frame and between frames
    (patches before each cut, in order, 0 and the whole image left out)."""
    t, h, w = (int(x) for x in grid)
    return [(f * h + r) * w for f in range(t) for r in range(0, h, rows) if f or r]


def pack_images(patches: Sequence[int], size: int, where: str = "images",
                cuts: Sequence[Sequence[int]] | None = None) -> tuple[list[list[tuple[int, int, int]]], list[int]]:
    """The images of ``patches`` patches each over chunks of ``size`` patches: per chunk its parts
    ``(image, first, end)`` (patches of the image) in the order they sit in it, and the chunks'
    spans (their sizes in order). First-fit decreasing: the largest image first, each into the
    first chunk with room (ties in order). An image larger than a chunk (``cuts[i]``: where it may
    be cut) starts a span of new chunks, each filled up to its last cut that fits; what its last
    chunk leaves is room for the smaller images. ValueError naming ``where`` for an image larger
    than a chunk that may not be cut (``cuts`` None) or whose cuts leave a part larger than one."""
    sizes = [int(x) for x in patches]
    chunks: list[list[tuple[int, int, int]]] = []
    room: list[int] = []
    spans: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        p = sizes[i]
        if p < 1 or (p > size and cuts is None):
            raise ValueError(f"{where}[{i}]: {p} patches, but a chunk holds {size} (an image's attention spans chunks "
                             "only where the encoder's layout cuts images: raise the chunk's patches to the largest "
                             "image's)")
        if p <= size:
            c = next((c for c, r in enumerate(room) if r >= p), len(chunks))
            if c == len(chunks):
                chunks.append([])
                room.append(size)
                spans.append(1)
            chunks[c].append((i, 0, p))
            room[c] -= p
            continue
        at, places, first = 0, [*cuts[i], p], len(chunks)
        while at < p:
            end = max((x for x in places if at < x <= at + size), default=None)
            if end is None:
                raise ValueError(f"{where}[{i}]: its rows from patch {at} to the next place it may be cut "
                                 f"({min(x for x in places if x > at)}) are more than a chunk's {size} patches")
            chunks.append([(i, at, end)])
            room.append(size - (end - at))
            at = end
        spans.append(len(chunks) - first)
    return chunks, spans


def chunk_patches(grids: Sequence[Grid], unit: int) -> int:
    """The fewest patches of a chunk that holds the largest of ``grids``, a multiple of ``unit``
    (the merger's ``merge * merge``)."""
    largest = max((grid_patches(g) for g in grids), default=unit)
    return -(-largest // unit) * unit


@dataclass(frozen=True)
class PackedMicrobatch:
    """One microbatch's images packed into chunks: which rows of the encoder's output are its
    images' tokens."""

    chunks: tuple[tuple[tuple[int, int, int], ...], ...]
    """Per chunk, its images' parts ``(image, first patch, end patch)`` in the order they sit in it."""
    token_index: torch.Tensor
    """The rows of the flattened output (chunks x tokens per chunk) that are the images' tokens, in
    the images' order (the padding's rows left out)."""
    spans: tuple[int, ...] = ()
    """The chunks' spans, their sizes in order (an image across several chunks: one span)."""

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
    encoder that reads its layout's values; :class:`~pybubble.runtime.EncoderRuntime` calls it.

    For images across chunks, also: every attention is
    :func:`~pybubble.runtime.spans.segment_attention` on segment ids that the layout numbers over
    the microbatch (the parts of one image, or of one frame of it, share one; a window, or a
    chunk's padding, has one of its own); nothing else mixes patches across the layout's ``cuts``
    (windows and merged patches lie within a part); positions come from the layout (a part's rows
    keep the image's)."""

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
    patches (:func:`pack_images`, an image larger than a chunk across several where ``layout``
    cuts images), each chunk's pixels padded with zeros and its ``layout`` tensors made; the
    batch's units (what balancing moves) are the spans. Also each microbatch's
    :class:`PackedMicrobatch`, to find its images' tokens in the encoder's output."""
    unit = merge * merge
    if patches % unit:
        raise ValueError(f"patches: {patches} is not a multiple of the merge's {unit}")
    per_chunk = patches // unit
    cut = getattr(layout, "cuts", None) or getattr(getattr(layout, "__self__", None), "cuts", None)  # or its object's
    batch, packs, units = [], [], []
    for k, (mine, shapes) in enumerate(zip(pixels, grids, strict=True)):
        shapes = [tuple(int(x) for x in g) for g in shapes]
        sizes = [grid_patches(g) for g in shapes]
        for i, (x, p) in enumerate(zip(mine, sizes, strict=True)):
            if tuple(x.shape) != (p, width) or p % unit:
                raise ValueError(f"pixels: microbatch {k} image {i} has shape {tuple(x.shape)}, its grid "
                                 f"{shapes[i]} has {p} patches (a multiple of {unit}) of {width} values each")
        chunks, spans = pack_images(sizes, patches, f"microbatch {k}: images",
                                    None if cut is None else [cut(g) for g in shapes])
        inputs, index = [], [[] for _ in sizes]  # index: each image's token rows, part by part
        for c, parts in enumerate(chunks):
            at = c * per_chunk
            for i, a, b in parts:
                index[i].append(torch.arange(at, at + (b - a) // unit))
                at += (b - a) // unit
            x = torch.cat([mine[i][a:b] for i, a, b in parts])
            inputs.append((torch.cat([x, x.new_zeros(patches - x.shape[0], x.shape[1])]),
                           *layout([ImagePart(i, shapes[i], a, b) for i, a, b in parts], c)))
        if inputs:
            stacked = tuple(torch.stack(parts) for parts in zip(*inputs))
        else:  # a microbatch without images: no chunk, the shapes of one
            stacked = tuple(t.new_zeros((0, *t.shape)) for t in (torch.zeros(patches, width), *layout([], 0)))
        batch.append(stacked)
        units.append(spans)
        rows = [torch.cat(x) for x in index]  # parts sit in their image's order (a span's chunks in turn)
        packs.append(PackedMicrobatch(tuple(tuple(c) for c in chunks),
                                      torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long), tuple(spans)))
    return EncoderBatch(batch, units), packs


__all__ = ["Grid", "ImagePart", "Layout", "PackedEncoder", "PackedMicrobatch", "check_traceable", "chunk_patches", "grid_patches", "pack_images",
           "packed_batch", "row_cuts", "whole_images"]
