"""Named model shapes: ``presets.encoder(name)`` and ``presets.llm(name)``.

Each preset cites where its shape comes from. The Optimus ones (``vit-3b`` ... ``vit-22b``,
``gpt-11b``, ``llama-70b``, ``gpt-175b``) are the models of Feng et al., "Optimus: Accelerating
Large-Scale Multi-Modal LLM Training by Bubble Exploitation", USENIX ATC'25 (Tables 8 and 9).
"""

from __future__ import annotations

from collections.abc import Callable

from .checks import shown
from .models import EncoderConfig, LLMConfig

_ENCODERS: dict[str, Callable[[], EncoderConfig]] = {
    # Optimus Table 8: 48 layers, head dim 128, MLP 4x, width 2304/3072/4096/6144;
    # 256 tokens per image as in the Optimus experiments.
    "vit-3b": lambda: EncoderConfig(name="vit-3b", layers=48, hidden=2304, heads=18, tokens=256),
    "vit-5b": lambda: EncoderConfig(name="vit-5b", layers=48, hidden=3072, heads=24, tokens=256),
    "vit-11b": lambda: EncoderConfig(name="vit-11b", layers=48, hidden=4096, heads=32, tokens=256),
    "vit-22b": lambda: EncoderConfig(name="vit-22b", layers=48, hidden=6144, heads=48, tokens=256),
    # CLIP ViT-L/14 (Radford et al. 2021, Table 20): 24 layers, width 1024, 16 heads;
    # 224 px / 14 = 16x16 patches + class token.
    "vit-l-14": lambda: EncoderConfig(name="vit-l-14", layers=24, hidden=1024, heads=16, tokens=257),
    # OpenCLIP ViT-H/14 (open_clip model config ViT-H-14.json): 32 layers, width 1280, 16 heads.
    "vit-h-14": lambda: EncoderConfig(name="vit-h-14", layers=32, hidden=1280, heads=16, tokens=257),
    # ViT-g/14 (Zhai et al. 2022, "Scaling Vision Transformers", Table 2): 40 layers, width 1408,
    # 16 heads, MLP 6144.
    "vit-g-14": lambda: EncoderConfig(name="vit-g-14", layers=40, hidden=1408, heads=16,
                                      ffn_hidden=6144, tokens=257),
    # SigLIP so400m/14 at 384 px (Alabdulmohsin et al. 2023; HF google/siglip-so400m-patch14-384
    # config): 27 layers, width 1152, 16 heads, MLP 4304; 27x27 = 729 patches, no class token.
    "siglip-so400m": lambda: EncoderConfig(name="siglip-so400m", layers=27, hidden=1152, heads=16,
                                           ffn_hidden=4304, tokens=729),
    # EVA-CLIP-E/14 (Sun et al. 2023, EVA-CLIP; open_clip EVA02-E-14 config): 64 layers,
    # width 1792, 16 heads, MLP 15360.
    "eva-clip-e": lambda: EncoderConfig(name="eva-clip-e", layers=64, hidden=1792, heads=16,
                                        ffn_hidden=15360, tokens=257),
    # Qwen2-VL vision encoder (HF Qwen/Qwen2-VL-7B-Instruct config, vision_config): depth 32,
    # embed_dim 1280, 16 heads, mlp_ratio 4; 448x448 px / 14 = 32x32 = 1024 patches (dynamic
    # resolution: the token count varies per image).
    "qwen2-vl-vit": lambda: EncoderConfig(name="qwen2-vl-vit", layers=32, hidden=1280, heads=16,
                                          tokens=1024),
    # InternViT-300M-448px (Chen et al. 2024, InternVL 1.5 report, arXiv 2404.16821; HF
    # OpenGVLab/InternViT-300M-448px config, the encoder of InternVL2-8B): 24 layers, width 1024,
    # 16 heads, MLP 4096; one 448 px tile / 14 = 32x32 patches + class token. InternVL cuts an
    # image into 1-12 such tiles plus a thumbnail (dynamic resolution) and pixel-shuffles each
    # tile's output to 256 LLM tokens.
    "internvit-300m": lambda: EncoderConfig(name="internvit-300m", layers=24, hidden=1024, heads=16,
                                            ffn_hidden=4096, tokens=1025),
    # InternViT-6B-448px-V1-5 (same report; HF OpenGVLab/InternViT-6B-448px-V1-5 config, the
    # encoder of InternVL 1.5): 45 layers (the last 3 of 48 dropped), width 3200, 25 heads of 128,
    # MLP 12800; 448 px tiles as above.
    "internvit-6b": lambda: EncoderConfig(name="internvit-6b", layers=45, hidden=3200, heads=25,
                                          ffn_hidden=12800, tokens=1025),
}

