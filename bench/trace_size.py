"""``pybubble measure`` on traces of any size: writes a synthetic torch.profiler trace of one pipeline
rank's step (GPU-shaped: CPU ops, CUDA launches, kernels with flow arrows, NCCL transfers, the
pipeline's op annotations) of about ``--gb`` GB, plain and gzipped, and measures ``pybubble measure``
on each in a subprocess: wall time per GB of trace (uncompressed JSON) and the process's peak
resident memory (``os.wait4``: the child's own ``ru_maxrss``, as ``resource.getrusage(RUSAGE_CHILDREN)``
reports for the children waited for).

The rank's ops are placed where pybubble's simulator puts them (1F1B), each cut into back-to-back
kernels, and a DP all-reduce follows the step: the measured idle per kind must equal the simulated
bubbles (warm-up, steady, cool-down) and the all-reduce (collective), and the gzipped trace must
give what the plain one gives. The files go to a scratch folder (``--dir``, default: a new
temporary folder) and are deleted afterwards.

    python bench/trace_size.py [--gb 2] [--runs 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pybubble

STAGES, MICROBATCHES, RANK = 4, 8, 1
FWD_US, BWD_US, ALLREDUCE_US = 20_000.0, 40_000.0, 5_000.0
BASE_US = 1_732_000_000_000.0  # torch.profiler's timestamps are absolute microseconds
PID, TID, STREAM, NCCL_STREAM = 4242, 4242, 7, 20

HEAD = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045870592,
                          "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 132}],
    "distributedInfo": {"backend": "nccl", "rank": RANK, "world_size": STAGES, "pg_count": 2, "nccl_version": "2.21.5"},
    "record_shapes": 1,
    "with_stack": 0,
    "cuda_runtime_version": 12040,
    "cuda_driver_version": 12040,
}
CPU_OP = ('{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": %d, "tid": %d, "ts": %.3f, "dur": %.3f, '
          '"args": {"External id": %d, "Record function id": 0, "Ev Idx": %d, "Input Dims": [[8192, 4096], '
          '[4096, 4096]], "Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Strides": [[4096, 1], [1, 4096]], '
          '"Concrete Inputs": ["", ""], "Sequence number": %d, "Fwd thread id": 0}}')
LAUNCH = ('{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": %d, "tid": %d, "ts": %.3f, '
          '"dur": 4.125, "args": {"External id": %d, "cbid": 211, "correlation": %d}}')
KERNEL = ('{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_'
          'warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", "pid": 0, "tid": %d, "ts": %.3f, "dur": %.3f, '
          '"args": {"External id": %d, "device": 0, "stream": %d, "correlation": %d, "registers per thread": 168, '
          '"shared memory": 213264, "blocks per SM": 0.5, "warps per SM": 4.0, "grid": [66, 1, 1], '
          '"block": [384, 1, 1], "est. achieved occupancy %%": 0}}')
FLOWS = ('{"ph": "s", "id": %d, "pid": %d, "tid": %d, "ts": %.3f, "cat": "ac2g", "name": "ac2g"}, '
         '{"ph": "f", "id": %d, "pid": 0, "tid": %d, "ts": %.3f, "cat": "ac2g", "name": "ac2g", "bp": "e"}')
SPAN = '{"ph": "X", "cat": "%s", "name": "%s", "pid": %s, "tid": %d, "ts": %.3f, "dur": %.3f, "args": {}}'
NCCL = ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)")
KERNEL_BYTES = 1295  # what one kernel's events take (op, launch, kernel, flow arrows)


def rank_ops():
    """The simulated step: rank RANK's ops, its bubbles by kind and the step time (us)."""
    timeline = pybubble.simulate_pipeline("1f1b", ranks=STAGES, microbatches=MICROBATCHES, fwd=FWD_US, bwd=BWD_US)
    ops = [o for o in timeline.ops if o.rank == RANK]
    return ops, timeline.bubble_time()[RANK], timeline.step_time


