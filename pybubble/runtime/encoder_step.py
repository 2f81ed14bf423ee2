"""One training step of the encoder on this rank: the tasks of its :class:`~pybubble.runtime.plan.RankPlan`
bound to the encoder's pieces and to the boundary communicator, run by the bubble filler."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch

from .boundary import BoundaryCommunicator
from .costs import StepSample, stage_figures
from .executors import CudaExecutor, HostExecutor
from .filler import BubbleFiller
from .plan import RankPlan
from .records import TPWaitStats, tp_op_figures
from .segments import MicrobatchRun, Piece
from .task import FillTask
from .waits import PipelineWaits


class EncoderStep:
    """This rank's encoder work for one step under ``plan``.

    ``inputs(k)``: the encoder input of LLM microbatch k. On the first stage, :meth:`output` gives
    the encoder output of LLM microbatch k (a leaf whose gradient goes back to its producer).
    ``executor``: where the tasks run (the host, or a CUDA side stream).
    """

    def __init__(self, *, plan: RankPlan, pieces: Sequence[Piece], boundary: BoundaryCommunicator,
                 inputs: Callable[[int], tuple[torch.Tensor, ...]], executor: HostExecutor | CudaExecutor):
        self.plan = plan
        self.boundary = boundary
        self.pieces = pieces
        n = len(pieces)
        self.runs: dict[int, MicrobatchRun] = {}
        self.fwd_tasks: dict[int, list[FillTask]] = {}
        """This rank's tasks per encoder microbatch, piece i at index i (their ``took_s``: the
        measured durations)."""
        self.bwd_tasks: dict[int, list[FillTask]] = {}
        tasks = []
        for t in plan.tasks:
            j = t.chain
            if j not in self.runs:
                self.runs[j] = MicrobatchRun(pieces, inputs(plan.assignment[j]))
                self.fwd_tasks[j], self.bwd_tasks[j] = [None] * n, [None] * n
            run = self.runs[j]
            if t.phase == "fwd":
                task = self.fwd_tasks[j][t.piece] = FillTask.of(t, self._forward(run, j, t.piece))
            elif t.after_grad:
                task = self.bwd_tasks[j][t.piece] = FillTask.of(
                    t, self._backward(run, j, t.piece, True), ready=lambda j=j: boundary.grad_ready(j),
                    wait_ready=lambda j=j: boundary.grad(j))
            else:
                task = self.bwd_tasks[j][t.piece] = FillTask.of(t, self._backward(run, j, t.piece, False))
            tasks.append(task)
        self.filler = BubbleFiller.of_plan(plan, tasks, executor)
        self.waits = PipelineWaits(self.filler)
        """The pipeline's waits (and the first stage's waits for encoder outputs)."""

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

    def sample(self, stages: int, sync_s: float, plan_s: float, tp: TPWaitStats) -> StepSample:
        """This rank's figures of the step (``stages``: the pipeline's stage count; ``sync_s``: the
        encoder's gradient sum; ``plan_s``: the planning; ``tp``: the TP waits): on CUDA a task's
        launch is not its duration, the pieces' figures are NaN (the profile's stay)."""
        p, n = self.filler.progress, len(self.pieces)
        timed = self.filler.executor.timed

        def mean(by_chain: dict[int, list[FillTask]]) -> list[float]:
            ts = [[t.took_s for t in chain] for chain in by_chain.values()]
            return [statistics.mean(x[i] for x in ts) if ts and timed else float("nan") for i in range(n)]

        fwd, bwd, wgrad = stage_figures([op.key for op in p.ops], [op.action.stage for op in p.ops], p.op_busy_s,
                                        stages)
        count, gap, wait = tp_op_figures(tp)
        return StepSample(lead=p.lead_busy_s, sync=sync_s, outside=float("nan"), plan=plan_s, stage_fwd=fwd,
                          stage_bwd=bwd, stage_wgrad=wgrad, piece_fwd=mean(self.fwd_tasks),
                          piece_bwd=mean(self.bwd_tasks), tp_count=count, tp_gap=gap, tp_wait=wait)

    # -- called by the LLM's first stage -------------------------------------------------------
    def output(self, llm_microbatch: int) -> torch.Tensor:
        """The encoder output feeding ``llm_microbatch``: a leaf that requires grad; its gradient is
        routed back to the producer by the boundary communicator."""
        j = self.boundary.encoder_microbatch[llm_microbatch]
        if self.plan.producer[j] == self.plan.rank:
            self.filler.force(llm_microbatch)
        elif (probe := self.boundary.output_probe(llm_microbatch)) is not None and self.filler.executor.timed:
            # It comes from another rank and is late: run this rank's tasks while it comes.
            self.waits.wait_for([probe], self.plan.output_arrival_s[j])
        leaf = self.boundary.output(llm_microbatch).detach().requires_grad_(True)
        leaf.register_hook(lambda g: self._on_grad(llm_microbatch, g))
        return leaf

    def _on_grad(self, llm_microbatch: int, grad: torch.Tensor) -> None:
        j = self.boundary.send_grad(llm_microbatch, grad.detach())
        if self.plan.mode == "megatron" and self.plan.producer[j] == self.plan.rank:
            # Megatron: the encoder is part of stage 0, its backward runs inside stage 0's B.
            for task in reversed(self.bwd_tasks[j]):
                self.filler.run_now(task)
