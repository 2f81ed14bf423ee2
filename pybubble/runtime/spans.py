"""Attention across chunks: an image of more patches than a chunk spans several chunks (a *span*),
and its attention runs over all of them exactly.

A packed encoder's attention is masked from each patch's segment (the image, or one window of it,
that the patch attends within). Where an encoder computes it with :func:`segment_attention` (an
opaque op, ``pybubble::segment_attention``, so that a trace keeps it as one node), the runtime's
pieces (:mod:`pybubble.runtime.segments`) call :func:`attend` in its place, and the chunks of one
span run each piece that holds it together, in lockstep (the plan orders a span's tasks piece by
piece: :func:`~pybubble.placement.step_placement.chain_order`):

- forward (:func:`span_forward`): each chunk's piece runs to its attention to gather its queries,
  keys, values and segments (:func:`attend` records them and stops the run); one attention over the
  span's patches, masked by segment, gives every chunk's rows; each chunk's piece then runs again
  and :func:`attend` returns its rows, whose autograd history reaches every chunk's inputs (a
  merged piece, as the baselines' unsplit encoder, runs its kernel pieces so in turn);
- backward (:func:`span_backward`): one ``torch.autograd.backward`` from every chunk's outputs
  of the piece, so each chunk's inputs get the gradients of the whole span's attention.

Segments are compared across the span's chunks: an encoder's layout numbers them so that only the
parts of one image (one frame of it where the encoder attends per frame) share a segment (see
:class:`~pybubble.runtime.packed.PackedEncoder`). Outside a span :func:`attend` is the chunk's own
masked attention.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

OP_NAME = "pybubble::segment_attention"
"""The op's name in torch's registry."""


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """Attention of ``q`` over ``k``, ``v`` (``(..., patches, head dim)``) between patches of one
    segment (``segments``: one id per patch), with torch's SDPA; contiguous, so that a trace's
    views of it hold for a span's rows too."""
    mask = segments[:, None] == segments[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).contiguous()


@torch.library.custom_op(OP_NAME, mutates_args=())
def _segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: torch.Tensor,
                       scale: float | None = None) -> torch.Tensor:
    return masked_attention(q, k, v, segments, scale)


@_segment_attention.register_fake
def _(q, k, v, segments, scale=None):
    return q.new_empty(q.shape)


def _setup(ctx, inputs, output) -> None:
    q, k, v, segments, scale = inputs
    ctx.save_for_backward(q, k, v, segments)
    ctx.scale = scale


def _backward(ctx, grad):
    q, k, v, segments = ctx.saved_tensors
    with torch.enable_grad():
        xs = [t.detach().requires_grad_() for t in (q, k, v)]
        dq, dk, dv = torch.autograd.grad(masked_attention(*xs, segments, ctx.scale), xs, grad)
    return dq, dk, dv, None, None


_segment_attention.register_autograd(_backward, setup_context=_setup)
SEGMENT_ATTENTION = torch.ops.pybubble.segment_attention.default
"""The op as a trace records it."""


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: torch.Tensor,
                      scale: float | None = None) -> torch.Tensor:
    """What a packed encoder's attention calls: :func:`masked_attention` (``q``, ``k``, ``v``:
    ``(..., patches, head dim)``; ``segments``: one id per patch) as one op, which the runtime's
    pieces run over a span's chunks at once (:func:`attend`)."""
    return SEGMENT_ATTENTION(q, k, v, segments, scale)


