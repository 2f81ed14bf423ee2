"""Kernel decomposition: one transformer layer as the list of kernels a GPU runs for it.

The bubble filler places encoder work kernel by kernel, so a layer is cut into its GEMMs,
attention, element-wise kernels and tensor-parallel collectives, each with its FLOPs and the bytes
it moves (memory traffic for compute kernels, the collective's tensor size for comm kernels).

FLOP conventions (matching Megatron-LM and Optimus): a GEMM of (m x k) by (k x n) is 2mkn FLOPs;
attention counts QK^T and PV, 4·b·s²·(heads·head_dim) forward, bidirectional (no causal halving);
backward is twice forward: each GEMM splits into an input-gradient GEMM and a weight-gradient GEMM
of the forward's size, and attention backward counts its four gradient matmuls. FlashAttention also
recomputes QK^T in the backward; that extra work is not in ``flops`` but in the lower efficiency the
cost model gives the ``attention_bwd`` kind. For MLP ratio 4 and multi-head attention a layer's
forward is 24·b·s·h² + 4·b·s²·h FLOPs plus the small element-wise terms.

Activation recomputation (``recompute``, Megatron-LM's ``--recompute-granularity``) puts forward work
inside the backward: ``full`` runs the layer's whole forward again (its TP collectives included)
before the layer's backward kernels, from the layer input saved in the forward, so a layer's
backward is three forwards' worth of FLOPs and a training step counts four passes, Megatron-LM's
96·b·s·l·h²·(1 + s/(6h)) per step for such layers; ``selective`` runs only the core attention
again, just before its gradient. Recomputed kernels are named ``recompute_<forward name>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.checks import one_of, positive_int, shown
from ..config.models import EncoderConfig, LLMConfig, TransformerShape
from ..config.schema import RECOMPUTE

PHASES = ("fwd", "bwd")
"""The encoder's passes: a kernel belongs to the forward or to the backward."""
RESOURCES = ("compute", "comm")
"""What a kernel occupies: the compute units (SMs) or the network link."""
KERNEL_KINDS = ("gemm", "attention", "attention_bwd", "activation", "norm", "elementwise", "collective")
"""Cost-model classes of kernels (one efficiency each)."""
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
"""Collectives a comm kernel may be."""


@dataclass(kw_only=True, slots=True)
class Kernel:
    """One kernel of a layer, as one rank of the TP group runs it."""

    name: str
    """What the kernel does, e.g. ``qkv_gemm`` or ``fc1_wgrad``."""
    phase: str
    """``fwd`` or ``bwd``."""
    resource: str
    """``compute`` (SMs) or ``comm`` (the network link)."""
    kind: str
    """Cost-model class: ``gemm``, ``attention``, ``attention_bwd``, ``activation`` (GELU/SwiGLU),
    ``norm`` (layer norms), ``elementwise`` (residual adds) or ``collective``."""
    flops: float
    """Floating-point operations on this rank."""
    bytes: float
    """Memory traffic on this rank (compute kernels) or size of the collective's full tensor (comm)."""
    after: tuple[int, ...]
    """Indices (in the same list) of the kernels this one waits for; all smaller than its own."""
    collective: str = ""
    """For comm kernels: ``all_reduce``, ``all_gather`` or ``reduce_scatter``."""
    group: int = 1
    """For comm kernels: ranks taking part (the TP degree)."""


def splits_heads(model: TransformerShape, tp: int) -> bool:
    """Whether a TP group of `tp` can split `model`'s attention heads (query heads divided evenly;
    key/value heads divided, or replicated when there are fewer than `tp`)."""
    return model.heads % tp == 0 and (model.kv_heads % tp == 0 or tp % model.kv_heads == 0)


def _check_args(model: TransformerShape, micro_batch: int, seq_len: int, tp: int, phase: str,
                recompute: str) -> None:
    if not isinstance(model, TransformerShape):
        raise ValueError(f"model: {shown(model)} is not an EncoderConfig or LLMConfig")
    for name, value in (("micro_batch", micro_batch), ("seq_len", seq_len), ("tp", tp)):
        positive_int(value, name)
    one_of(phase, PHASES, "phase")
    one_of(recompute, RECOMPUTE, "recompute")
    if not splits_heads(model, tp):
        raise ValueError(f"tp: {tp} does not divide the heads ({model.heads}, kv {model.kv_heads}) of {model.name}")
    if model.ffn_hidden % tp:
        raise ValueError(f"tp: {tp} does not divide ffn_hidden ({model.ffn_hidden}) of {model.name}")


def _gemm(name: str, phase: str, m: float, k: float, n: float, dtype: int, after: tuple[int, ...]) -> Kernel:
    """An (m x k) @ (k x n) GEMM: 2mkn FLOPs, reads both operands and writes the result once."""
    return Kernel(name=name, phase=phase, resource="compute", kind="gemm", flops=2.0 * m * k * n,
                  bytes=dtype * (m * k + k * n + m * n), after=after)


