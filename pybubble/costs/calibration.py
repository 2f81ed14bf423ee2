"""Calibration: time a layer's real kernels with torch and fit the cost model's efficiencies.

For a few small layer shapes, each compute kernel of :func:`decompose_layer` (forward GEMMs,
input- and weight-gradient GEMMs, attention forward and backward, norms, activation, residuals) is
run with torch and timed (``time.perf_counter`` around synchronised runs; on CUDA, events). Per
kernel kind a line ``time = overhead + x / rate`` is fitted by least squares on the relative error
(x = FLOPs for GEMMs, attention and activations, bytes for norms and residual adds), giving the kind's overhead and efficiency (rate / peak) for
:class:`pybubble.costs.roofline.CostModel`. The largest shape is held out of the fit, so the error table
shows how the model extrapolates. torch is imported here only, and lazily.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..config.models import EncoderConfig
from .kernels import Kernel, decompose_layer
from .roofline import CALIBRATION_FORMAT, CostModel, Hardware, hardware

# (micro_batch, tokens, hidden, heads): small enough for two CPU cores in seconds; the last one is
# held out of the fit.
CPU_SHAPES = ((1, 64, 128, 2), (1, 128, 256, 4), (2, 128, 384, 6), (2, 256, 512, 8))
CUDA_SHAPES = ((2, 256, 1024, 8), (2, 256, 2048, 16), (4, 256, 3072, 24), (2, 256, 6144, 48))
FIT_X = {"gemm": "flops", "attention": "flops", "attention_bwd": "flops", "activation": "flops",
         "norm": "bytes", "elementwise": "bytes"}


def _runner(torch: Any, kernel: Kernel, model: EncoderConfig, b: int, s: int, device: str,
            dtype: Any) -> Callable[[], Any]:
    """A closure that runs `kernel` once with torch, on tensors of the layer's shapes."""
    h, f = model.hidden, model.ffn_hidden
    q = model.q_dim
    tokens = b * s
    gemms = {"qkv": (h, 3 * q), "proj": (q, h), "fc1": (h, f), "fc2": (f, h)}

    def rand(*shape: int, grad: bool = False) -> Any:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

    name = kernel.name
    base = name.split("_")[0]
    if base in gemms:
        k, n = gemms[base]
        if name.endswith("_dgrad"):      # dX = dY @ W^T
            a, w = rand(tokens, n), rand(n, k)
        elif name.endswith("_wgrad"):    # dW = X^T @ dY
            a, w = rand(k, tokens), rand(tokens, n)
        else:
            a, w = rand(tokens, k), rand(k, n)
        return lambda: torch.matmul(a, w)
    if name in ("attention", "attention_bwd"):
        shape = (b, model.heads, s, model.head_dim)
        qt, kt, vt = (rand(*shape, grad=name == "attention_bwd") for _ in range(3))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if name == "attention":
            return lambda: sdpa(qt, kt, vt)
        out = sdpa(qt, kt, vt)
        grad = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (qt, kt, vt), grad, retain_graph=True)
    x = rand(tokens, h)
    if name.startswith("ln"):
        weight, bias = rand(h), rand(h)
        if name.endswith("_bwd"):
            xg = rand(tokens, h, grad=True)
            y = torch.nn.functional.layer_norm(xg, (h,), weight, bias)
            gy = torch.randn_like(y)
            return lambda: torch.autograd.grad(y, xg, gy, retain_graph=True)
        return lambda: torch.nn.functional.layer_norm(x, (h,), weight, bias)
    if name.startswith("gelu"):
        u = rand(tokens, f)
        if name.endswith("_bwd"):
            gu = rand(tokens, f)
            return lambda: torch.ops.aten.gelu_backward(gu, u, approximate="tanh")
        return lambda: torch.nn.functional.gelu(u, approximate="tanh")
    if name.startswith("residual"):
        y = rand(tokens, h)
        return lambda: torch.add(x, y)
    raise ValueError(f"kernel: no torch runner for {name!r}")


