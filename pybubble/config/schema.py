"""The planner's input: an MLLM, its training batch, the LLM's parallel plan and the cluster, read
from YAML (or a dict) and checked, with errors that name the key.

```yaml
cluster: {gpus: 3072, gpu: h100, gpus_per_node: 8}
llm: {preset: gpt-175b}            # or explicit layers/hidden/heads/ffn_hidden/vocab/seq_len
encoders:                          # one or more
  - {preset: vit-22b, tokens_per_sample: 256, frozen: false}
training: {global_batch: 1536, micro_batch: 2, seq_len: 2048}
llm_plan: {dp: 48, pp: 8, tp: 8, vpp: 12, schedule: interleaved_1f1b}
memory_gb: 80
```
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import presets
from .checks import flag, known_keys, mapping, one_of, positive, positive_int, required, shown
from .documents import naming, read_yaml
from .limits import MAX_BATCH, MAX_GPUS, MAX_LAYERS, MAX_MICROBATCHES, MAX_TOKENS
from .models import EncoderConfig, LLMConfig

GPUS = ("h100", "h200", "a100-80gb", "cpu")
"""GPU kinds a config may name (the cost model's hardware)."""
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv")
"""Pipeline schedules of the LLM (the action tables of :mod:`pybubble.llm.tables`)."""


def _value(section: Mapping[str, Any], key: str, where: str, default: Any = None) -> Any:
    """``section[key]``, or `default` when it is missing and there is one (checked by the dataclass)."""
    if key not in section and default is not None:
        return default
    return required(section, key, where)


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    return mapping(required(doc, key, ""), key)


@dataclass(kw_only=True, slots=True)
class Cluster:
    """The GPUs the step runs on."""

    gpus: int
    """Number of GPUs in all."""
    gpu: str = "h100"
    """GPU kind, one of GPUS (the cost model's hardware)."""
    gpus_per_node: int = 8
    """GPUs per node (NVLink domain): TP groups stay inside a node."""

    def __post_init__(self) -> None:
        positive_int(self.gpus, "cluster.gpus", MAX_GPUS)
        positive_int(self.gpus_per_node, "cluster.gpus_per_node", MAX_GPUS)
        one_of(self.gpu, GPUS, "cluster.gpu")
        if self.gpus % self.gpus_per_node and self.gpus > self.gpus_per_node:
            raise ValueError(f"cluster.gpus: {self.gpus} is not a multiple of gpus_per_node ({self.gpus_per_node})")


@dataclass(kw_only=True, slots=True)
class Encoder:
    """One modality encoder and the data it sees."""

    model: EncoderConfig
    """The encoder's shape."""
    tokens_per_sample: int
    """Encoder tokens per training sample (images per sample x tokens per image)."""
    frozen: bool = False
    """A frozen encoder runs no backward."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, EncoderConfig):
            raise ValueError(f"model: {shown(self.model)} is not an EncoderConfig")
        positive_int(self.tokens_per_sample, "tokens_per_sample", MAX_TOKENS)
        flag(self.frozen, "frozen")

    @property
    def images_per_sample(self) -> int:
        """Images (or frames) per training sample: tokens per sample over the model's tokens per
        image, at least one."""
        return max(1, self.tokens_per_sample // self.model.tokens)


@dataclass(kw_only=True, slots=True)
class Training:
    """The batch of one training step."""

    global_batch: int
    """Samples per step over all data-parallel ranks."""
    micro_batch: int
    """Samples per microbatch."""
    seq_len: int
    """LLM tokens per sample."""

    def __post_init__(self) -> None:
        positive_int(self.global_batch, "training.global_batch", MAX_BATCH)
        positive_int(self.micro_batch, "training.micro_batch", MAX_BATCH)
        positive_int(self.seq_len, "training.seq_len", MAX_TOKENS)


@dataclass(kw_only=True, slots=True)
class LLMPlan:
    """The LLM's 3D-parallel plan."""

    dp: int
    """Data-parallel size."""
    pp: int
    """Pipeline stages."""
    tp: int
    """Tensor-parallel size."""
    vpp: int = 1
    """Model chunks per stage (interleaved schedules; zbv always has 2)."""
    schedule: str = "1f1b"
    """Pipeline schedule, one of SCHEDULES."""

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp"):
            positive_int(getattr(self, name), f"llm_plan.{name}", MAX_GPUS)
        positive_int(self.vpp, "llm_plan.vpp", MAX_LAYERS)
        one_of(self.schedule, SCHEDULES, "llm_plan.schedule")
        if self.schedule == "zbv":
            if self.vpp not in (1, 2):
                raise ValueError(f"llm_plan.vpp: {self.vpp}, but zbv runs 2 chunks per stage")
            self.vpp = 2  # the V shape: two chunks per stage
        elif self.vpp > 1 and self.schedule != "interleaved_1f1b":
            raise ValueError(f"llm_plan.vpp: {self.vpp} needs an interleaved schedule, not {self.schedule!r}")


@dataclass(kw_only=True, slots=True)
class Config:
    """A whole planning problem: see the module docstring for the YAML form."""

    cluster: Cluster
    """The GPUs."""
    llm: LLMConfig
    """The LLM backbone's shape."""
    encoders: list[Encoder]
    """The modality encoders (one or more)."""
    training: Training
    """The batch of one step."""
    llm_plan: LLMPlan
    """The LLM's 3D-parallel plan."""
    memory_gb: float = 80.0
    """Memory per GPU available to model states and activations (GB)."""
    source: str = field(default="")
    """Where the config was read from (for messages)."""

    def __post_init__(self) -> None:
        p, c, t = self.llm_plan, self.cluster, self.training
        if p.dp * p.pp * p.tp != c.gpus:
            raise ValueError(f"llm_plan: dp x pp x tp = {p.dp} x {p.pp} x {p.tp} = {p.dp * p.pp * p.tp}, "
                             f"not cluster.gpus ({c.gpus})")
        if p.tp > c.gpus_per_node:
            raise ValueError(f"llm_plan.tp: {p.tp} is more than cluster.gpus_per_node ({c.gpus_per_node})")
        if t.global_batch % (p.dp * t.micro_batch):
            raise ValueError(f"training.global_batch: {t.global_batch} is not a multiple of "
                             f"llm_plan.dp x training.micro_batch ({p.dp} x {t.micro_batch})")
        if self.llm.layers % (p.pp * p.vpp):
            raise ValueError(f"llm_plan: pp x vpp = {p.pp * p.vpp} does not divide the LLM's {self.llm.layers} layers")
        if not self.encoders:
            raise ValueError("encoders: at least one encoder is needed")
        positive(self.memory_gb, "memory_gb")
        if self.microbatches > MAX_MICROBATCHES:
            raise ValueError(f"training.global_batch: {t.global_batch:,} samples give {self.microbatches:,} "
                             f"microbatches per pipeline, more than the limit of {MAX_MICROBATCHES:,}")

    @property
    def microbatches(self) -> int:
        """LLM microbatches per step on each pipeline (global batch / (dp x micro batch))."""
        return self.training.global_batch // (self.llm_plan.dp * self.training.micro_batch)

    @property
    def encoder_images(self) -> int:
        """Images in one encoder microbatch: the LLM micro batch times the images per sample (the
        largest over the encoders)."""
        return self.training.micro_batch * max(e.images_per_sample for e in self.encoders)


_LLM_KEYS = ("preset", "name", "layers", "hidden", "heads", "head_dim", "kv_heads", "ffn_hidden",
             "activation", "vocab", "seq_len")
_ENCODER_KEYS = ("preset", "name", "layers", "hidden", "heads", "head_dim", "ffn_hidden", "activation",
                 "tokens", "tokens_per_sample", "frozen")


def _model(section: Mapping[str, Any], where: str, kind: str) -> Any:
    keys = _LLM_KEYS if kind == "llm" else _ENCODER_KEYS
    known_keys(section, keys, where)
    shape = {k: v for k, v in section.items() if k not in ("preset", "tokens_per_sample", "frozen")}
    try:
        if "preset" in section:
            base = presets.llm(section["preset"]) if kind == "llm" else presets.encoder(section["preset"])
            if not shape:
                return base
            fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
            fields.update(shape)
            return type(base)(**fields)
        shape.setdefault("name", "custom")
        return LLMConfig(**shape) if kind == "llm" else EncoderConfig(**shape)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> Config:
    """Reads and checks a planning config from a YAML file or a dict. ValueError naming the field
    (and the file, when read from one)."""
    if isinstance(source, Mapping):
        return _config(source, "")
    doc = read_yaml(source)
    path = str(Path(source))
    with naming(path):
        if not isinstance(doc, Mapping):
            raise ValueError(f"expected a mapping at the top level, got {type(doc).__name__}")
        return _config(doc, path)


def _config(doc: Mapping[str, Any], source: str) -> Config:
    known_keys(doc, ("cluster", "llm", "encoders", "training", "llm_plan", "memory_gb"), "config")
    cl = _section(doc, "cluster")
    known_keys(cl, ("gpus", "gpu", "gpus_per_node"), "cluster")
    cluster = Cluster(gpus=_value(cl, "gpus", "cluster"), gpu=cl.get("gpu", "h100"),
                      gpus_per_node=_value(cl, "gpus_per_node", "cluster", 8))
    llm = _model(_section(doc, "llm"), "llm", "llm")
    encs = doc.get("encoders")
    if not isinstance(encs, list) or not encs:
        raise ValueError(f"encoders: expected a non-empty list, got {shown(encs)}")
    encoders = []
    for i, e in enumerate(encs):
        where = f"encoders[{i}]"
        if not isinstance(e, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {type(e).__name__}")
        model = _model(e, where, "encoder")
        try:
            encoders.append(Encoder(model=model, frozen=e.get("frozen", False),
                                    tokens_per_sample=_value(e, "tokens_per_sample", where, model.tokens)))
        except ValueError as err:
            raise ValueError(f"{where}.{err}") from None
    tr = _section(doc, "training")
    known_keys(tr, ("global_batch", "micro_batch", "seq_len"), "training")
    training = Training(global_batch=_value(tr, "global_batch", "training"),
                        micro_batch=_value(tr, "micro_batch", "training"),
                        seq_len=_value(tr, "seq_len", "training", llm.seq_len))
    pl = _section(doc, "llm_plan")
    known_keys(pl, ("dp", "pp", "tp", "vpp", "schedule"), "llm_plan")
    plan = LLMPlan(dp=_value(pl, "dp", "llm_plan"), pp=_value(pl, "pp", "llm_plan"), tp=_value(pl, "tp", "llm_plan"),
                   vpp=_value(pl, "vpp", "llm_plan", 1), schedule=pl.get("schedule", "1f1b"))
    return Config(cluster=cluster, llm=llm, encoders=encoders, training=training, llm_plan=plan,
                  memory_gb=positive(doc.get("memory_gb", 80.0), "memory_gb"), source=source)
