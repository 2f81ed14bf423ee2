"""Roofline cost model: kernel durations, LLM layer times and collective times on a given GPU.

A kernel of kind K takes ``overhead_us + max(flops / (peak · compute_efficiency),
bytes / (bandwidth · memory_efficiency))``. The fixed overhead (launch, tail effects) makes small
kernels slower than peak: the achieved efficiency is ``compute_efficiency · F / (F + F_half)`` with
``F_half = overhead · peak · compute_efficiency`` (see :meth:`CostModel.efficiency`). The default
efficiencies below are literature values; ``pybubble calibrate`` measures them on the hardware at
hand and :meth:`CostModel.load_calibration` replaces them.

A cluster at scale runs slower than one GPU's kernels in isolation (clock and power limits, stragglers
waiting on each other, NCCL reaching less than the links' nominal bandwidth). A calibration file may
carry two global factors for that, fitted to a measured step (see docs/formats.md): ``compute_factor``,
the achieved fraction of the roofline for every compute kernel (its time, less the fixed overhead, is
divided by it), and ``comm_factor``, the achieved fraction of the nominal link bandwidth for every
collective and point-to-point send.

A calibration fitted to a measured step (``pybubble calibrate --trace``) carries ``op_factors``: per
op kind of :data:`OP_KINDS`, the ratio of the measured time to the predicted one, which multiplies
that kind's predicted time (an LLM layer's compute kernels by phase, the encoders' likewise, pipeline
sends, each collective kind). ``llm_wgrad`` is the weight-gradient half W of a backward where the
schedule splits one off (I takes the other half, ``llm_bwd``); without it W goes as ``llm_bwd``.

Collectives use the ring model: ``alpha·(n-1) + (n-1)/n · bytes / bw`` for an all-gather or a
reduce-scatter, twice that for an all-reduce; ``bw`` is NVLink inside a node, the network across.
All times are microseconds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..config.checks import mapping, number, positive, required, shown
from ..config.documents import naming, read_document
from ..config.models import EncoderConfig, TransformerShape
from .kernels import KERNEL_KINDS, Kernel, decompose_layer

CALIBRATION_FORMAT = "pybubble.calibration/1"
"""The format key of a calibration file (per-kind efficiencies, cluster factors, or both)."""
FACTORS = ("compute_factor", "comm_factor")
"""The cluster factors a calibration file may set, each in (0, 1]."""
OP_KINDS = ("llm_fwd", "llm_bwd", "llm_wgrad", "p2p", "all_gather", "reduce_scatter", "all_reduce",
            "encoder_fwd", "encoder_bwd")
"""The op kinds of a step a calibration's ``op_factors`` may scale (measured / predicted time)."""


@dataclass(kw_only=True, slots=True)
class Efficiency:
    """How close one kernel kind gets to the roofline."""

    compute_efficiency: float
    """Fraction of peak FLOP/s reached by large kernels of this kind."""
    memory_efficiency: float
    """Fraction of peak memory bandwidth reached by large kernels of this kind."""
    overhead_us: float
    """Fixed time per kernel (launch and tail), microseconds."""

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name}: {value!r} is not in (0, 1]")
        if not 0.0 <= self.overhead_us < math.inf:
            raise ValueError(f"overhead_us: {self.overhead_us!r} is not a finite number >= 0")


@dataclass(kw_only=True, slots=True)
class Hardware:
    """One accelerator (or the local CPU) and its links."""

    name: str
    """Short name: ``h100``, ``h200``, ``a100-80gb``, ``cpu``."""
    peak_flops: float
    """Peak dense FLOP/s in the training dtype (bf16 on GPUs, fp32 on the CPU)."""
    memory_bandwidth: float
    """Peak memory bandwidth, bytes/s."""
    nvlink_bandwidth: float
    """Per-GPU, per-direction bandwidth inside a node, bytes/s."""
    nvlink_latency_us: float
    """Per-step latency (alpha) of a collective inside a node, microseconds."""
    network_bandwidth: float
    """Per-GPU, per-direction bandwidth across nodes, bytes/s."""
    network_latency_us: float
    """Per-step latency (alpha) of a collective across nodes, microseconds."""
    gpus_per_node: int
    """Ranks that share the fast intra-node link."""
    efficiency: dict[str, Efficiency] = field(default_factory=dict)
    """Default efficiency per kernel kind (see ``pybubble.costs.kernels.KERNEL_KINDS``)."""


