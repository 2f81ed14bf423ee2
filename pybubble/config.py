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

import yaml

from . import presets
from .models import EncoderConfig, LLMConfig
from .schedules import NAMES as SCHEDULES

GPUS = ("h100", "h200", "a100-80gb", "cpu")


def _positive_int(section: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    if key not in section:
        if default is None:
            raise ValueError(f"{where}.{key}: missing")
        return default
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}.{key}: {value!r} is not a positive integer")
    return value


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    if key not in doc:
        raise ValueError(f"{key}: missing")
    value = doc[key]
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: expected a mapping, got {type(value).__name__}")
    return value


def _unknown(section: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in section:
        if key not in known:
            raise ValueError(f"{where}.{key}: unknown key (known: {', '.join(known)})")


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
        if self.gpu not in GPUS:
            raise ValueError(f"cluster.gpu: {self.gpu!r} is not one of {', '.join(GPUS)}")
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


@dataclass(kw_only=True, slots=True)
class Training:
    """The batch of one training step."""

    global_batch: int
    """Samples per step over all data-parallel ranks."""
    micro_batch: int
    """Samples per microbatch."""
    seq_len: int
    """LLM tokens per sample."""


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
    """Pipeline schedule, one of pybubble.schedules.NAMES."""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"llm_plan.schedule: {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
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
    llm: LLMConfig
    encoders: list[Encoder]
    training: Training
    llm_plan: LLMPlan
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
        if not self.memory_gb > 0:
            raise ValueError(f"memory_gb: {self.memory_gb!r} is not positive")

    @property
    def microbatches(self) -> int:
        """LLM microbatches per step on each pipeline (global batch / (dp x micro batch))."""
        return self.training.global_batch // (self.llm_plan.dp * self.training.micro_batch)


_LLM_KEYS = ("preset", "name", "layers", "hidden", "heads", "head_dim", "kv_heads", "ffn_hidden",
             "activation", "vocab", "seq_len")
_ENCODER_KEYS = ("preset", "name", "layers", "hidden", "heads", "head_dim", "ffn_hidden", "activation",
                 "tokens", "tokens_per_sample", "frozen")


def _model(section: Mapping[str, Any], where: str, kind: str) -> Any:
    keys = _LLM_KEYS if kind == "llm" else _ENCODER_KEYS
    _unknown(section, keys, where)
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
    """Reads and checks a planning config from a YAML file or a dict."""
    name = ""
    if isinstance(source, Mapping):
        doc = source
    else:
        path = Path(source)
        name = str(path)
        try:
            doc = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{path}: no such file") from None
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: expected a mapping at the top level")
    _unknown(doc, ("cluster", "llm", "encoders", "training", "llm_plan", "memory_gb"), "config")
    cl = _section(doc, "cluster")
    _unknown(cl, ("gpus", "gpu", "gpus_per_node"), "cluster")
    cluster = Cluster(gpus=_positive_int(cl, "gpus", "cluster"), gpu=str(cl.get("gpu", "h100")),
                      gpus_per_node=_positive_int(cl, "gpus_per_node", "cluster", 8))
    llm = _model(_section(doc, "llm"), "llm", "llm")
    encs = doc.get("encoders")
    if not isinstance(encs, list) or not encs:
        raise ValueError("encoders: expected a non-empty list")
    encoders = []
    for i, e in enumerate(encs):
        where = f"encoders[{i}]"
        if not isinstance(e, Mapping):
            raise ValueError(f"{where}: expected a mapping")
        model = _model(e, where, "encoder")
        frozen = e.get("frozen", False)
        if not isinstance(frozen, bool):
            raise ValueError(f"{where}.frozen: {frozen!r} is not true or false")
        encoders.append(Encoder(model=model, frozen=frozen,
                                tokens_per_sample=_positive_int(e, "tokens_per_sample", where, model.tokens)))
    tr = _section(doc, "training")
    _unknown(tr, ("global_batch", "micro_batch", "seq_len"), "training")
    training = Training(global_batch=_positive_int(tr, "global_batch", "training"),
                        micro_batch=_positive_int(tr, "micro_batch", "training"),
                        seq_len=_positive_int(tr, "seq_len", "training", llm.seq_len))
    pl = _section(doc, "llm_plan")
    _unknown(pl, ("dp", "pp", "tp", "vpp", "schedule"), "llm_plan")
    plan = LLMPlan(dp=_positive_int(pl, "dp", "llm_plan"), pp=_positive_int(pl, "pp", "llm_plan"),
                   tp=_positive_int(pl, "tp", "llm_plan"), vpp=_positive_int(pl, "vpp", "llm_plan", 1),
                   schedule=str(pl.get("schedule", "1f1b")))
    memory = doc.get("memory_gb", 80.0)
    if isinstance(memory, bool) or not isinstance(memory, (int, float)):
        raise ValueError(f"memory_gb: {memory!r} is not a number")
    return Config(cluster=cluster, llm=llm, encoders=encoders, training=training, llm_plan=plan,
                  memory_gb=float(memory), source=name)
