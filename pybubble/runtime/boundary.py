"""The boundary communicator: encoder outputs to the LLM's first stage, gradients back.

Encoder microbatch j runs on rank ``producer[j]`` and feeds LLM microbatch ``assignment[j]`` on
the first pipeline stage's rank (ranks are ranks of ``group``, the pipeline's ranks). Outputs and
gradients travel with tags of their own, ``tag_base + j`` for outputs and ``tag_base +
microbatches + j`` for gradients, apart from the pipeline's own point-to-point traffic (tag 0) when
they share its gloo group: a receive posted early waits for its own tag only. Receives are posted
when a step begins.

On CUDA the group stays gloo (the tags keep early receives apart; NCCL has no tags and would
serialise them with the sends): tensors are staged through host memory, copied out with
``.cpu()`` (which waits for the stream that produced them) and delivered on ``device``. A CUDA
tensor handed from one stream to another (a local output from the side stream to the LLM's, a
gradient the other way) is marked with ``record_stream`` by the stream that takes it; the streams
themselves are ordered by the filler's events.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from .probe import WorkProbe


def _taken_here(t: torch.Tensor) -> torch.Tensor:
    """``t``, used from now on by the current stream: on CUDA its memory (perhaps allocated on
    another stream) is not handed out again before this stream's uses of it are done."""
    if t.is_cuda:
        t.record_stream(torch.cuda.current_stream(t.device))
    return t


TAG_BASE = 1 << 20
"""The boundary's tags start here: far above the pipeline schedules' (0)."""