def _gpu_efficiency(gemm: float, attention: float, attention_bwd: float) -> dict[str, Efficiency]:
    # Memory efficiency 0.8 of HBM peak: what large element-wise kernels reach in practice
    # (e.g. STREAM-like copies on H100 reach ~2.6-2.9 of 3.35 TB/s). Overhead ~4 us per kernel:
    # CUDA launch plus tail, order of the launch latency NVIDIA documents (a few microseconds).
    return {
        "gemm": Efficiency(compute_efficiency=gemm, memory_efficiency=0.8, overhead_us=4.0),
        "attention": Efficiency(compute_efficiency=attention, memory_efficiency=0.8, overhead_us=4.0),
        "attention_bwd": Efficiency(compute_efficiency=attention_bwd, memory_efficiency=0.8, overhead_us=4.0),
        "activation": Efficiency(compute_efficiency=0.5, memory_efficiency=0.8, overhead_us=3.0),
        "norm": Efficiency(compute_efficiency=0.5, memory_efficiency=0.7, overhead_us=3.0),
        "elementwise": Efficiency(compute_efficiency=0.5, memory_efficiency=0.8, overhead_us=3.0),
        "collective": Efficiency(compute_efficiency=1.0, memory_efficiency=1.0, overhead_us=0.0),
    }


HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16 (1,979 with sparsity), 3.35 TB/s HBM3,
    # NVLink 4 900 GB/s total (450 GB/s per direction); DGX H100: one 400 Gb/s ConnectX-7 per
    # GPU (50 GB/s), 8 GPUs per node. Latencies: order of nccl-tests small-message times
    # (~10-20 us for an 8-GPU all-reduce -> ~2 us per ring step in a node, ~6 us across).
    # Efficiencies: large BF16 GEMMs reach ~700-750 TFLOP/s with cuBLAS (0.75); FlashAttention-2
    # fwd ~350-400 TFLOP/s at head dim 128 (Dao 2023; FA-3 paper, Fig. 1), backward lower and
    # with the QK^T recomputation on top (0.3 of peak for the model FLOPs).
    "h100": Hardware(name="h100", peak_flops=989.4e12, memory_bandwidth=3.35e12,
                     nvlink_bandwidth=450e9, nvlink_latency_us=2.0, network_bandwidth=50e9,
                     network_latency_us=6.0, gpus_per_node=8,
                     efficiency=_gpu_efficiency(0.75, 0.40, 0.30)),
    # NVIDIA H200 SXM datasheet: same compute as H100 (989 TFLOP/s dense BF16), 4.8 TB/s HBM3e,
    # NVLink 900 GB/s total; DGX H200: 400 Gb/s ConnectX-7 per GPU.
    "h200": Hardware(name="h200", peak_flops=989.4e12, memory_bandwidth=4.8e12,
                     nvlink_bandwidth=450e9, nvlink_latency_us=2.0, network_bandwidth=50e9,
                     network_latency_us=6.0, gpus_per_node=8,
                     efficiency=_gpu_efficiency(0.75, 0.40, 0.30)),
    # NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s dense BF16, 2,039 GB/s HBM2e, NVLink 3 600 GB/s
    # total (300 per direction); DGX A100: one 200 Gb/s HDR InfiniBand per GPU (25 GB/s).
    # FlashAttention-2 reaches ~70% of peak forward on A100 (Dao 2023), GEMMs ~80%.
    "a100-80gb": Hardware(name="a100-80gb", peak_flops=312e12, memory_bandwidth=2.039e12,
                          nvlink_bandwidth=300e9, nvlink_latency_us=2.5, network_bandwidth=25e9,
                          network_latency_us=7.0, gpus_per_node=8,
                          efficiency=_gpu_efficiency(0.80, 0.60, 0.45)),
    # The local CPU (this machine: 2 cores of an AMD EPYC Zen 4): fp32 peak = 2 cores x 2.6 GHz x
    # 32 FLOP/cycle (two 256-bit FMA pipes: 2 x 8 lanes x 2) = 166 GFLOP/s; memory bandwidth
    # 20 GB/s is a nominal share of a DDR5 socket for a 2-core VM. "Links" are gloo over loopback
    # (nominal 5 GB/s, 20 us). These are placeholders: run `pybubble calibrate` and load its file.
    "cpu": Hardware(name="cpu", peak_flops=166e9, memory_bandwidth=20e9, nvlink_bandwidth=5e9,
                    nvlink_latency_us=20.0, network_bandwidth=5e9, network_latency_us=20.0,
                    gpus_per_node=2,
                    efficiency={
                        "gemm": Efficiency(compute_efficiency=0.6, memory_efficiency=0.5, overhead_us=10.0),
                        "attention": Efficiency(compute_efficiency=0.3, memory_efficiency=0.5, overhead_us=20.0),
                        "attention_bwd": Efficiency(compute_efficiency=0.2, memory_efficiency=0.5, overhead_us=20.0),
                        "activation": Efficiency(compute_efficiency=0.05, memory_efficiency=0.5, overhead_us=5.0),
                        "norm": Efficiency(compute_efficiency=0.2, memory_efficiency=0.3, overhead_us=5.0),
                        "elementwise": Efficiency(compute_efficiency=0.2, memory_efficiency=0.5, overhead_us=5.0),
                        "collective": Efficiency(compute_efficiency=1.0, memory_efficiency=1.0, overhead_us=0.0),
                    }),
}