def write_trace(path: Path, gigabytes: float) -> dict[str, float]:
    """Writes the trace (gzipped when `path` ends in .gz) and returns the idle per kind it holds."""
    ops, bubbles, step = rank_ops()
    kernels_per_op = max(1, round(gigabytes * 1e9 / KERNEL_BYTES / len(ops)))
    opener = (lambda p: gzip.open(p, "wt", compresslevel=1)) if path.suffix == ".gz" else (lambda p: open(p, "w"))
    n = 0
    with opener(path) as f:
        f.write(json.dumps(HEAD, indent=1)[:-2] + ',\n "traceEvents": [\n')
        f.write(SPAN % ("user_annotation", "ProfilerStep#7", PID, TID, BASE_US, step + ALLREDUCE_US))
        for o in ops:
            name = f"PP:{o.stage}{o.kind}{o.microbatch}"
            t0, width = BASE_US + o.start, (o.end - o.start) / kernels_per_op
            f.write(",\n" + SPAN % ("user_annotation", name, PID, TID, t0 - 50.0, o.end - o.start))
            f.write(",\n" + SPAN % ("gpu_user_annotation", name, 0, STREAM, t0, o.end - o.start))
            if o.kind == "F" or o.microbatch < MICROBATCHES - 1:  # the transfer to or from the neighbour
                f.write(",\n" + SPAN % ("kernel", NCCL[0], 0, NCCL_STREAM, t0 - 300.0, 250.0))
            for k in range(kernels_per_op):  # one kernel at a time: this process stays small (see measure)
                n += 1
                ts = t0 + k * width
                cpu = ts - 40.0
                f.write(",\n" + CPU_OP % (PID, TID, cpu, 12.5, n, n, n) + ",\n" + LAUNCH % (PID, TID, cpu + 6.0, n, n)
                        + ",\n" + KERNEL % (STREAM, ts, width, n, STREAM, n) + ",\n"
                        + FLOWS % (n, PID, TID, cpu + 6.0, n, STREAM, ts))
        f.write(",\n" + SPAN % ("kernel", NCCL[1], 0, NCCL_STREAM, BASE_US + step, ALLREDUCE_US))
        f.write(',\n {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}\n ],\n'
                ' "traceName": "rank1.pt.trace.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1732000000000000000\n}\n')
    return {"warmup": bubbles["pp_warmup"], "steady": bubbles["pp_steady"], "cooldown": bubbles["pp_cooldown"],
            "collective": ALLREDUCE_US}


def measure(path: Path, json_out: Path) -> tuple[float, float]:
    """``pybubble measure PATH --json JSON_OUT`` in a subprocess: (seconds, peak RSS in MB). A child's
    ``ru_maxrss`` is at least this process's own peak when it started (Linux records the peak of
    the memory it leaves at exec), so this process keeps small: it writes traces a kernel at a time."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "pybubble", "measure", str(path), "--json", str(json_out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(p.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"trace_size: pybubble measure {path} failed: {p.stderr.read().decode()[-2000:]}")
    p.stderr.close()
    return seconds, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=2.0, help="size of the trace's JSON (GB, 1e9 bytes)")
    p.add_argument("--runs", type=int, default=3, help="measurements of each file")
    p.add_argument("--dir", help="scratch folder for the traces (default: a new temporary folder)")
    a = p.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="trace_size.", dir=a.dir))
    try:
        results = {}
        for name in ("rank1.json", "rank1.json.gz"):
            path = scratch / name
            t0 = time.perf_counter()
            expected = write_trace(path, a.gb)
            size = path.stat().st_size
            # per GB of JSON: the gzipped file holds the same JSON as the plain one, written first
            gb = size / 1e9 if name.endswith(".json") else results["rank1.json"]["gb"]
            print(f"{name}: {size / 1e9:.2f} GB on disk, written in {time.perf_counter() - t0:.0f} s", flush=True)
            runs = []
            for _ in range(a.runs):
                seconds, rss = measure(path, scratch / "m.json")
                runs.append((seconds, rss))
                print(f"  {seconds:7.1f} s  {seconds / gb:5.1f} s/GB  peak RSS {rss:6.0f} MB", flush=True)
            [rank] = json.loads((scratch / "m.json").read_text())["ranks"]
            for kind, want in expected.items():
                got = rank["idle_by_kind"][kind]
                assert abs(got - want) <= 1e-6 * max(1.0, want), (name, kind, got, want)
            results[name] = {"gb": gb, "runs": runs, "idle_by_kind": rank["idle_by_kind"]}
            path.unlink()
        assert results["rank1.json"]["idle_by_kind"] == results["rank1.json.gz"]["idle_by_kind"]
        print(f"trace: 1F1B rank {RANK} of {STAGES}, {MICROBATCHES} microbatches; measured idle by kind = the "
              f"simulated bubbles, plain = gzipped")
        for name, r in results.items():
            per_gb = sorted(s / r["gb"] for s, _ in r["runs"])
            rss = [m for _, m in r["runs"]]
            print(f"{name}: {r['gb']:.2f} GB of JSON, median {statistics.median(per_gb):.1f} s/GB "
                  f"(range {per_gb[0]:.1f}-{per_gb[-1]:.1f}, {len(per_gb)} runs), peak RSS {max(rss):.0f} MB "
                  f"(runs {', '.join(f'{m:.0f}' for m in rss)})")
            assert max(rss) < 500, f"{name}: peak RSS {max(rss):.0f} MB, not under 500 MB"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