@dataclass(frozen=True, slots=True)
class _Shard:
    """One rank's share of a layer's activations: the kernels whose size is the layer's width."""

    tokens: float
    """Tokens of the micro batch (b·s)."""
    local_tokens: float
    """Tokens the norms and residuals work on (b·s / tp under sequence parallelism)."""
    hidden: int
    """The model's width."""
    dtype: int
    """Bytes per element."""
    tp: int
    """The TP degree."""

    def norm(self, name: str) -> Kernel:
        """A layer norm: mean/var, normalise, scale, shift (~8 FLOPs per element); reads x, writes y."""
        return Kernel(name=name, phase="fwd", resource="compute", kind="norm",
                      flops=8.0 * self.local_tokens * self.hidden,
                      bytes=2.0 * self.dtype * self.local_tokens * self.hidden, after=())

    def residual(self, name: str, ph: str, after: tuple[int, ...]) -> Kernel:
        """A residual add."""
        return Kernel(name=name, phase=ph, resource="compute", kind="elementwise",
                      flops=self.local_tokens * self.hidden,
                      bytes=3.0 * self.dtype * self.local_tokens * self.hidden, after=after)

    def comm(self, name: str, ph: str, op: str, after: tuple[int, ...]) -> Kernel:
        """A TP collective `op` of the layer's full activation."""
        return Kernel(name=name, phase=ph, resource="comm", kind="collective", flops=0.0,
                      bytes=float(self.dtype * self.tokens * self.hidden), after=after, collective=op, group=self.tp)


def decompose_layer(model: EncoderConfig | LLMConfig | TransformerShape, micro_batch: int, seq_len: int,
                    tp: int = 1, sequence_parallel: bool = False, phase: str = "fwd",
                    recompute: str = "none") -> list[Kernel]:
    """The kernels of one layer of `model` for `micro_batch` sequences of `seq_len` tokens on one
    rank of a TP group of `tp` (Megatron column/row-parallel split: attention heads and the MLP's
    inner width are divided by `tp`).

    Without sequence parallelism each TP block ends in an all-reduce; with it, each block starts
    with an all-gather and ends with a reduce-scatter, and the norms and residuals work on
    ``seq_len / tp`` tokens. Kernels are listed in dependency order: ``after`` of each names earlier
    kernels only. Backward kernels run in reverse layer order; the weight-gradient GEMMs hang off the
    chain (nothing in the layer waits for them) so a scheduler may place them apart. `recompute`
    (one of ``RECOMPUTE``) adds the recomputed forward kernels to the backward (see the module
    docstring); it changes nothing in the forward.
    """
    _check_args(model, micro_batch, seq_len, tp, phase, recompute)
    if sequence_parallel and seq_len % tp:
        raise ValueError(f"seq_len: {seq_len} is not divisible by tp ({tp}) under sequence parallelism")
    tokens = float(micro_batch * seq_len)
    shard = _Shard(tokens=tokens, local_tokens=tokens / tp if sequence_parallel else tokens, hidden=model.hidden,
                   dtype=model.dtype_bytes, tp=tp)
    fwd = _forward_kernels(model, micro_batch, seq_len, shard, sequence_parallel)
    return fwd if phase == "fwd" else _backward_kernels(fwd, shard, sequence_parallel, recompute)


def _forward_kernels(model: TransformerShape, b: int, s: int, shard: _Shard, sequence_parallel: bool) -> list[Kernel]:
    """The layer's forward, in execution order: each kernel depends on the one before."""
    tp, h, d, tokens = shard.tp, model.hidden, model.dtype_bytes, shard.tokens
    q = model.q_dim / tp
    kv = model.kv_dim / tp if model.kv_heads >= tp else model.head_dim  # KV heads replicated when fewer than tp
    f = model.ffn_hidden / tp
    fc1_out = 2 * f if model.activation == "swiglu" else f
    act_flops_per = 4.0 if model.activation == "swiglu" else 8.0  # silu*gate / tanh-GELU per element
    gathered = tp > 1 and sequence_parallel  # each block starts with an all-gather
    block_end = "reduce_scatter" if sequence_parallel else "all_reduce"
    fwd: list[Kernel] = []

    def add(k: Kernel) -> None:
        k.after = (len(fwd) - 1,) if fwd else ()
        fwd.append(k)

    add(shard.norm("ln1"))
    if gathered:
        add(shard.comm("attn_all_gather", "fwd", "all_gather", ()))
    add(_gemm("qkv_gemm", "fwd", tokens, h, q + 2 * kv, d, ()))
    add(Kernel(name="attention", phase="fwd", resource="compute", kind="attention",
               flops=4.0 * b * s * s * q, bytes=d * tokens * (2 * q + 2 * kv), after=()))
    add(_gemm("proj_gemm", "fwd", tokens, q, h, d, ()))
    if tp > 1:
        add(shard.comm(f"attn_{block_end}", "fwd", block_end, ()))
    add(shard.residual("residual1", "fwd", ()))
    add(shard.norm("ln2"))
    if gathered:
        add(shard.comm("mlp_all_gather", "fwd", "all_gather", ()))
    add(_gemm("fc1_gemm", "fwd", tokens, h, fc1_out, d, ()))
    add(Kernel(name=model.activation, phase="fwd", resource="compute", kind="activation",
               flops=act_flops_per * tokens * f, bytes=d * tokens * (fc1_out + f), after=()))
    add(_gemm("fc2_gemm", "fwd", tokens, f, h, d, ()))
    if tp > 1:
        add(shard.comm(f"mlp_{block_end}", "fwd", block_end, ()))
    add(shard.residual("residual2", "fwd", ()))
    return fwd


