"""Process launch for a pipeline on one machine: one process per rank, a process group each, and
the fault rule (a rank that fails ends every rank within the timeout).

Trainers launch with torchrun (``python -m torch.distributed.run``), which sets the env://
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and ends
every worker when one fails. :func:`launch` is the single-machine convenience: it sets the same
variables in each process it spawns, so a rank starts the same way under both
(:func:`init_distributed`)."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str = "gloo", timeout: float = 60.0) -> int:
    """Sets up the default process group from the env:// variables torchrun sets, unless the
    trainer already did (then its group stays), and returns this process's rank. One torch thread
    per process; NCCL: GPU ``LOCAL_RANK % device_count``. ``timeout``: the process groups' timeout
    (seconds), the time a rank waits for a failed peer in a collective."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank()
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise ValueError(f"environment: {', '.join(missing)} not set (start the ranks with torchrun or launch)")
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])) % torch.cuda.device_count())
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout))
    return dist.get_rank()


class Terminated(BaseException):
    """The rank was asked to end (SIGTERM): torchrun ends every worker this way once one failed.
    A ``BaseException``, like ``KeyboardInterrupt``, so that a trainer's ``except Exception`` does
    not take it for its own error."""


def _terminated(signum: int, _frame: Any) -> None:
    raise Terminated(f"signal {signal.Signals(signum).name}: the launcher ended this rank "
                     "(another rank failed, or the job was stopped)")


def run_rank(fn: Callable[..., Any], *args: Any, backend: str = "gloo", timeout: float = 60.0) -> Any:
    """One rank under torchrun or :func:`launch`: :func:`init_distributed`, then ``fn(rank,
    *args)``, then the process group is destroyed; returns what ``fn`` returned. The fault rule: a
    rank that raises prints ``rank R: error: ...`` on stderr and exits 1 at once (the launcher
    then ends the other ranks; those blocked in a collective with it fail after ``timeout``). A
    rank the launcher ends with SIGTERM says so the same way (:class:`Terminated`; on the main
    thread, the previous handler back when ``fn`` returns), so every rank of a failed job tells
    how it ended: torchrun may end a healthy rank before its own receive from the failed one fails."""
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "-1"))
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    try:
        rank = init_distributed(backend, timeout)
        try:
            return fn(rank, *args)
        finally:
            dist.destroy_process_group()
    except BaseException as e:
        print(f"rank {rank}: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if os.environ.get("PYBUBBLE_TRACEBACK"):
            traceback.print_exc()
        os._exit(1)
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _rank_main(rank: int, fn: Callable[..., Any], args: tuple, ranks: int, backend: str, timeout: float,
               port: int, result_path: str) -> None:
    import pickle

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    result = run_rank(fn, *args, backend=backend, timeout=timeout)
    if rank == 0:
        with open(result_path, "wb") as f:
            pickle.dump(result, f)
    exit_rank(0)


def exit_rank(code: int = 0) -> None:
    """Ends a rank's process after :func:`run_rank` returned: stdout and stderr are flushed, then
    the process exits with ``code`` at once, without the interpreter's finalization.

    ``destroy_process_group`` does not always end the gloo backends: a DeviceMesh still referenced
    keeps its process groups, and after a tensor-parallel model ran (DTensor), DTensor specs that
    hold the mesh stay referenced inside torch (``gc.collect()`` and clearing DTensor's sharding and
    redistribution caches do not free them; torch 2.13). The backends' worker threads then outlive
    ``run_rank`` into the interpreter's finalization, and now and then (about 1 run in 20 of the
    example's ``--tp 2`` on a loaded machine) a rank aborted there, after the training succeeded:
    "terminate called without an active exception", exit -6, from a thread without Python frames.
    The likely path: a worker releasing a finished collective's work drops the last reference to a
    tensor whose Python object the work then owned, which needs the GIL, and a finalizing CPython
    ends such a thread with a forced unwind that ends in ``std::terminate``. A rank has nothing left
    to finalize once its result is written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch(fn: Callable[..., Any], ranks: int, *args: Any, backend: str = "gloo", timeout: float = 60.0) -> Any:
    """Runs ``fn(rank, *args)`` in ``ranks`` processes (spawned: ``fn`` and ``args`` must be
    picklable), each with the env:// variables torchrun would set and the default process group
    initialised from them (:func:`run_rank`: ``backend``, one torch thread, on NCCL GPU ``rank %
    device_count``), and returns rank 0's return value.

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