class ChunkRun(Protocol):
    """What a span runs of each chunk's :class:`~pybubble.runtime.segments.MicrobatchRun`."""

    pieces: Sequence[Any]
    """The encoder's pieces."""

    def inputs(self, i: int) -> tuple[torch.Tensor, ...]:
        """Piece ``i``'s inputs."""

    def take_forward(self, i: int, outputs: tuple[torch.Tensor, ...]) -> None:
        """Piece ``i``'s forward gave ``outputs``: kept, and the next piece's inputs."""

    def backward_pairs(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Piece ``i``'s outputs that take a gradient, with it."""

    def backward_done_with(self, i: int) -> None:
        """Piece ``i``'s backward ran."""


class _Span(threading.local):
    """What :func:`attend` does while a span runs (per thread)."""

    def __init__(self):
        self.rows: list[list[torch.Tensor]] | None = None
        """None: no span; else per attention of the piece so far, each chunk's joint rows."""
        self.calls: list | None = None
        """While gathering: each chunk's inputs of the attention gathered (else None)."""
        self.chunk = 0
        """The chunk whose piece runs."""
        self.seen = 0
        """Attentions this run of the piece has called."""


class _Gathered(Exception):
    """The attention being gathered was reached: the rest of this run of the piece is not needed."""


_span = _Span()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: torch.Tensor,
           scale: float | None = None) -> torch.Tensor:
    """:func:`segment_attention` as the runtime's pieces run it: the chunk's own attention, or,
    while a span runs (:func:`span_forward`), its rows of the span's."""
    if _span.rows is None:
        return masked_attention(q, k, v, segments, scale)
    a, _span.seen = _span.seen, _span.seen + 1
    if a < len(_span.rows):
        return _span.rows[a][_span.chunk]
    _span.calls.append((q, k, v, segments, scale))
    raise _Gathered


def _joint(calls: Sequence[tuple]) -> list[torch.Tensor]:
    """Each chunk's rows of one attention over the span's patches (``calls``: each chunk's
    queries, keys, values, segments, scale)."""
    q, k, v, seg = (torch.cat([c[i] for c in calls], dim=-2 if i < 3 else 0) for i in range(4))
    out = masked_attention(q, k, v, seg, calls[0][4])
    return [t.contiguous() for t in out.split([c[0].shape[-2] for c in calls], dim=-2)]


def span_forward(runs: Sequence[ChunkRun], i: int) -> None:
    """Piece ``i``'s forward on every chunk of one span (``runs``, in order), each of its attentions
    over the span's patches. A merged piece runs its pieces in turn (:attr:`Piece.parts`), one
    autograd graph through them; a piece with an attention runs on each chunk to the attention (the
    attentions before it given their joint rows), one attention over the span gives every chunk's
    rows, and the piece then runs on each chunk with them."""
    piece = runs[0].pieces[i]
    states = [run.inputs(i) for run in runs]
    with torch.enable_grad():
        for part in piece.parts or (piece,):
            states = _part_forward(part, states) if part.attentions else [tuple(part.fn(*x)) for x in states]
    for run, outputs in zip(runs, states):
        run.take_forward(i, outputs)


def _part_forward(part: Any, states: list[tuple[torch.Tensor, ...]]) -> list[tuple[torch.Tensor, ...]]:
    """One piece with attentions on every chunk's ``states``, its attentions over the span's chunks."""
    try:
        _span.rows = []
        for _ in range(part.attentions):
            _span.calls = []
            for c, state in enumerate(states):
                _span.chunk, _span.seen = c, 0
                try:
                    part.fn(*state)
                except _Gathered:
                    pass
            if len(_span.calls) != len(states):
                raise RuntimeError(f"piece {part.name}: an attention reached on {len(_span.calls)} of a span's "
                                   f"{len(states)} chunks")
            _span.rows.append(_joint(_span.calls))
        _span.calls = None
        out = []
        for c, state in enumerate(states):
            _span.chunk, _span.seen = c, 0
            out.append(tuple(part.fn(*state)))
        return out
    finally:
        _span.rows, _span.calls = None, None


def span_backward(runs: Sequence[ChunkRun], i: int) -> None:
    """Piece ``i``'s backward on every chunk of one span at once (``runs`` after their forwards ran
    with :func:`span_forward`): one autograd pass from every chunk's outputs."""
    pairs = [p for run in runs for p in run.backward_pairs(i)]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    for run in runs:
        run.backward_done_with(i)


def span_members(spans: Sequence[Sequence[int]]) -> dict[tuple[int, int], list[int]]:
    """Per (chain, chunk) in a span of several chunks (``spans[j]``: chain j's spans' sizes in
    order), the span's chunks in order."""
    out: dict[tuple[int, int], list[int]] = {}
    for j, sizes in enumerate(spans):
        c0 = 0
        for g in sizes:
            if g > 1:
                out.update({(j, c): list(range(c0, c0 + g)) for c in range(c0, c0 + g)})
            c0 += g
    return out


__all__ = ["OP_NAME", "SEGMENT_ATTENTION", "attend", "masked_attention", "segment_attention", "span_backward",
           "span_forward", "span_members"]
