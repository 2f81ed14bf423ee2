"""The planner's input: an MLLM, its training batch, the LLM's parallel plan and the cluster, read
from YAML (or a dict) and checked, with errors that name the key.

```yaml
cluster: {gpus: 3072, gpu: h100, gpus_per_node: 8}
            # optional: calibration: FILE (a pybubble.calibration/1 file, relative to this config)
llm: {preset: gpt-175b}            # or explicit layers/hidden/heads/ffn_hidden/vocab/seq_len
encoders:                          # one or more
  - {preset: vit-22b, tokens_per_sample: 2048, frozen: false}   # 8 images of 256 tokens
training: {global_batch: 1536, micro_batch: 2, seq_len: 2048, recompute: full}
            # optional: prefetch: N (frozen encoders: N microbatches' forward in the previous step)
llm_plan: {dp: 48, pp: 8, tp: 8, vpp: 12, schedule: interleaved_1f1b}
baselines:                         # optional: a baseline's own LLM plan (default: llm_plan)
  megatron: {vpp: 1, schedule: 1f1b}
memory_gb: 80
```

The encoder load is one field, ``tokens_per_sample`` of each encoder (a whole number of images of
the model's ``tokens``), or, for a native-resolution encoder, images by size: ``image: [h, w]``
(pixels; ``[frames, h, w]`` for a video), ``images: N`` per sample (default 1) and ``processor``
(default ``qwen2_5_vl``, :data:`~pybubble.config.processors.PROCESSORS`), whose rules give the
image's patches, the model's ``tokens``. Everything that needs it (cost model, memory model, planner, dynamic
workloads, MFU) reads it through :attr:`Encoder.images_per_sample` and :meth:`Config.encoder_images`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import presets
from .checks import flag, integer, known_keys, mapping, one_of, positive, positive_int, required, shown
from .documents import naming, read_yaml
from .limits import MAX_BATCH, MAX_GPUS, MAX_LAYERS, MAX_MICROBATCHES, MAX_TOKENS
from .models import EncoderConfig, LLMConfig
from .processors import PROCESSORS, patches

GPUS = ("h100", "h200", "a100-80gb", "cpu")
"""GPU kinds a config may name (the cost model's hardware)."""
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv")
"""Pipeline schedules of the LLM (the action tables of :mod:`pybubble.llm.tables`)."""
RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation (Megatron-LM's ``--recompute-granularity``): ``none``; ``selective``:
each layer's core attention runs again inside its backward; ``full``: each layer's whole forward
runs again inside its backward, from its saved input."""
PLAN_BASELINES = ("megatron", "megatron_balanced")
"""The baselines whose LLM plan a config may set apart from ``llm_plan`` (``baselines:``)."""


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
    calibration: str = ""
    """A pybubble.calibration/1 file for the cost model (per-kind efficiencies and/or the cluster's
    compute and network factors), resolved against the config's folder; empty: none."""

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
    """Encoder tokens per training sample: the encoder load, a whole number of images (or frames)
    of ``model.tokens`` tokens each."""
    frozen: bool = False
    """A frozen encoder runs no backward."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, EncoderConfig):
            raise ValueError(f"model: {shown(self.model)} is not an EncoderConfig")
        positive_int(self.tokens_per_sample, "tokens_per_sample", MAX_TOKENS)
        flag(self.frozen, "frozen")
        if self.tokens_per_sample % self.model.tokens:
            raise ValueError(f"tokens_per_sample: {self.tokens_per_sample} is not a whole number of images of "
                             f"{self.model.tokens} tokens ({self.model.name})")

    @property
    def images_per_sample(self) -> int:
        """Images (or frames) per training sample: tokens per sample over the model's tokens per image."""
        return self.tokens_per_sample // self.model.tokens


@dataclass(kw_only=True, slots=True)
class Training:
    """The batch of one training step."""

    global_batch: int
    """Samples per step over all data-parallel ranks."""
    micro_batch: int
    """Samples per microbatch."""
    seq_len: int
    """LLM tokens per sample."""
    recompute: str = "none"
    """Activation recomputation of the LLM and the encoders, one of RECOMPUTE."""
    prefetch: int = 0
    """Frozen encoders only: the encoder forward of the first this-many LLM microbatches of the next
    step runs in this step (its cool-down), which is exact because a frozen encoder's parameters
    never change; the first step of a run needs them computed before it starts."""

    def __post_init__(self) -> None:
        positive_int(self.global_batch, "training.global_batch", MAX_BATCH)
        positive_int(self.micro_batch, "training.micro_batch", MAX_BATCH)
        positive_int(self.seq_len, "training.seq_len", MAX_TOKENS)
        one_of(self.recompute, RECOMPUTE, "training.recompute")
        integer(self.prefetch, "training.prefetch", minimum=0, maximum=MAX_MICROBATCHES)


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
    """The LLM's 3D-parallel plan (pybubble's, and every baseline's without one of its own)."""
    baseline_plans: dict[str, LLMPlan] = field(default_factory=dict)
    """A baseline's own LLM plan, by name (one of PLAN_BASELINES), where it differs from ``llm_plan``."""
    memory_gb: float = 80.0
    """Memory per GPU available to model states and activations (GB)."""
    source: str = field(default="")
    """Where the config was read from (for messages)."""

    def __post_init__(self) -> None:
        self._check_plan(self.llm_plan, "llm_plan")
        for name, plan in self.baseline_plans.items():
            one_of(name, PLAN_BASELINES, "baselines")
            self._check_plan(plan, f"baselines.{name}")
            if plan.dp != self.llm_plan.dp:
                raise ValueError(f"baselines.{name}.dp: {plan.dp} differs from llm_plan.dp ({self.llm_plan.dp}): "
                                 "the baselines train the same microbatches per pipeline")
        if not self.encoders:
            raise ValueError("encoders: at least one encoder is needed")
        positive(self.memory_gb, "memory_gb")
        if self.training.prefetch:
            training = next((e for e in self.encoders if not e.frozen), None)
            if training is not None:
                raise ValueError(f"training.prefetch: {self.training.prefetch} needs every encoder frozen, but "
                                 f"{training.model.name} trains (a forward for the next step would use parameters "
                                 "this step still changes)")
            if self.training.prefetch > self.microbatches:
                raise ValueError(f"training.prefetch: {self.training.prefetch} is more than the "
                                 f"{self.microbatches} microbatches per pipeline")
        if self.microbatches > MAX_MICROBATCHES:
            raise ValueError(f"training.global_batch: {self.training.global_batch:,} samples give {self.microbatches:,} "
                             f"microbatches per pipeline, more than the limit of {MAX_MICROBATCHES:,}")

    def _check_plan(self, p: LLMPlan, where: str) -> None:
        c, t = self.cluster, self.training
        if p.dp * p.pp * p.tp != c.gpus:
            raise ValueError(f"{where}: dp x pp x tp = {p.dp} x {p.pp} x {p.tp} = {p.dp * p.pp * p.tp}, "
                             f"not cluster.gpus ({c.gpus})")
        if p.tp > c.gpus_per_node:
            raise ValueError(f"{where}.tp: {p.tp} is more than cluster.gpus_per_node ({c.gpus_per_node})")
        if t.global_batch % (p.dp * t.micro_batch):
            raise ValueError(f"training.global_batch: {t.global_batch} is not a multiple of "
                             f"{where}.dp x training.micro_batch ({p.dp} x {t.micro_batch})")
        if p.pp * p.vpp > self.llm.layers:
            raise ValueError(f"{where}: pp x vpp = {p.pp * p.vpp} is more than the LLM's {self.llm.layers} layers")

    def baseline_plan(self, name: str) -> LLMPlan:
        """The LLM plan of baseline `name`: its own where the config gives one, else ``llm_plan``."""
        return self.baseline_plans.get(one_of(name, PLAN_BASELINES, "baseline"), self.llm_plan)

    def with_plan(self, plan: LLMPlan) -> "Config":
        """This config with `plan` as its LLM plan (checked as ``llm_plan``)."""
        return replace(self, llm_plan=plan)

    @property
    def microbatches(self) -> int:
        """LLM microbatches per step on each pipeline (global batch / (dp x micro batch))."""
        return self.training.global_batch // (self.llm_plan.dp * self.training.micro_batch)

    @property
    def encoder_images(self) -> list[int]:
        """Per encoder, the images in one encoder microbatch: the LLM micro batch times the
        encoder's images per sample."""
        return [self.training.micro_batch * e.images_per_sample for e in self.encoders]


_LLM_KEYS = ("preset", "name", "layers", "hidden", "heads", "head_dim", "kv_heads", "ffn_hidden",
             "activation", "vocab", "seq_len")
_ENCODER_KEYS = ("preset", "name", "layers", "hidden", "heads", "head_dim", "ffn_hidden", "activation",
                 "tokens", "tokens_per_sample", "frozen", "image", "images", "processor")
_BY_SIZE = ("image", "images", "processor")
"""An encoder's images by size (native resolution) instead of ``tokens`` and ``tokens_per_sample``."""


def _model(section: Mapping[str, Any], where: str, kind: str) -> Any:
    keys = _LLM_KEYS if kind == "llm" else _ENCODER_KEYS
    known_keys(section, keys, where)
    shape = {k: v for k, v in section.items() if k not in ("preset", "tokens_per_sample", "frozen", *_BY_SIZE)}
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


def _by_size(section: Mapping[str, Any], where: str, model: EncoderConfig) -> tuple[EncoderConfig, int]:
    """An encoder given its images by size: the model with its ``tokens``, the image's patches by
    the processor's rules, and the tokens per sample."""
    given = [k for k in ("tokens", "tokens_per_sample") if k in section]
    if given:
        raise ValueError(f"{where}.{given[0]}: beside image: give the images by size or by tokens, not both")
    name = section.get("processor", "qwen2_5_vl")
    if name not in PROCESSORS:
        raise ValueError(f"{where}.processor: {shown(name)} is not one of {', '.join(PROCESSORS)}")
    size = required(section, "image", where)
    if not isinstance(size, list) or len(size) not in (2, 3):
        raise ValueError(f"{where}.image: {shown(size)} is not [height, width] or [frames, height, width] (pixels)")
    *frames, height, width = size
    tokens = patches(PROCESSORS[name].grid(height, width, *frames, where=f"{where}.image"))
    images = positive_int(section.get("images", 1), f"{where}.images")
    try:
        return replace(model, tokens=tokens), images * tokens
    except ValueError as e:
        raise ValueError(f"{where}.image: {e}") from None


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
    known_keys(doc, ("cluster", "llm", "encoders", "training", "llm_plan", "baselines", "memory_gb"), "config")
    cl = _section(doc, "cluster")
    known_keys(cl, ("gpus", "gpu", "gpus_per_node", "calibration"), "cluster")
    calibration = ""
    if "calibration" in cl:
        if not isinstance(cl["calibration"], str) or not cl["calibration"]:
            raise ValueError(f"cluster.calibration: {shown(cl['calibration'])} is not a file name")
        base = Path(source).parent if source else Path.cwd()
        calibration = str(base / cl["calibration"])
    cluster = Cluster(gpus=_value(cl, "gpus", "cluster"), gpu=cl.get("gpu", "h100"),
                      gpus_per_node=_value(cl, "gpus_per_node", "cluster", 8), calibration=calibration)
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
        per_sample = None
        if any(k in e for k in _BY_SIZE):
            model, per_sample = _by_size(e, where, model)
        try:
            encoders.append(Encoder(model=model, frozen=e.get("frozen", False),
                                    tokens_per_sample=per_sample or _value(e, "tokens_per_sample", where, model.tokens)))
        except ValueError as err:
            raise ValueError(f"{where}.{err}") from None
    tr = _section(doc, "training")
    known_keys(tr, ("global_batch", "micro_batch", "seq_len", "recompute", "prefetch"), "training")
    training = Training(global_batch=_value(tr, "global_batch", "training"),
                        micro_batch=_value(tr, "micro_batch", "training"),
                        seq_len=_value(tr, "seq_len", "training", llm.seq_len),
                        recompute=tr.get("recompute", "none"), prefetch=tr.get("prefetch", 0))
    plan = _plan(_section(doc, "llm_plan"), "llm_plan")
    baselines = {}
    if "baselines" in doc:
        for key, section in mapping(doc["baselines"], "baselines").items():
            one_of(key, PLAN_BASELINES, "baselines")
            where = f"baselines.{key}"
            baselines[key] = _plan(mapping(section, where), where, default=plan)
    return Config(cluster=cluster, llm=llm, encoders=encoders, training=training, llm_plan=plan,
                  baseline_plans=baselines, memory_gb=positive(doc.get("memory_gb", 80.0), "memory_gb"),
                  source=source)


def _plan(section: Mapping[str, Any], where: str, default: LLMPlan | None = None) -> LLMPlan:
    """An LLM plan section; keys it leaves out come from `default` (a baseline's plan from llm_plan;
    its vpp goes back to 1 when the section names a schedule that is not interleaved)."""
    known_keys(section, ("dp", "pp", "tp", "vpp", "schedule"), where)
    if default is None:
        sizes = {k: _value(section, k, where) for k in ("dp", "pp", "tp")}
        sizes["vpp"] = _value(section, "vpp", where, 1)
        schedule = section.get("schedule", "1f1b")
    else:
        sizes = {k: section.get(k, getattr(default, k)) for k in ("dp", "pp", "tp", "vpp")}
        schedule = section.get("schedule", default.schedule)
        if "vpp" not in section and schedule not in ("interleaved_1f1b", "zbv"):
            sizes["vpp"] = 1
    try:
        return LLMPlan(schedule=schedule, **sizes)
    except ValueError as e:  # LLMPlan names its fields as llm_plan's
        raise ValueError(str(e).replace("llm_plan", where, 1)) from None
