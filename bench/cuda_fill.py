"""The CUDA side of the bubble filler on one GPU: an LLM-like stream whose compute idles during
emulated communication, filled with encoder kernels from a low-priority side stream.

The LLM stream runs ``--layers`` matmuls per layer step, then waits (an event) for an emulated
collective on a communication stream (``torch.cuda._sleep``, reached through
``pybubble.runtime.torch_seams.cuda_sleep``: a one-block spin kernel, like a collective that
holds few SMs). The filler launches encoder matmuls on a low-priority side
stream, ordered after the window opens with an event, and only as many as fit in the window by
their measured duration (stream priorities do not preempt running kernels). Printed: the LLM
stream's slowdown (target under 2%) and the share of the encoder's work hidden in the windows.

    python bench/cuda_fill.py [--steps 50] [--window-us 300]
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50, help="LLM layer steps (compute, then a comm window)")
    p.add_argument("--window-us", type=float, default=300.0, help="emulated communication per step (us)")
    p.add_argument("--llm-dim", type=int, default=8192)
    p.add_argument("--enc-dim", type=int, default=2048)
    p.add_argument("--encoder-kernels", type=int, default=400, help="encoder matmuls to place")
    a = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("cuda_fill: torch is not installed; nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("cuda_fill: no CUDA device; this benchmark needs one GPU (nothing measured)")
        return 0
    import os
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        print("cuda_fill: CUDA_DEVICE_MAX_CONNECTIONS=1 serialises all streams in launch order: side-stream "
              "kernels can then only run where they were launched, so the filler must launch them exactly "
              "at window starts (expect a smaller hidden share)")

    from pybubble.runtime.torch_seams import cuda_sleep

    dev = torch.device("cuda")
    # Lower numbers are higher priorities; 0 is the lowest (the default).
    llm = torch.cuda.Stream(priority=-1)
    comm = torch.cuda.Stream(priority=-1)  # emulated collectives
    side = torch.cuda.Stream(priority=0)  # the encoder's kernels
    x = torch.randn(a.llm_dim // 2, a.llm_dim, device=dev, dtype=torch.bfloat16)
    w = torch.randn(a.llm_dim, a.llm_dim, device=dev, dtype=torch.bfloat16)
    e = torch.randn(a.enc_dim, a.enc_dim, device=dev, dtype=torch.bfloat16)

    def elapsed(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3  # us

    # Spin cycles per microsecond, for the emulated collective.
    cycles_per_us = 1e5 / max(elapsed(lambda: cuda_sleep(100_000)), 1e-3)
    enc_us = min(elapsed(lambda: torch.mm(e, e)) for _ in range(5))
    fit = max(int(a.window_us * 0.9 // enc_us), 0)

    def llm_step(fill: bool, budget: list[int]) -> None:
        with torch.cuda.stream(llm):
            for _ in range(a.steps):
                torch.mm(x, w)
                opened = torch.cuda.Event()
                opened.record(llm)
                with torch.cuda.stream(comm):
                    comm.wait_event(opened)
                    cuda_sleep(a.window_us * cycles_per_us)
                    done = torch.cuda.Event()
                    done.record(comm)
                if fill and budget[0] > 0:
                    with torch.cuda.stream(side):
                        side.wait_event(opened)  # the window has opened
                        for _ in range(min(fit, budget[0])):
                            torch.mm(e, e)
                        budget[0] -= min(fit, budget[0])
                llm.wait_event(done)  # the LLM never waits for the side stream

    for _ in range(2):  # warm-up
        llm_step(False, [0])
    alone = min(elapsed(lambda: llm_step(False, [0])) for _ in range(3))
    encoder_alone = elapsed(lambda: [torch.mm(e, e) for _ in range(a.encoder_kernels)])

    def filled_then_rest() -> tuple[float, int]:
        budget = [a.encoder_kernels]
        t = elapsed(lambda: llm_step(True, budget))
        return t, a.encoder_kernels - budget[0]

    with_fill, placed = min(filled_then_rest() for _ in range(3))
    slowdown = with_fill / alone - 1.0
    hidden = placed / a.encoder_kernels
    print(f"GPU: {torch.cuda.get_device_name()}")
    print(f"LLM step alone {alone / 1e3:.2f} ms, with filling {with_fill / 1e3:.2f} ms: slowdown {slowdown:+.2%} "
          f"(target < 2%)")
    print(f"encoder: {a.encoder_kernels} kernels of {enc_us:.0f} us ({encoder_alone / 1e3:.2f} ms alone); "
          f"{placed} ran inside the LLM's windows: {hidden:.1%} of the encoder's work hidden")
    return 0


if __name__ == "__main__":
    sys.exit(main())