_LLMS: dict[str, Callable[[], LLMConfig]] = {
    # Optimus Table 9: GPT-11B, 80 layers, width 3072, 24 heads (MLP 4x, GPT-2 vocabulary).
    "gpt-11b": lambda: LLMConfig(name="gpt-11b", layers=80, hidden=3072, heads=24, seq_len=2048,
                                 vocab=50257),
    # Llama 2 70B (Touvron et al. 2023, Table 1 / HF meta-llama/Llama-2-70b config): 80 layers,
    # width 8192, 64 heads, 8 KV heads, SwiGLU 28672, vocab 32000, context 4096.
    "llama-70b": lambda: LLMConfig(name="llama-70b", layers=80, hidden=8192, heads=64, kv_heads=8,
                                   ffn_hidden=28672, activation="swiglu", seq_len=4096, vocab=32000),
    # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, width 12288, 96 heads, context 2048.
    "gpt-175b": lambda: LLMConfig(name="gpt-175b", layers=96, hidden=12288, heads=96, seq_len=2048,
                                  vocab=50257),
    # Llama 3 8B (HF meta-llama/Meta-Llama-3-8B config): 32 layers, width 4096, 32 heads,
    # 8 KV heads, SwiGLU 14336, vocab 128256, context 8192.
    "llama-3-8b": lambda: LLMConfig(name="llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8,
                                    ffn_hidden=14336, activation="swiglu", seq_len=8192,
                                    vocab=128256),
    # Qwen2.5-7B (HF Qwen/Qwen2.5-7B config): 28 layers, width 3584, 28 heads, 4 KV heads,
    # SwiGLU 18944, vocab 152064.
    "qwen2.5-7b": lambda: LLMConfig(name="qwen2.5-7b", layers=28, hidden=3584, heads=28, kv_heads=4,
                                    ffn_hidden=18944, activation="swiglu", seq_len=4096,
                                    vocab=152064),
    # Qwen2.5-72B (HF Qwen/Qwen2.5-72B config): 80 layers, width 8192, 64 heads, 8 KV heads,
    # SwiGLU 29568, vocab 152064.
    "qwen2.5-72b": lambda: LLMConfig(name="qwen2.5-72b", layers=80, hidden=8192, heads=64,
                                     kv_heads=8, ffn_hidden=29568, activation="swiglu",
                                     seq_len=4096, vocab=152064),
}

ENCODERS = tuple(_ENCODERS)
"""Names of the encoder presets."""
LLMS = tuple(_LLMS)
"""Names of the LLM presets."""


def encoder(name: str) -> EncoderConfig:
    """The encoder preset `name` (a fresh object each call)."""
    factory = _ENCODERS.get(name.lower()) if isinstance(name, str) else None
    if factory is None:
        raise ValueError(f"encoder: unknown preset {shown(name)}; known: {', '.join(ENCODERS)}")
    return factory()


def llm(name: str) -> LLMConfig:
    """The LLM preset `name` (a fresh object each call)."""
    factory = _LLMS.get(name.lower()) if isinstance(name, str) else None
    if factory is None:
        raise ValueError(f"llm: unknown preset {shown(name)}; known: {', '.join(LLMS)}")
    return factory()


def model(name: str) -> EncoderConfig | LLMConfig:
    """The encoder or LLM preset `name`."""
    key = name.lower() if isinstance(name, str) else None
    if key in _ENCODERS:
        return encoder(key)
    if key in _LLMS:
        return llm(key)
    raise ValueError(f"model: unknown preset {shown(name)}; known: {', '.join(ENCODERS + LLMS)}")
