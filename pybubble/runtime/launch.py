"""Process launch for a pipeline on one machine: one process per rank, a process group each, and
the fault rule (a rank that fails ends every rank within the timeout)."""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn: Callable[..., Any], args: tuple, ranks: int, backend: str, timeout: float,
               port: int, result_path: str) -> None:
    import pickle

    import torch
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks,
                                timeout=datetime.timedelta(seconds=timeout))
        try:
            result = fn(rank, *args)
        finally:
            dist.destroy_process_group()
        if rank == 0:
            with open(result_path, "wb") as f:
                pickle.dump(result, f)
    except BaseException as e:
        print(f"rank {rank}: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if os.environ.get("PYBUBBLE_TRACEBACK"):
            traceback.print_exc()
        os._exit(1)


def launch(fn: Callable[..., Any], ranks: int, *args: Any, backend: str = "gloo", timeout: float = 60.0) -> Any:
    """Runs ``fn(rank, *args)`` in ``ranks`` processes (spawned: ``fn`` and ``args`` must be
    picklable), each with the default process group initialised (``backend``, one torch thread,
    on NCCL GPU ``rank % device_count``), and returns rank 0's return value.

    A rank that raises prints ``rank R: error: ...`` and exits 1; the others fail in their next
    collective or after ``timeout`` seconds (the process groups' timeout), and any rank still alive
    ``timeout`` seconds after the first failure is killed. Raises ``RuntimeError("training failed
    (rank R exit C, ...)")`` once every rank has ended, when one failed."""
    import torch.multiprocessing as mp

    if ranks < 1:
        raise ValueError(f"ranks: {ranks} is not >= 1")
    if not timeout > 0:
        raise ValueError(f"timeout: {timeout} is not > 0")
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "rank0.pickle")
        ctx = mp.start_processes(_rank_main, args=(fn, args, ranks, backend, timeout, _free_port(), result_path),
                                 nprocs=ranks, join=False, start_method="spawn")
        deadline = None
        while True:
            codes = [p.exitcode for p in ctx.processes]
            if all(c is not None for c in codes):
                break
            if deadline is None and any(c not in (None, 0) for c in codes):
                deadline = time.monotonic() + timeout
            if deadline is not None and time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.exitcode is None:
                        p.kill()
            time.sleep(0.05)
        for p in ctx.processes:
            p.join()
        codes = [p.exitcode for p in ctx.processes]
        if any(c != 0 for c in codes):
            bad = [f"rank {r} exit {c}" for r, c in enumerate(codes) if c != 0]
            raise RuntimeError(f"training failed ({', '.join(bad)})")
        import pickle

        with open(result_path, "rb") as f:
            return pickle.load(f)