def hardware(name: str) -> Hardware:
    """The hardware spec `name` (a copy: changing it leaves the table alone)."""
    try:
        spec = HARDWARE[name.lower()]
    except KeyError:
        raise ValueError(f"hardware: unknown {name!r}; known: {', '.join(HARDWARE)}") from None
    return replace(spec, efficiency=dict(spec.efficiency))


class CostModel:
    """Kernel durations on one hardware spec, optionally with calibrated efficiencies."""

    def __init__(self, spec: Hardware | str, calibration: str | os.PathLike[str] | Mapping[str, Any] | None = None):
        self.hardware = hardware(spec) if isinstance(spec, str) else replace(spec, efficiency=dict(spec.efficiency))
        missing = [k for k in KERNEL_KINDS if k not in self.hardware.efficiency]
        if missing:
            raise ValueError(f"efficiency: no entry for kind(s) {', '.join(missing)}")
        self.compute_factor = 1.0
        """Achieved fraction of the roofline for compute kernels (a calibration's ``compute_factor``)."""
        self.comm_factor = 1.0
        """Achieved fraction of the links' bandwidth for collectives and sends (``comm_factor``)."""
        self.op_factors: dict[str, float] = {}
        """Measured over predicted time per op kind of :data:`OP_KINDS` (a calibration's
        ``op_factors``; a kind not in it: 1)."""
        if calibration is not None:
            self.load_calibration(calibration)

    def load_calibration(self, source: str | os.PathLike[str] | Mapping[str, Any]) -> None:
        """Applies a ``pybubble.calibration/1`` file (a path or a parsed document): the efficiencies of
        the kinds it fitted, the peak FLOP/s and memory bandwidth where it measured higher ones, and
        its cluster factors (:data:`FACTORS`). ValueError naming the file and the field when the file
        is missing, not JSON, of another format, malformed, or calibrates nothing."""
        doc = read_document(source, CALIBRATION_FORMAT)
        with naming(source if not isinstance(source, Mapping) else "calibration"):
            self._load_calibration(doc)

    def _load_calibration(self, doc: Mapping[str, Any]) -> None:
        """Checks the whole document first, then applies it: a bad field changes nothing."""
        if "kinds" not in doc and "op_factors" not in doc and not any(name in doc for name in FACTORS):
            raise ValueError(f"calibrates nothing: no kinds, no op_factors and none of {', '.join(FACTORS)}")
        if "hardware" in doc and doc["hardware"] != self.hardware.name:
            raise ValueError(f"hardware: {shown(doc['hardware'])} is not this cost model's {self.hardware.name!r}")
        factors = {}
        for name in FACTORS:
            if name in doc:
                value = number(doc[name], name)
                if not 0.0 < value <= 1.0:
                    raise ValueError(f"{name}: {value!r} is not in (0, 1]")
                factors[name] = value
        peaks = {name: positive(doc[name], name) for name in ("peak_flops", "memory_bandwidth") if name in doc}
        efficiency = {}
        for kind, fit in mapping(doc.get("kinds", {}), "kinds").items():
            if kind not in KERNEL_KINDS:
                raise ValueError(f"kinds: unknown kind {shown(kind)}; known: {', '.join(KERNEL_KINDS)}")
            where = f"kinds.{kind}"
            fit = mapping(fit, where)
            values = {name: number(required(fit, name, where), f"{where}.{name}")
                      for name in ("compute_efficiency", "memory_efficiency", "overhead_us")}
            try:
                efficiency[kind] = Efficiency(**values)
            except ValueError as e:
                raise ValueError(f"{where}.{e}") from None
        op_factors = {}
        for kind, value in mapping(doc.get("op_factors", {}), "op_factors").items():
            if kind not in OP_KINDS:
                raise ValueError(f"op_factors: unknown op kind {shown(kind)}; known: {', '.join(OP_KINDS)}")
            op_factors[kind] = positive(value, f"op_factors.{kind}")
        self.op_factors.update(op_factors)
        for name, value in factors.items():
            setattr(self, name, value)
        for name, value in peaks.items():
            setattr(self.hardware, name, value)
        self.hardware.efficiency.update(efficiency)

    # --- kernels ---------------------------------------------------------------------------

    def op_factor(self, kind: str) -> float:
        """The calibration's time factor of op kind `kind` (:data:`OP_KINDS`; 1 when not fitted;
        ``llm_wgrad`` defaults to ``llm_bwd``)."""
        if kind == "llm_wgrad" and kind not in self.op_factors:
            kind = "llm_bwd"
        return self.op_factors.get(kind, 1.0)

    def backward_factor(self) -> float:
        """The factor of a whole LLM backward: the mean of its input-gradient half (``llm_bwd``) and
        its weight-gradient half (``llm_wgrad``), as the simulator splits a backward in two."""
        return (self.op_factor("llm_bwd") + self.op_factor("llm_wgrad")) / 2

    def efficiency(self, kind: str, flops: float) -> float:
        """Achieved fraction of peak FLOP/s for a compute-bound kernel of `kind` and size `flops`."""
        e = self.hardware.efficiency[kind]
        peak = e.compute_efficiency * self.compute_factor
        best = self.hardware.peak_flops * peak
        return peak * flops / (flops + e.overhead_us * 1e-6 * best) if flops > 0 else 0.0

    def bound(self, kernel: Kernel) -> str:
        """``compute``, ``memory``, ``nvlink`` or ``network``: which roof limits `kernel` (a
        collective inside a node runs on NVLink, one across nodes on the network)."""
        if kernel.resource == "comm":
            return "nvlink" if kernel.group <= self.hardware.gpus_per_node else "network"
        e = self.hardware.efficiency[kernel.kind]
        compute = kernel.flops / (self.hardware.peak_flops * e.compute_efficiency)
        memory = kernel.bytes / (self.hardware.memory_bandwidth * e.memory_efficiency)
        return "compute" if compute >= memory else "memory"

    def kernel_time(self, kernel: Kernel) -> float:
        """Predicted duration of `kernel` in microseconds."""
        if kernel.resource == "comm":
            return self.collective_time(kernel.collective, kernel.bytes, kernel.group)
        e = self.hardware.efficiency[kernel.kind]
        compute = kernel.flops / (self.hardware.peak_flops * e.compute_efficiency)
        memory = kernel.bytes / (self.hardware.memory_bandwidth * e.memory_efficiency)
        return e.overhead_us + 1e6 * max(compute, memory) / self.compute_factor

    def collective_time(self, op: str, nbytes: float, group: int) -> float:
        """Ring `op` (``all_reduce``, ``all_gather``, ``reduce_scatter``) of a `nbytes` tensor over
        `group` ranks: ``alpha·(n-1) + (n-1)/n · bytes / bw`` per phase; an all-reduce has two. ``bw``
        is the link's bandwidth times :attr:`comm_factor`."""
        if group <= 1:
            return 0.0
        hw = self.hardware
        inside = group <= hw.gpus_per_node
        bw = (hw.nvlink_bandwidth if inside else hw.network_bandwidth) * self.comm_factor
        alpha = hw.nvlink_latency_us if inside else hw.network_latency_us
        one = alpha * (group - 1) + 1e6 * (group - 1) / group * nbytes / bw
        if op == "all_reduce":
            return 2.0 * one * self.op_factor(op)
        if op in ("all_gather", "reduce_scatter"):
            return one * self.op_factor(op)
        raise ValueError(f"collective: {op!r} is not all_reduce, all_gather or reduce_scatter")

    def p2p_time(self, nbytes: float, across_nodes: bool = True) -> float:
        """A pipeline send of `nbytes` between neighbouring stages (one ring step; bandwidth times
        :attr:`comm_factor`)."""
        hw = self.hardware
        if across_nodes:
            t = hw.network_latency_us + 1e6 * nbytes / (hw.network_bandwidth * self.comm_factor)
        else:
            t = hw.nvlink_latency_us + 1e6 * nbytes / (hw.nvlink_bandwidth * self.comm_factor)
        return t * self.op_factor("p2p")

    # --- layers ----------------------------------------------------------------------------

    def layer_kernels(self, model: TransformerShape, micro_batch: int, seq_len: int, tp: int = 1,
                      sequence_parallel: bool = False, phase: str = "fwd",
                      recompute: str = "none") -> list[tuple[Kernel, float]]:
        """The kernels of one layer with their predicted durations (arguments as
        :func:`~pybubble.costs.kernels.decompose_layer`); compute kernels scaled by the op factor of
        the model's role and the phase (``encoder_fwd``, ``llm_bwd``... an LLM backward by
        :meth:`backward_factor`)."""
        kernels = decompose_layer(model, micro_batch, seq_len, tp=tp, sequence_parallel=sequence_parallel,
                                  phase=phase, recompute=recompute)
        if isinstance(model, EncoderConfig):
            factor = self.op_factor(f"encoder_{phase}")
        else:
            factor = self.op_factor("llm_fwd") if phase == "fwd" else self.backward_factor()
        return [(k, self.kernel_time(k) * (factor if k.resource == "compute" else 1.0)) for k in kernels]

    def layer_time(self, model: TransformerShape, micro_batch: int, seq_len: int, tp: int = 1,
                   sequence_parallel: bool = False, phase: str = "fwd", recompute: str = "none") -> float:
        """One layer's time on one rank, as Megatron-LM runs it (:func:`stream_schedule`): a
        collective that the next compute kernel needs is exposed, one that only the kernels after
        an independent one need (the backward's input-gradient all-reduce beside the weight-gradient
        GEMM) runs under it. A backward includes its recomputed forward work."""
        return stream_schedule(self.layer_kernels(model, micro_batch, seq_len, tp, sequence_parallel, phase,
                                                  recompute))[0]

    def compute_time(self, model: TransformerShape, micro_batch: int, seq_len: int, tp: int = 1,
                     sequence_parallel: bool = False, phase: str = "fwd", recompute: str = "none") -> float:
        """One layer's compute-kernel time (the layer time less its TP collectives)."""
        return sum(t for k, t in self.layer_kernels(model, micro_batch, seq_len, tp, sequence_parallel, phase,
                                                    recompute)
                   if k.resource == "compute")

    def tp_collective_times(self, model: TransformerShape, micro_batch: int, seq_len: int, tp: int,
                            sequence_parallel: bool = False, phase: str = "fwd",
                            recompute: str = "none") -> list[float]:
        """The exposed part of each TP collective of one layer, in order, where it is not zero: the
        compute stream's TP bubbles (:func:`stream_schedule`)."""
        return stream_schedule(self.layer_kernels(model, micro_batch, seq_len, tp, sequence_parallel, phase,
                                                  recompute))[1]


def stream_schedule(timed: list[tuple[Kernel, float]]) -> tuple[float, list[float]]:
    """One layer's kernels (with their durations) on one GPU as Megatron-LM issues them: in list
    order, compute kernels one after another on the compute stream and collectives one after another
    on the communication stream, each starting when its stream is free and its ``after`` kernels have
    ended. Returns the layer's time (the last end) and the compute stream's idle gaps, in order: the
    TP bubbles. In a forward every collective leaves a gap of its length; in a backward the
    input-gradient all-reduce runs beside the weight-gradient GEMM (Megatron's asynchronous
    tensor-parallel all-reduce), so only what outlasts that GEMM is a gap."""
    end = [0.0] * len(timed)
    free = {"compute": 0.0, "comm": 0.0}
    gaps: list[float] = []
    for i, (k, t) in enumerate(timed):
        start = max([free[k.resource]] + [end[j] for j in k.after])
        if k.resource == "compute" and start > free["compute"]:
            gaps.append(start - free["compute"])
        end[i] = start + t
        free[k.resource] = end[i]
    last = max(end, default=0.0)
    if last > free["compute"]:
        gaps.append(last - free["compute"])
    return last, gaps