def _recomputed(k: Kernel) -> Kernel:
    """Forward kernel `k` run again in the backward (activation recomputation)."""
    return Kernel(name=f"recompute_{k.name}", phase="bwd", resource=k.resource, kind=k.kind, flops=k.flops,
                  bytes=k.bytes, after=(), collective=k.collective, group=k.group)


def _backward_kernels(fwd: list[Kernel], shard: _Shard, sequence_parallel: bool, recompute: str) -> list[Kernel]:
    """The layer's backward: the forward walked in reverse. Under sequence parallelism each
    collective's gradient is its mirror (all-gather <-> reduce-scatter) at the same place; without
    it the all-reduce moves to the block's start (after the QKV / FC1 input-gradient GEMM)."""
    mirror = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}
    bwd: list[Kernel] = []
    chain = -1  # index of the last kernel on the input-gradient chain

    def push(k: Kernel, on_chain: bool = True) -> None:
        nonlocal chain
        k.after = (chain,) if chain >= 0 else ()
        bwd.append(k)
        if on_chain:
            chain = len(bwd) - 1

    if recompute == "full":  # the layer's forward again, from its saved input, before its backward
        for k in fwd:
            push(_recomputed(k))
    for k in reversed(fwd):
        base = k.name.removesuffix("_gemm")
        if k.kind == "gemm":
            # dX = dY @ W^T and dW = X^T @ dY: both the forward GEMM's size
            push(Kernel(name=f"{base}_dgrad", phase="bwd", resource="compute", kind="gemm",
                        flops=k.flops, bytes=k.bytes, after=()), on_chain=False)
            dgrad = len(bwd) - 1
            push(Kernel(name=f"{base}_wgrad", phase="bwd", resource="compute", kind="gemm",
                        flops=k.flops, bytes=k.bytes, after=()), on_chain=False)
            chain = dgrad
            if shard.tp > 1 and not sequence_parallel and base in ("qkv", "fc1"):
                # Megatron's f: identity forward, all-reduce of the input gradient backward
                block = "attn" if base == "qkv" else "mlp"
                push(shard.comm(f"{block}_all_reduce_bwd", "bwd", "all_reduce", ()))
        elif k.kind == "attention":
            if recompute == "selective":  # the core attention again, just before its gradient
                push(_recomputed(k))
            push(Kernel(name="attention_bwd", phase="bwd", resource="compute", kind="attention_bwd",
                        flops=2.0 * k.flops, bytes=2.0 * k.bytes, after=()))
        elif k.kind == "collective":
            if not sequence_parallel:
                continue  # the block-end all-reduce's gradient is the identity (Megatron's g)
            op = mirror[k.collective]
            push(Kernel(name=k.name.replace(k.collective, op) + "_bwd", phase="bwd", resource="comm",
                        kind="collective", flops=0.0, bytes=k.bytes, after=(), collective=op, group=shard.tp))
        elif k.kind == "norm":  # reads x and dy, writes dx: twice the forward's traffic
            push(Kernel(name=f"{k.name}_bwd", phase="bwd", resource="compute", kind="norm",
                        flops=2.0 * k.flops, bytes=2.0 * k.bytes, after=()))
        else:
            push(Kernel(name=f"{k.name}_bwd", phase="bwd", resource="compute", kind=k.kind,
                        flops=2.0 * k.flops, bytes=1.5 * k.bytes, after=()))
    return bwd


def layer_flops(model: TransformerShape, micro_batch: int, seq_len: int, tp: int = 1,
                phase: str = "fwd", recompute: str = "none") -> float:
    """Sum of the FLOPs of :func:`decompose_layer`'s kernels."""
    return sum(k.flops for k in decompose_layer(model, micro_batch, seq_len, tp=tp, phase=phase, recompute=recompute))
