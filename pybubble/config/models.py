"""Model configurations: the shapes of a modality encoder (a ViT) and of an LLM backbone.

Both are transformer stacks; only the shape matters to pybubble (FLOPs, bytes, sequence lengths),
never the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import integer, one_of, positive_int, shown
from .limits import MAX_LAYERS, MAX_MODEL_DIM, MAX_TOKENS, MAX_VOCAB

ACTIVATIONS = ("gelu", "swiglu")
"""MLP activations a shape may name."""


_LIMIT = {"layers": MAX_LAYERS, "dtype_bytes": 16, "tokens": MAX_TOKENS, "seq_len": MAX_TOKENS, "vocab": MAX_VOCAB}


def _check_positive(obj: object, *names: str) -> None:
    for name in names:
        positive_int(getattr(obj, name), name, _LIMIT.get(name, MAX_MODEL_DIM))


@dataclass(kw_only=True, slots=True)
class TransformerShape:
    """The shape of a stack of pre-norm transformer layers (common to encoders and LLMs)."""

    name: str
    """Preset or user name, used in tables and traces."""
    layers: int
    """Number of transformer layers."""
    hidden: int
    """Model width h (residual stream)."""
    heads: int
    """Number of query heads."""
    head_dim: int = 0
    """Width of one head; 0 means hidden // heads."""
    kv_heads: int = 0
    """Number of key/value heads (grouped-query attention); 0 means heads (multi-head)."""
    ffn_hidden: int = 0
    """Inner width of the MLP; 0 means 4 * hidden."""
    activation: str = "gelu"
    """MLP activation: 'gelu' (two GEMMs) or 'swiglu' (gated: three GEMMs)."""
    dtype_bytes: int = 2
    """Bytes per activation and weight element (2 for bf16)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: {shown(self.name)} is not a non-empty string")
        _check_positive(self, "layers", "hidden", "heads", "dtype_bytes")
        for name in ("head_dim", "kv_heads", "ffn_hidden"):
            integer(getattr(self, name), name, minimum=0)
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ValueError(f"head_dim: 0 needs heads ({self.heads}) to divide hidden ({self.hidden})")
            self.head_dim = self.hidden // self.heads
        if self.kv_heads == 0:
            self.kv_heads = self.heads
        if self.ffn_hidden == 0:
            self.ffn_hidden = 4 * self.hidden
        _check_positive(self, "head_dim", "kv_heads", "ffn_hidden")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads: {self.kv_heads} does not divide heads ({self.heads})")
        one_of(self.activation, ACTIVATIONS, "activation")

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): heads * head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights of one layer's GEMMs (biases and norms left out)."""
        h = self.hidden
        mlp_in = 2 * self.ffn_hidden if self.activation == "swiglu" else self.ffn_hidden
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + h * mlp_in + self.ffn_hidden * h


@dataclass(kw_only=True, slots=True)
class EncoderConfig(TransformerShape):
    """A modality encoder (vision transformer): bidirectional attention over one image's tokens."""

    tokens: int = 256
    """Tokens per image (patches, plus class token where the model has one) at the preset resolution."""

    def __post_init__(self) -> None:
        TransformerShape.__post_init__(self)
        _check_positive(self, "tokens")


@dataclass(kw_only=True, slots=True)
class LLMConfig(TransformerShape):
    """An LLM backbone (decoder-only transformer)."""

    seq_len: int = 2048
    """Training sequence length in tokens."""
    vocab: int = 32000
    """Vocabulary size (for the embedding and output layer, outside the per-layer kernels)."""

    def __post_init__(self) -> None:
        TransformerShape.__post_init__(self)
        _check_positive(self, "seq_len", "vocab")


__all__ = ["ACTIVATIONS", "EncoderConfig", "LLMConfig", "TransformerShape"]
