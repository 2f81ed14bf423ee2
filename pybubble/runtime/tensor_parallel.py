"""Tensor-parallel waits: the encoder's pieces inside the waits of the LLM's TP collectives.

torch's tensor parallelism (DTensor, ``parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel``) issues its collectives as functional collectives. Run eagerly, a collective's
result is an ``AsyncCollectiveTensor``: the collective is launched at once and its
``torch.ops._c10d_functional.wait_tensor`` runs where the result is first used (the residual add
after a row-parallel projection, the gradient accumulation after a column-parallel one's input
gradient), always through the module-level ``wait_tensor`` of
``torch.distributed._functional_collectives``. While :func:`fill_tp_waits` is active that function
is replaced by one that hands the wait to the filler (and the module's wrapping of a launched
collective's result notes when it was launched):

The policy is :class:`~pybubble.runtime.waits.TensorParallelWaits`'s:

- CPU (gloo): the planned pieces go onto the :class:`~pybubble.runtime.idle_worker.IdleWorker`,
  the CPU's side stream, a thread the kernel runs only on a core that would idle; the rank's main
  thread then allows the worker and blocks in the real wait, which frees its core for the worker,
  takes the core back the moment the collective completes, and holds the worker again (a piece
  then running goes on, at idle priority; no other starts until the next wait). The worker's queue
  is kept at the TP waits the plan predicts for the rest of the step (count x mean wait per op), in
  plan order; before the main thread runs an encoder task itself it waits for the queue, and for
  an encoder output the LLM needs it waits for that output's tasks only (they go onto the worker
  if they are not there yet). What the consumer can still wait for is the GIL, which the worker
  holds between two torch ops of a piece; each wait records when its collective was launched,
  when its consumer resumed and the measured duration of the piece then running, so that the
  delays can be measured against the TP group's last launch (:func:`~pybubble.placement.records.consumer_delays`).
- CUDA (NCCL): the wait is a stream dependency, the CPU does not block: the pieces whose measured
  durations fit in the measured gap are launched on the side stream, ordered after the current
  stream at this point (after the collective's launch), then the real wait orders the current
  stream after the collective.

The hook runs inside the ``__torch_dispatch__`` of a tensor subclass, below autograd; the pieces
on CUDA run with the dispatch keys of the place where :func:`fill_tp_waits` was entered (on the
CPU the worker thread has its own, the defaults), so their forwards record autograd graphs as they
would anywhere else. These are private torch names, reached through
:mod:`pybubble.runtime.torch_seams`, which checks them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from . import torch_seams
from .waits import TensorParallelWaits


@contextlib.contextmanager
def fill_tp_waits(waits: TensorParallelWaits) -> Iterator[TensorParallelWaits]:
    """While active, every eager wait of a functional collective (DTensor's TP collectives) goes
    through ``waits``."""
    keys = torch_seams.dispatch_keys()

    def wait_tensor(tensor: torch.Tensor, real: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return waits.wait(tensor, real, lambda: torch_seams.dispatch_key_guard(keys))

    # launched: the AsyncCollectiveTensor keeps the wrapped tensor (or a view): its wait gets it
    with torch_seams.functional_collective_hooks(wait_tensor, waits.launched):
        yield waits


__all__ = ["fill_tp_waits"]
