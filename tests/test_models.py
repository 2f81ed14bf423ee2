"""Model configs, presets and the kernel decomposition: FLOPs match the closed forms."""

import pytest

import pybubble
from pybubble import presets
from pybubble.costs.kernels import decompose_layer, layer_flops
from pybubble.config.models import EncoderConfig, LLMConfig

ALL = [("encoder", n) for n in presets.ENCODERS] + [("llm", n) for n in presets.LLMS]


def get(kind, name):
    return presets.encoder(name) if kind == "encoder" else presets.llm(name)


def closed_form(m, b, s):
    """Forward FLOPs of one layer, written out independently of decompose.py: QKV and projection
    GEMMs, attention (4·b·s²·q), MLP GEMMs (three for SwiGLU). For MLP ratio 4 and MHA this is
    24·b·s·h² + 4·b·s²·h."""
    h, q, kv, f = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim, m.ffn_hidden
    mlp = (6 if m.activation == "swiglu" else 4) * b * s * h * f
    return 2 * b * s * h * (q + 2 * kv) + 2 * b * s * q * h + 4 * b * s * s * q + mlp


def seq(m):
    return m.tokens if isinstance(m, EncoderConfig) else 2048


def test_preset_counts_and_unknown_names():
    assert {"vit-3b", "vit-5b", "vit-11b", "vit-22b", "vit-l-14", "vit-h-14", "vit-g-14", "siglip-so400m",
            "eva-clip-e", "qwen2-vl-vit"} <= set(presets.ENCODERS)
    assert {"gpt-11b", "llama-70b", "gpt-175b", "llama-3-8b", "qwen2.5-7b", "qwen2.5-72b"} <= set(presets.LLMS)
    with pytest.raises(ValueError, match="unknown preset 'vit-99b'.*vit-22b"):
        presets.encoder("vit-99b")
    with pytest.raises(ValueError, match="unknown preset 'gpt-5'.*gpt-175b"):
        presets.llm("gpt-5")
    assert pybubble.presets.encoder("ViT-22B").hidden == 6144


def test_optimus_vits_follow_table_8():
    for name, width in (("vit-3b", 2304), ("vit-5b", 3072), ("vit-11b", 4096), ("vit-22b", 6144)):
        m = presets.encoder(name)
        assert (m.layers, m.head_dim, m.hidden, m.ffn_hidden) == (48, 128, width, 4 * width)


@pytest.mark.parametrize(("kind", "name"), ALL)
def test_forward_flops_match_closed_form(kind, name):
    m = get(kind, name)
    b, s = 2, seq(m)
    got = layer_flops(m, b, s)
    assert got == pytest.approx(closed_form(m, b, s), rel=0.01)
    if m.ffn_hidden == 4 * m.hidden and m.kv_heads == m.heads and m.head_dim * m.heads == m.hidden:
        h = m.hidden
        assert got == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h, rel=0.01)


@pytest.mark.parametrize(("kind", "name"), ALL)
def test_backward_is_twice_forward_and_tp_divides_gemms(kind, name):
    m = get(kind, name)
    b, s = 1, seq(m)
    fwd = layer_flops(m, b, s)
    assert layer_flops(m, b, s, phase="bwd") == pytest.approx(2 * fwd, rel=0.01)
    for tp in (2, 4, 8):
        if m.heads % tp or m.ffn_hidden % tp:
            continue
        for phase in ("fwd", "bwd"):
            full = sum(k.flops for k in decompose_layer(m, b, s, phase=phase) if k.kind == "gemm")
            part = sum(k.flops for k in decompose_layer(m, b, s, tp=tp, phase=phase) if k.kind == "gemm")
            kv_replicated = m.kv_heads < tp
            assert part == pytest.approx(full / tp, rel=0.05 if kv_replicated else 1e-9)


def test_kernel_lists_have_the_expected_shape():
    m = presets.encoder("vit-22b")
    names = [k.name for k in decompose_layer(m, 2, 256, tp=8)]
    assert names == ["ln1", "qkv_gemm", "attention", "proj_gemm", "attn_all_reduce", "residual1", "ln2",
                     "fc1_gemm", "gelu", "fc2_gemm", "mlp_all_reduce", "residual2"]
    sp = [k.name for k in decompose_layer(m, 2, 256, tp=8, sequence_parallel=True)]
    assert "attn_all_gather" in sp and "mlp_reduce_scatter" in sp and "attn_all_reduce" not in sp
    assert [k.name for k in decompose_layer(m, 2, 256)].count("attn_all_reduce") == 0
    bwd = decompose_layer(m, 2, 256, tp=8, phase="bwd")
    names = [k.name for k in bwd]
    for gemm in ("qkv", "proj", "fc1", "fc2"):
        assert f"{gemm}_dgrad" in names and f"{gemm}_wgrad" in names
    assert names.count("attn_all_reduce_bwd") == 1 and names.count("mlp_all_reduce_bwd") == 1
    for i, k in enumerate(bwd):
        assert all(a < i for a in k.after) and k.phase == "bwd"
        assert k.resource == ("comm" if k.kind == "collective" else "compute")
    waited_on = {a for k in bwd for a in k.after}
    assert not any(i in waited_on for i, k in enumerate(bwd) if k.name.endswith("_wgrad"))


@pytest.mark.parametrize(("field", "value"), [("layers", 0), ("hidden", -1), ("heads", 1.5),
                                               ("activation", "relu"), ("tokens", 0)])
def test_config_validation_names_field_and_value(field, value):
    kwargs = dict(name="x", layers=2, hidden=64, heads=4, tokens=16)
    kwargs[field] = value
    with pytest.raises(ValueError, match=f"{field}: {value!r}"):
        EncoderConfig(**kwargs)


def test_config_defaults_and_gqa_checks():
    m = LLMConfig(name="x", layers=1, hidden=64, heads=8)
    assert (m.head_dim, m.kv_heads, m.ffn_hidden) == (8, 8, 256)
    with pytest.raises(ValueError, match="kv_heads: 3"):
        LLMConfig(name="x", layers=1, hidden=64, heads=8, kv_heads=3)
    with pytest.raises(ValueError, match="head_dim"):
        LLMConfig(name="x", layers=1, hidden=65, heads=8)


def test_decompose_rejects_bad_arguments():
    m = presets.encoder("vit-l-14")
    with pytest.raises(ValueError, match="micro_batch: 0"):
        decompose_layer(m, 0, 257)
    with pytest.raises(ValueError, match="phase: 'up'"):
        decompose_layer(m, 1, 257, phase="up")
    with pytest.raises(ValueError, match="tp: 3"):
        decompose_layer(m, 1, 257, tp=3)
    with pytest.raises(ValueError, match="seq_len: 257"):
        decompose_layer(m, 1, 257, tp=2, sequence_parallel=True)
