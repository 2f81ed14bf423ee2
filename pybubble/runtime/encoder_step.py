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

    ``inputs(k, c)``: chunk c of the encoder input of LLM microbatch k (the pieces' fixed shape);
    ``tiles[k]``: the tiles of microbatch k (a chain's output is its chunks' outputs, cut to them).
    On the first stage, :meth:`output` gives the encoder output of LLM microbatch k (a leaf whose
    gradient goes back to its producer). ``executor``: where the tasks run (the host, or a CUDA
    side stream).
    """

    def __init__(self, *, plan: RankPlan, pieces: Sequence[Piece], boundary: BoundaryCommunicator,
                 inputs: Callable[[int, int], tuple[torch.Tensor, ...]], tiles: Sequence[int],
                 executor: HostExecutor | CudaExecutor):
        self.plan = plan
        self.boundary = boundary
        self.pieces = pieces
        self.tiles = list(tiles)
        n = len(pieces)
        self.runs: dict[tuple[int, int], MicrobatchRun] = {}
        """Per (encoder microbatch, chunk): its pieces' state."""
        self.fwd_tasks: dict[tuple[int, int], list[FillTask]] = {}
        """This rank's tasks per (encoder microbatch, chunk), piece i at index i (their
        ``took_s``: the measured durations)."""
        self.bwd_tasks: dict[tuple[int, int], list[FillTask]] = {}
        self._chunk_grads: dict[int, tuple[torch.Tensor, ...]] = {}
        tasks = []
        for t in plan.tasks:
            key = (t.chain, t.chunk)
            if key not in self.runs:
                self.runs[key] = MicrobatchRun(pieces, inputs(plan.assignment[t.chain], t.chunk))
                self.fwd_tasks[key], self.bwd_tasks[key] = [None] * n, [None] * n
            if t.phase == "fwd":
                task = self.fwd_tasks[key][t.piece] = FillTask.of(t, self._forward(*key, t.piece))
            elif t.after_grad:
                task = self.bwd_tasks[key][t.piece] = FillTask.of(
                    t, self._backward(*key, t.piece, True), ready=lambda j=t.chain: boundary.grad_ready(j),
                    wait_ready=lambda j=t.chain: boundary.grad(j))
            else:
                task = self.bwd_tasks[key][t.piece] = FillTask.of(t, self._backward(*key, t.piece, False))
            tasks.append(task)
        self.filler = BubbleFiller.of_plan(plan, tasks, executor)
        self.waits = PipelineWaits(self.filler)
        """The pipeline's waits (and the first stage's waits for encoder outputs)."""

    def _chunks(self, j: int) -> list[int]:
        return sorted(c for (jj, c) in self.runs if jj == j)

    def _forward(self, j: int, c: int, i: int) -> Callable[[], None]:
        run = self.runs[j, c]

        def task() -> None:
            run.forward_piece(i)
            chunks = self._chunks(j)
            if run.forward_done and c == chunks[-1]:
                out = torch.cat([self.runs[j, cc].output() for cc in chunks])
                self.boundary.send_output(j, out[:self.tiles[self.plan.assignment[j]]])
        return task

    def _backward(self, j: int, c: int, i: int, first: bool) -> Callable[[], None]:
        run = self.runs[j, c]

        def task() -> None:
            if first:  # the chain's output gradient, cut into its chunks (zero for the padding tiles)
                grad = self.boundary.grad(j)
                chunks = self._chunks(j)
                size = self.runs[j, chunks[0]].output().shape[0] if chunks else 0
                pad = size * len(chunks) - grad.shape[0]
                if pad:
                    grad = torch.cat([grad, grad.new_zeros((pad, *grad.shape[1:]))])
                self._chunk_grads[j] = tuple(grad.split(size))
            if run.output_grad is None:
                run.output_grad = self._chunk_grads[j][self._chunks(j).index(c)]
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
        if self.tiles[llm_microbatch] == 0:  # no images: nothing was computed, no gradient goes back
            return torch.zeros(self.boundary.output_shapes[j], dtype=self.boundary.dtype, device=self.boundary.device)
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
            for c in self._chunks(j):
                for task in reversed(self.bwd_tasks[j, c]):
                    self.filler.run_now(task)