def _time(torch: Any, run: Callable[[], Any], device: str, repeats: int) -> float:
    """Fastest of `repeats` timed calls (after two warm-up calls), in microseconds: on a shared
    machine the fastest run is the one least disturbed by other processes."""
    for _ in range(2):
        run()
    samples = []
    if device == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            samples.append((time.perf_counter() - t0) * 1e6)
    return min(samples)


def _fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``y = a + c·x`` minimising the squared relative error (weights 1/y²), with a >= 0 and
    c > 0 (refit through 0 when the intercept comes out negative)."""
    ws = [1.0 / (y * y) for y in ys]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    my = sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    c = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx if sxx > 0 else 0.0
    a = my - c * mx
    if a < 0 or c <= 0:
        a = 0.0
        c = sum(w * x * y for w, x, y in zip(ws, xs, ys)) / sum(w * x * x for w, x in zip(ws, xs))
    return a, max(c, 1e-30)


def _measure(torch: Any, shapes: Sequence[tuple[int, int, int, int]], held_out: int, device: str, dtype: Any,
             dtype_bytes: int, repeats: int, samples: list[dict[str, Any]],
             progress: Callable[[int, int], None] | None) -> None:
    """Appends one sample per compute kernel of a layer, forward and backward, for each shape;
    `progress(done, total)` after each shape and phase."""
    with torch.enable_grad():
        for index, (b, s, h, heads) in enumerate(shapes):
            model = EncoderConfig(name=f"calib-{h}", layers=1, hidden=h, heads=heads, tokens=s,
                                  dtype_bytes=dtype_bytes)
            for phase in ("fwd", "bwd"):
                for kernel in decompose_layer(model, b, s, phase=phase):
                    run = _runner(torch, kernel, model, b, s, device, dtype)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    samples.append({"shape": [b, s, h, heads], "fit": index < len(shapes) - held_out,
                                    "kernel": kernel.name, "phase": phase, "kind": kernel.kind,
                                    "flops": kernel.flops, "bytes": kernel.bytes,
                                    "measured_us": _time(torch, run, device, repeats)})
                if progress is not None:
                    progress(2 * index + (phase == "bwd") + 1, 2 * len(shapes))



def calibrate(device: str = "cpu", shapes: Sequence[tuple[int, int, int, int]] | None = None,
              repeats: int = 7, held_out: int = 1,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Times the kernels of a layer at `shapes` on `device` (``cpu`` or ``cuda``), fits the
    efficiencies on all but the last `held_out` shapes, and returns a ``pybubble.calibration/1``
    document with the fit and every sample (measured and predicted microseconds).
    `progress(done, total)` is called after each shape and phase."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: {device!r} is not cpu or cuda")
    try:
        import torch
    except ImportError:
        raise ValueError("calibrate needs torch (pip install torch==2.13.0)") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' but torch sees no CUDA device")
    shapes = tuple(shapes or (CPU_SHAPES if device == "cpu" else CUDA_SHAPES))
    if not 0 <= held_out < len(shapes):
        raise ValueError(f"held_out: {held_out} must leave at least one of {len(shapes)} shapes to fit")
    spec_name, dtype, dtype_bytes = _kind_of(torch, device)
    spec = hardware(spec_name)

    samples: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # one core: no thread barriers stalled by other processes
    try:
        _measure(torch, shapes, held_out, device, dtype, dtype_bytes, repeats, samples, progress)
    finally:
        torch.set_num_threads(threads)
    peak, bandwidth, kinds = _fit(samples, spec)
    doc: dict[str, Any] = {
        "format": CALIBRATION_FORMAT, "hardware": spec_name, "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__, "threads": 1 if device == "cpu" else None, "dtype": str(dtype).removeprefix("torch."),
        "peak_flops": peak, "memory_bandwidth": bandwidth, "kinds": kinds, "samples": samples,
    }
    costs = CostModel(spec_name, calibration=doc)
    for smp in samples:
        kernel = Kernel(name=smp["kernel"], phase=smp["phase"], resource="compute", kind=smp["kind"],
                        flops=smp["flops"], bytes=smp["bytes"], after=())
        smp["predicted_us"] = costs.kernel_time(kernel)
    return doc


def _kind_of(torch: Any, device: str) -> tuple[str, Any, int]:
    """The hardware spec's name, the dtype and its bytes that calibration times `device` with: an
    H200, A100 or (any other GPU) H100 in bfloat16, or the CPU in float32."""
    if device == "cuda":
        gpu = torch.cuda.get_device_name().lower()
        spec_name = "h200" if "h200" in gpu else "a100-80gb" if "a100" in gpu else "h100"
        return spec_name, torch.bfloat16, 2
    return "cpu", torch.float32, 4


def _fit(samples: list[dict[str, Any]], spec: Hardware) -> tuple[float, float, dict[str, dict[str, float]]]:
    """The fit of the samples marked ``fit``, per kind a line (rate = 1/c is FLOP/us or byte/us):
    the peak FLOP rate and memory bandwidth (`spec`'s, risen to any measured rate above them) and
    per kind its efficiencies and overhead. The fitted roof gets the fitted rate; the other roof is
    set to peak (efficiency 1) so that it does not bind where the fit says otherwise."""
    rates: dict[str, tuple[float, float]] = {}
    for kind, axis in FIT_X.items():
        pts = [(smp[axis], smp["measured_us"]) for smp in samples if smp["kind"] == kind and smp["fit"]]
        if len(pts) >= 2:
            a, c = _fit_line([p[0] for p in pts], [p[1] for p in pts])
            rates[kind] = (a, 1e6 / c)
    peak = max([spec.peak_flops] + [r for k, (_, r) in rates.items() if k in ("gemm", "attention")])
    bandwidth = max([spec.memory_bandwidth] + [r for k, (_, r) in rates.items() if FIT_X[k] == "bytes"])
    kinds = {}
    for kind, (overhead, rate) in rates.items():
        if FIT_X[kind] == "flops":
            kinds[kind] = {"compute_efficiency": min(1.0, rate / peak), "memory_efficiency": 1.0,
                           "overhead_us": overhead}
        else:
            kinds[kind] = {"compute_efficiency": 1.0, "memory_efficiency": min(1.0, rate / bandwidth),
                           "overhead_us": overhead}
    return peak, bandwidth, kinds


def error_table(doc: dict[str, Any]) -> str:
    """A Markdown table of predicted versus measured time per kernel, and a summary per kind."""
    lines = [f"# Calibration errors: {doc['hardware']} ({doc.get('device_name', '')}, torch {doc['torch']}, "
             f"{doc['dtype']})", "",
             "Shapes are (micro batch, tokens, hidden, heads); `fit` rows were used to fit the efficiencies, "
             "`held out` rows were not. Error = (predicted - measured) / measured.", "",
             "| shape | kernel | phase | kind | set | measured us | predicted us | error |",
             "|---|---|---|---|---|---:|---:|---:|"]
    for s in doc["samples"]:
        err = (s["predicted_us"] - s["measured_us"]) / s["measured_us"]
        lines.append(f"| {tuple(s['shape'])} | {s['kernel']} | {s['phase']} | {s['kind']} | "
                     f"{'fit' if s['fit'] else 'held out'} | {s['measured_us']:.1f} | {s['predicted_us']:.1f} | "
                     f"{100 * err:+.0f}% |")
    lines += ["", "Mean absolute error per kind:", "", "| kind | fit shapes | held-out shape |", "|---|---:|---:|"]
    for kind in FIT_X:
        row = [kind]
        for fit in (True, False):
            errs = [abs(s["predicted_us"] - s["measured_us"]) / s["measured_us"]
                    for s in doc["samples"] if s["kind"] == kind and s["fit"] == fit]
            row.append(f"{100 * sum(errs) / len(errs):.0f}%" if errs else "-")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Whole layer (sum of its compute kernels), held-out shape:", "",
              "| phase | measured us | predicted us | error |", "|---|---:|---:|---:|"]
    for phase in ("fwd", "bwd"):
        held = [s for s in doc["samples"] if not s["fit"] and s["phase"] == phase]
        if held:
            meas = sum(s["measured_us"] for s in held)
            pred = sum(s["predicted_us"] for s in held)
            lines.append(f"| {phase} | {meas:.0f} | {pred:.0f} | {100 * (pred - meas) / meas:+.0f}% |")
    return "\n".join(lines) + "\n"
