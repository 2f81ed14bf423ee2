"""The encoder cut into kernel-level pieces.

Each piece maps a tuple of tensors (the state between two kernels: the residual stream and the
intermediate the next kernel needs) to the next tuple. A forward task runs one piece of one
encoder microbatch on detached copies of the previous piece's outputs; the backward task of that
piece later runs ``torch.autograd.backward`` from its outputs with the gradients the next piece
left on its inputs. Chained, the pieces give the gradients of the unsplit module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

State = tuple[torch.Tensor, ...]


@dataclass(frozen=True, slots=True)
class Piece:
    """One kernel-level task of the encoder: ``fn(*state) -> state``."""

    name: str
    """Where it comes from, e.g. ``"1.attn"`` (layer 1, attention kernel)."""
    fn: Callable[..., State]
    """The piece's forward; its parameters are those of the module it was cut from."""


class ViTBlock(nn.Module):
    """A pre-norm transformer block written with ``nn.Linear`` and ``scaled_dot_product_attention``
    (``causal=True`` for a GPT block)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4, causal: bool = False):
        super().__init__()
        if dim % heads:
            raise ValueError(f"heads: {heads} does not divide dim {dim}")
        self.heads = heads
        self.causal = causal
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = _split_heads(self.qkv(self.norm1(x)), self.heads)
        x = x + self.proj(_merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def _split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t, three_d = qkv.shape
    d = three_d // 3
    qkv = qkv.view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


def _merge_heads(a: torch.Tensor) -> torch.Tensor:
    b, h, t, dh = a.shape
    return a.transpose(1, 2).reshape(b, t, h * dh)


def _vit_block_pieces(m: ViTBlock, name: str) -> list[Piece]:
    def qkv(x):
        return (x, *_split_heads(m.qkv(m.norm1(x)), m.heads))

    def attn(x, q, k, v):
        return x, _merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=m.causal))

    def proj(x, a):
        return (x + m.proj(a),)

    def fc1(x):
        return x, F.gelu(m.fc1(m.norm2(x)))

    def fc2(x, h):
        return (x + m.fc2(h),)

    return [Piece(f"{name}.{f.__name__}", f) for f in (qkv, attn, proj, fc1, fc2)]


def _encoder_layer_pieces(m: nn.TransformerEncoderLayer, name: str) -> list[Piece]:
    mha = m.self_attn
    if not mha.batch_first:
        raise ValueError(f"{name}: nn.TransformerEncoderLayer with batch_first=False is not supported")
    if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError(f"{name}: nn.MultiheadAttention with separate q/k/v weights or bias_k is not supported")
    for key, p in (("dropout", m.dropout.p), ("self_attn.dropout", mha.dropout)):
        if p != 0.0:
            raise ValueError(f"{name}.{key}: {p} is not 0 (the split pieces must be deterministic)")
    heads = mha.num_heads
    act = m.activation

    def qkv(x):
        h = m.norm1(x) if m.norm_first else x
        return (x, *_split_heads(F.linear(h, mha.in_proj_weight, mha.in_proj_bias), heads))

    def attn(x, q, k, v):
        return x, _merge_heads(F.scaled_dot_product_attention(q, k, v))

    def proj(x, a):
        y = x + mha.out_proj(a)
        return (y if m.norm_first else m.norm1(y),)

    def fc1(x):
        return x, act(m.linear1(m.norm2(x) if m.norm_first else x))

    def fc2(x, h):
        y = x + m.linear2(h)
        return (y if m.norm_first else m.norm2(y),)

    return [Piece(f"{name}.{f.__name__}", f) for f in (qkv, attn, proj, fc1, fc2)]


def split_into_pieces(encoder: nn.Sequential) -> list[Piece]:
    """Cuts ``encoder`` into kernel-level pieces: each :class:`ViTBlock` and
    ``nn.TransformerEncoderLayer`` (batch_first, no dropout) into qkv, attn, proj, fc1, fc2; any
    other child module stays one piece."""
    if not isinstance(encoder, nn.Sequential):
        raise ValueError(f"encoder: {type(encoder).__name__} is not an nn.Sequential of layers")
    pieces: list[Piece] = []
    for name, child in encoder.named_children():
        if isinstance(child, ViTBlock):
            pieces.extend(_vit_block_pieces(child, name))
        elif isinstance(child, nn.TransformerEncoderLayer):
            pieces.extend(_encoder_layer_pieces(child, name))
        else:
            pieces.append(Piece(name, lambda *xs, _m=child: (_m(*xs),)))
    return pieces


class MicrobatchRun:
    """The state of one encoder microbatch going through the pieces: forward one piece at a time,
    then backward one piece at a time in reverse."""

    __slots__ = ("pieces", "_inputs", "_outputs", "_next_fwd", "_next_bwd", "output_grad")

    def __init__(self, pieces: Sequence[Piece], inputs: State):
        self.pieces = pieces
        self._inputs: list[State | None] = [None] * len(pieces)
        self._outputs: list[State | None] = [None] * len(pieces)
        self._inputs[0] = tuple(inputs)
        self._next_fwd = 0
        self._next_bwd = len(pieces) - 1
        self.output_grad: torch.Tensor | None = None

    @property
    def forward_done(self) -> bool:
        return self._next_fwd == len(self.pieces)

    @property
    def backward_done(self) -> bool:
        return self._next_bwd < 0

    def output(self) -> torch.Tensor:
        """The encoder's output (detached), once every forward piece ran."""
        if not self.forward_done:
            raise RuntimeError(f"forward pieces {self._next_fwd}.. have not run")
        return self._outputs[-1][0].detach()

    def forward_piece(self, i: int) -> None:
        """Runs piece ``i``'s forward; pieces run in order."""
        if i != self._next_fwd:
            raise RuntimeError(f"forward piece {i} out of order (next is {self._next_fwd})")
        with torch.enable_grad():
            self._outputs[i] = self.pieces[i].fn(*self._inputs[i])
        if i + 1 < len(self.pieces):
            self._inputs[i + 1] = tuple(
                t.detach().requires_grad_(t.requires_grad) for t in self._outputs[i])
        self._next_fwd += 1

    def backward_piece(self, i: int) -> None:
        """Runs piece ``i``'s backward; the last piece needs ``output_grad``, pieces run in reverse."""
        if i != self._next_bwd or not self.forward_done:
            raise RuntimeError(f"backward piece {i} out of order (next is {self._next_bwd})")
        outputs = self._outputs[i]
        if i == len(self.pieces) - 1:
            if self.output_grad is None:
                raise RuntimeError("backward of the last piece before its output gradient arrived")
            grads: Sequence[torch.Tensor | None] = (self.output_grad,)
        else:
            grads = [t.grad for t in self._inputs[i + 1]]
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        # Free what this piece held; its inputs' .grad stays for piece i - 1.
        self._outputs[i] = None
        if i + 1 < len(self.pieces):
            self._inputs[i + 1] = None
        self._next_bwd -= 1
