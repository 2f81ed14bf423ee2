"""One training step of the encoder on this rank: its microbatches' pieces as planned tasks, fed
by the boundary communicator and run by the bubble filler."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .boundary import BoundaryCommunicator
from .cuda import SideStream
from .filler import BubbleFiller, FillTask
from .placement import MeasuredCosts, Placement, rank_filler, shift_front_s
from .segments import MicrobatchRun, Piece


class EncoderStep:
    """This rank's encoder work for one step under ``plan``.

    ``inputs(k)``: the encoder input of LLM microbatch k. On the first stage, :meth:`output` gives
    the encoder output of LLM microbatch k (a leaf whose gradient goes back to its producer).
    ``side``: the filler's side stream on CUDA (None: tasks run on the host).
    """

    def __init__(self, *, plan: Placement, rank: int, pieces: Sequence[Piece], costs: MeasuredCosts,
                 boundary: BoundaryCommunicator, inputs: Callable[[int], tuple[torch.Tensor, ...]],
                 side: SideStream | None = None):
        self.plan = plan
        self.rank = rank
        self.boundary = boundary
        n = len(pieces)
        self.runs: dict[int, MicrobatchRun] = {}
        self._bwd_tasks: dict[int, list[FillTask]] = {}
        self.fwd_tasks: dict[int, list[FillTask]] = {}
        """This rank's tasks per encoder microbatch, piece i at index i (their ``took_s``: the
        measured durations)."""
        self.bwd_tasks: dict[int, list[FillTask]] = {}
        self.output_arrival_s: dict[int, float] = {}
        """Encoder microbatch j's output predicted at the first stage, seconds after the step's
        start (spread modes)."""
        tasks: list[FillTask] = []
        if plan.start_s is not None:
            front = shift_front_s(plan)
            for j in range(len(plan.producer)):
                last = 2 * n * j + n - 1
                self.output_arrival_s[j] = (front + float(plan.start_s[last]) + costs.piece_fwd_s[-1]
                                            + (costs.p2p_s if plan.producer[j] != plan.first_stage else 0.0))
        for j, producer in enumerate(plan.producer):
            if producer != rank:
                continue
            k = plan.assignment[j]
            remote = producer != plan.first_stage  # its output and gradient travel: main thread only
            run = self.runs[j] = MicrobatchRun(pieces, inputs(k))
            base = 2 * n * j  # task ids of j in plan.problem (see plan.piece_tasks)
            fwd = []
            needed_at = float("inf")
            if plan.start_s is not None and producer != plan.first_stage:
                needed_at = shift_front_s(plan) + float(plan.timeline.forward_needed[k]) / 1e6 - costs.p2p_s
            for i in range(n):
                start = 0.0 if plan.start_s is None else float(plan.start_s[base + i])
                fwd.append(FillTask(name=f"e{j}f.{pieces[i].name}", duration_s=costs.piece_fwd_s[i],
                                    planned_start_s=start, run=self._forward(run, j, i), needed_by=k, chain=j,
                                    needed_at_s=needed_at, host_only=remote and i == n - 1))
            tasks.extend(fwd)
            self.fwd_tasks[j] = fwd
            bwd = []
            for step, i in enumerate(range(n - 1, -1, -1)):
                start = plan.timeline.step_time if plan.start_s is None else float(plan.start_s[base + n + step])
                first = step == 0
                bwd.append(FillTask(
                    name=f"e{j}b.{pieces[i].name}", duration_s=costs.piece_bwd_s[i], planned_start_s=start,
                    run=self._backward(run, j, i, first), chain=j, host_only=remote and first,
                    ready=(lambda j=j: boundary.grad_ready(j)) if first else (lambda: True),
                    wait_ready=(lambda j=j: boundary.grad(j)) if first else (lambda: None)))
            tasks.extend(bwd)
            self._bwd_tasks[j] = bwd
            self.bwd_tasks[j] = bwd[::-1]
        self.filler: BubbleFiller = rank_filler(plan, rank, tasks, side)

    def _forward(self, run: MicrobatchRun, j: int, i: int) -> Callable[[], None]:
        def task() -> None:
            run.forward_piece(i)
            if run.forward_done:
                self.boundary.send_output(j, run.output())
        return task

    def _backward(self, run: MicrobatchRun, j: int, i: int, first: bool) -> Callable[[], None]:
        def task() -> None:
            if first:
                run.output_grad = self.boundary.grad(j)
            run.backward_piece(i)
        return task

    # -- called by the LLM's first stage -------------------------------------------------------
    def output(self, llm_microbatch: int) -> torch.Tensor:
        """The encoder output feeding ``llm_microbatch``: a leaf that requires grad; its gradient is
        routed back to the producer by the boundary communicator."""
        j = self.boundary.encoder_microbatch[llm_microbatch]
        if self.plan.producer[j] == self.rank:
            self.filler.force(llm_microbatch)
        elif (probe := self.boundary.output_probe(llm_microbatch)) is not None and self.filler.side is None:
            # It comes from another rank and is late: run this rank's tasks while it comes.
            self.filler.wait_for([probe], self.output_arrival_s.get(j))
        leaf = self.boundary.output(llm_microbatch).detach().requires_grad_(True)
        leaf.register_hook(lambda g: self._on_grad(llm_microbatch, g))
        return leaf

    def _on_grad(self, llm_microbatch: int, grad: torch.Tensor) -> None:
        j = self.boundary.send_grad(llm_microbatch, grad.detach())
        if self.plan.mode == "megatron" and self.plan.producer[j] == self.rank:
            # Megatron: the encoder is part of stage 0, its backward runs inside stage 0's B.
            for task in self._bwd_tasks[j]:
                self.filler.run_now(task)