class BoundaryCommunicator:
    """Moves encoder microbatches' outputs and gradients between their producer and the LLM's
    first stage (``first_stage_rank``); ``rank``, ``first_stage_rank`` and ``producer`` are ranks
    of ``group``; ``output_shapes[j]``: the shape of encoder microbatch j's output (data that
    varies per step: its tiles)."""

    def __init__(self, *, group: dist.ProcessGroup | None, rank: int, first_stage_rank: int,
                 producer: Sequence[int], assignment: Sequence[int], output_shapes: Sequence[Sequence[int]],
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", tag_base: int = TAG_BASE):
        m = len(assignment)
        if sorted(int(k) for k in assignment) != list(range(m)):
            raise ValueError(f"assignment: {list(assignment)!r} is not a permutation of 0..{m - 1}")
        if len(producer) != m:
            raise ValueError(f"producer: {len(producer)} ranks for {m} encoder microbatches")
        if group is None and any(p != first_stage_rank for p in producer):
            raise ValueError("group: a process group is needed when encoder microbatches run on other ranks")
        self.group = group
        self.tag_base = tag_base
        self.rank = rank
        self.first_stage_rank = first_stage_rank
        self.producer = [int(p) for p in producer]
        self.assignment = [int(k) for k in assignment]
        self.encoder_microbatch = {k: j for j, k in enumerate(self.assignment)}
        if len(output_shapes) != m:
            raise ValueError(f"output_shapes: {len(output_shapes)} shapes for {m} encoder microbatches")
        self.output_shapes = [tuple(s) for s in output_shapes]
        """The output's shape of each encoder microbatch (its gradient's too)."""
        self.dtype = dtype
        self.device = torch.device(device)
        """Where outputs and gradients are delivered; the group's buffers stay in host memory."""
        self._outputs: dict[int, torch.Tensor] = {}
        self._grads: dict[int, torch.Tensor] = {}
        self._pending: dict[tuple[str, int], tuple[torch.Tensor, WorkProbe]] = {}
        self._sends: list[dist.Work] = []

    def _remote(self, j: int) -> bool:
        """Whether encoder microbatch j's output travels (made on another rank, and not empty)."""
        return self.producer[j] != self.first_stage_rank and self.output_shapes[j][0] > 0

    def begin_step(self) -> None:
        """Posts this step's receives (outputs on the first stage, gradients on producers)."""
        self._outputs.clear(), self._grads.clear(), self._pending.clear(), self._sends.clear()
        m = len(self.assignment)
        for j, p in enumerate(self.producer):
            if not self._remote(j):
                continue
            if self.rank == self.first_stage_rank:
                buf = torch.empty(self.output_shapes[j], dtype=self.dtype)
                work = dist.irecv(buf, group=self.group, group_src=p, tag=self.tag_base + j)
                self._pending["out", j] = (buf, WorkProbe(work))
            elif self.rank == p:
                buf = torch.empty(self.output_shapes[j], dtype=self.dtype)
                work = dist.irecv(buf, group=self.group, group_src=self.first_stage_rank,
                                  tag=self.tag_base + m + j)
                self._pending["grad", j] = (buf, WorkProbe(work))

    # -- forward: producer -> first stage ------------------------------------------------------
    def send_output(self, j: int, output: torch.Tensor) -> None:
        """Called on ``producer[j]`` when encoder microbatch j's forward is complete."""
        if not self._remote(j):
            self._outputs[j] = output
        else:
            self._sends.append(dist.isend(output.contiguous().cpu(), group=self.group,
                                          group_dst=self.first_stage_rank, tag=self.tag_base + j))

    def has_output(self, llm_microbatch: int) -> bool:
        """Whether the encoder output LLM microbatch `llm_microbatch` takes has arrived."""
        return self._arrived("out", self.encoder_microbatch[llm_microbatch], self._outputs)

    def output_probe(self, llm_microbatch: int) -> WorkProbe | None:
        """On the first stage: the receive of ``llm_microbatch``'s encoder output while it is
        pending (None once it arrived, or when it is produced here)."""
        j = self.encoder_microbatch[llm_microbatch]
        pending = self._pending.get(("out", j))
        return None if pending is None or pending[1].done() else pending[1]

    def output(self, llm_microbatch: int) -> torch.Tensor:
        """On the first stage: the encoder output that feeds ``llm_microbatch`` (waits for it)."""
        j = self.encoder_microbatch[llm_microbatch]
        return self._received("out", j, self._outputs,
                              f"encoder microbatch {j} (LLM microbatch {llm_microbatch}) was never produced")

    # -- backward: first stage -> producer -----------------------------------------------------
    def send_grad(self, llm_microbatch: int, grad: torch.Tensor) -> int:
        """On the first stage: the gradient of LLM microbatch's encoder output; returns j."""
        j = self.encoder_microbatch[llm_microbatch]
        if not self._remote(j):
            self._grads[j] = grad
        else:
            self._sends.append(dist.isend(grad.contiguous().cpu(), group=self.group, group_dst=self.producer[j],
                                          tag=self.tag_base + len(self.assignment) + j))
        return j

    def grad_ready(self, j: int) -> bool:
        """Whether the gradient of encoder microbatch `j`'s output has arrived."""
        return self._arrived("grad", j, self._grads)

    def grad(self, j: int) -> torch.Tensor:
        """On ``producer[j]``: the gradient of encoder microbatch j's output (waits for it)."""
        return self._received("grad", j, self._grads, f"the gradient of encoder microbatch {j} was never sent")

    def _arrived(self, kind: str, j: int, store: dict[int, torch.Tensor]) -> bool:
        """Whether the tensor of receive (`kind`, `j`) is here (kept in `store`) or has arrived."""
        return j in store or ((kind, j) in self._pending and self._pending[kind, j][1].done())

    def _received(self, kind: str, j: int, store: dict[int, torch.Tensor], missing: str) -> torch.Tensor:
        """The tensor of receive (`kind`, `j`): waited for, moved to the device and kept in `store`;
        RuntimeError(`missing`) when it was never posted."""
        if j not in store:
            if (kind, j) not in self._pending:
                raise RuntimeError(missing)
            buf, probe = self._pending.pop((kind, j))
            probe.result()
            store[j] = buf.to(self.device)
        return _taken_here(store[j])

    def end_step(self) -> None:
        """Waits for this step's sends."""
        for w in self._sends:
            w.wait()
        self._sends.clear()
