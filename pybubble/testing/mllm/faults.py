"""Faults injected into the test trainer's ranks (``--fault`` on ``--fail-rank`` at ``--fail-step``):
the tests' way to show that a failing rank ends every rank within the timeout, that a straggler
still finishes, and that bad data is refused on every rank before the step."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

import torch
from torch import nn

from ...runtime import EncoderBatch, EncoderRuntime


FAULTS = ("raise", "kill", "stall", "encoder", "slow", "tile_shape", "empty_step")
"""Injected faults (tests): raise before the step, SIGKILL in the middle of a forward, sleep far
past the timeout there, raise inside an encoder piece, run every LLM forward twice as long; with
varying data, hand the runtime a tile of the wrong shape, or a step without microbatches (on the
failing rank only: every rank must refuse the step)."""


class Fault:
    """An injected fault (``--fault`` on ``--fail-rank`` at ``--fail-step``): see :data:`FAULTS`."""

    def __init__(self, args: Any, rank: int):
        self.kind, self.step = args.fault, args.fail_step
        self.on = rank == args.fail_rank
        self.rank, self.timeout = rank, args.timeout
        self.now = -1
        """The running step."""

    def before_step(self, step: int) -> None:
        """Step ``step`` begins (the ``raise`` fault raises here)."""
        self.now = step
        if self.on and self.kind == "raise" and step == self.step:
            raise RuntimeError(f"injected fault on rank {self.rank} at step {step} (--fail-rank/--fail-step)")

    def data(self, step: tuple) -> tuple:
        """The step's inputs, spoilt on the failing rank (``tile_shape``, ``empty_step``)."""
        if not (self.on and self.now == self.step and self.kind in ("tile_shape", "empty_step")):
            return step
        batch = step[0]
        if self.kind == "empty_step":
            return (EncoderBatch([]), *step[1:])
        first = batch.inputs[0][0]
        wrong = torch.zeros((1, *first.shape[1:-1], first.shape[-1] + 1), dtype=first.dtype)
        return (EncoderBatch([(wrong,), *batch.inputs[1:]]), *step[1:])

    def _here(self) -> bool:
        return self.on and self.now == self.step

    def stage_hooks(self, module: nn.Module) -> None:
        """Faults inside the LLM stage's forward (hooks on the failing rank only)."""
        if not self.on or self.kind not in ("kill", "stall", "slow"):
            return
        started: list[float] = []

        def pre(_m, _args):
            started.append(time.perf_counter())
            if self._here() and self.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self._here() and self.kind == "stall":
                time.sleep(20 * self.timeout)

        def post(_m, _args, _out):
            took = time.perf_counter() - started.pop()
            if self.on and self.kind == "slow":
                time.sleep(took)  # a straggler: every forward twice as long, every step

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def encoder_pieces(self, runtime: EncoderRuntime) -> None:
        """A fault inside the encoder's last piece."""
        if not (self.on and self.kind == "encoder"):
            return
        piece = runtime.kernels[-1]

        def fn(*state):
            if self._here():
                raise RuntimeError(f"injected fault in encoder piece {piece.name} on rank {self.rank} at step {self.now}")
            return piece.fn(*state)

        runtime.kernels[-1] = dataclasses.replace(piece, fn=fn)
