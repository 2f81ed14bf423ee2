"""One training step of the encoder on this rank: the tasks of its :class:`~pybubble.placement.plan.RankPlan`
bound to the encoder's pieces and to the boundary communicator, run by the bubble filler."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.profiler import record_function

from ..measure import names
from ..placement.measured import StepSample, stage_figures
from ..placement.plan import RankPlan
from ..placement.records import TPWaitStats, tp_op_figures
from .batch import EncoderBatch, Packing
from .boundary import BoundaryCommunicator
from .executors import Executor
from .filler import BubbleFiller
from .replicas import MovedWork
from .segments import MicrobatchRun, Piece
from .spans import span_backward, span_forward, span_members
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
                 executor: Executor, own_tiles: Sequence[int] | None = None,
                 moved: MovedWork | None = None, packing: Packing | None = None):
        self.plan = plan
        self.boundary = boundary
        self.pieces = pieces
        self.tiles = list(tiles)
        self.own_tiles = self.tiles if own_tiles is None else list(own_tiles)
        """Per LLM microbatch: the chain's rows for this replica's own first stage (the rest,
        ``moved``'s, go to other replicas)."""
        self.moved = moved
        self.packing = packing if packing is not None else Packing.of(self.tiles, None)
        """Which rows of which run chain make each LLM microbatch's chain (``inputs`` and the
        plan's chunks are the run chains', ``packing.packed``)."""
        slots = range(len(self.packing.rows))
        self._sources = [self.packing.sources(k) for k in slots]
        """Per LLM microbatch: the run chains' rows that make its chain (asked at every chain's end)."""
        self._parts = [self.packing.parts(g) for g in slots]
        """Per run chain (by its LLM microbatch): the microbatches' rows it runs (asked by every
        readiness check of the filler)."""
        self._outputs: dict[int, torch.Tensor] = {}
        """Per LLM microbatch: its run chain's output, once its forward is done."""
        self._emitted: set[int] = set()
        self._slot_grads: dict[int, torch.Tensor] = {}
        n = len(pieces)
        self.runs: dict[tuple[int, int], MicrobatchRun] = {}
        """Per (encoder microbatch, chunk): its pieces' state."""
        self.fwd_tasks: dict[tuple[int, int], list[FillTask]] = {}
        """This rank's tasks per (encoder microbatch, chunk), piece i at index i (their
        ``took_s``: the measured durations)."""
        self.bwd_tasks: dict[tuple[int, int], list[FillTask]] = {}
        self._chunk_grads: dict[int, tuple[torch.Tensor, ...]] = {}
        self._spans = span_members(plan.spans)
        """Per (encoder microbatch, chunk) of a span of several chunks: the span's chunks, in order."""
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
                    t, self._backward(*key, t.piece, True), ready=lambda j=t.chain: self._grad_ready(j),
                    wait_ready=lambda j=t.chain: self._chain_grad(j))
            else:
                task = self.bwd_tasks[key][t.piece] = FillTask.of(t, self._backward(*key, t.piece, False))
            tasks.append(task)
        self._chunks: dict[int, list[int]] = {}
        """Per encoder microbatch this rank runs, its chunks in order."""
        for j, c in sorted(self.runs):
            self._chunks.setdefault(j, []).append(c)
        self.filler = BubbleFiller.of_plan(plan, tasks, executor)
        self.waits = PipelineWaits(self.filler)
        """The pipeline's waits (and the first stage's waits for encoder outputs)."""

    @classmethod
    def begin(cls, plan: RankPlan, tiles: Sequence[int], own_tiles: Sequence[int], moved: MovedWork | None,
              packing: Packing, chains: EncoderBatch, *, pieces: Sequence[Piece], group: dist.ProcessGroup, rank: int,
              output: tuple[Sequence[int], torch.dtype], device: torch.device, chunk_tiles: int,
              executor: Executor) -> EncoderStep:
        """The step of ``plan`` on this rank (``rank`` of the pipeline, the runtime's traffic on
        ``group``; the encoder's ``output`` shape and dtype of one chunk): its boundary communicator
        and moved work, their receives posted, and its tasks over ``chains`` in chunks of ``chunk_tiles``."""
        with record_function(names.region("setup")):
            shape, dtype = output
            boundary = BoundaryCommunicator(group=group, rank=rank, first_stage_rank=plan.first_stage,
                                            producer=plan.producer, assignment=plan.assignment,
                                            output_shapes=[(own_tiles[k], *shape[1:]) for k in plan.assignment],
                                            dtype=dtype, device=device)
            boundary.begin_step()
            if moved is not None:
                moved.begin_step(shape[1:], dtype)
            return cls(plan=plan, pieces=pieces, boundary=boundary, tiles=tiles, own_tiles=own_tiles, moved=moved,
                       packing=packing, inputs=lambda k, c: chains.chunk(k, c, chunk_tiles), executor=executor)

    def _slot_grad_ready(self, k: int) -> bool:
        """Whether every gradient of LLM microbatch k's chain has arrived."""
        j = self.boundary.encoder_microbatch[k]
        return ((self.own_tiles[k] == 0 or self.boundary.grad_ready(j))
                and (self.moved is None or self.moved.grads_ready(k)))

    def _grad_ready(self, j: int) -> bool:
        return all(self._slot_grad_ready(k) for k, _, _ in self._parts[self.plan.assignment[j]])

    def _slot_grad(self, k: int) -> torch.Tensor:
        """The gradient of LLM microbatch k's chain: its rows for this replica's own first stage,
        then the moved-in ones' (waits for them)."""
        if k not in self._slot_grads:
            j = self.boundary.encoder_microbatch[k]
            grad = (self.boundary.grad(j) if self.own_tiles[k] else
                    torch.zeros((0, *self.boundary.output_shapes[j][1:]), dtype=self.boundary.dtype,
                                device=self.boundary.device))
            if self.moved is not None:
                grad = torch.cat([grad, *self.moved.moved_grads(k)])
            self._slot_grads[k] = grad
        return self._slot_grads[k]

    def _chain_grad(self, j: int) -> torch.Tensor:
        """The gradient of run chain j's rows (waits for every LLM microbatch's it runs rows of)."""
        return torch.cat([self._slot_grad(k)[lo:hi] for k, lo, hi in self._parts[self.plan.assignment[j]]])

    def _emit(self) -> None:
        """Each LLM microbatch's chain whose rows are all run: its own rows to this replica's first
        stage, the rest to the replicas that own them."""
        for k, (n, sources) in enumerate(zip(self.packing.rows, self._sources)):
            if k in self._emitted or not n or any(g not in self._outputs for g, _, _ in sources):
                continue
            self._emitted.add(k)
            out = torch.cat([self._outputs[g][lo:hi] for g, lo, hi in sources])
            if self.own_tiles[k]:
                self.boundary.send_output(self.boundary.encoder_microbatch[k], out[:self.own_tiles[k]])
            if self.moved is not None:
                self.moved.send_outputs(k, out[self.own_tiles[k]:])

    def _forward(self, j: int, c: int, i: int) -> Callable[[], None]:
        run = self.runs[j, c]
        span = self._spans.get((j, c)) if self.pieces[i].attentions else None

        def task() -> None:
            if span is None:
                run.forward_piece(i)
            elif run.next_forward == i:  # the span's first chunk runs the piece for all of them
                span_forward([self.runs[j, cc] for cc in span], i)
            chunks = self._chunks[j]
            if run.forward_done and c == chunks[-1]:
                g = self.plan.assignment[j]
                self._outputs[g] = torch.cat([self.runs[j, cc].output() for cc in chunks])[:self.packing.packed[g]]
                self._emit()
        return task

    def _backward(self, j: int, c: int, i: int, first: bool) -> Callable[[], None]:
        run = self.runs[j, c]
        span = self._spans.get((j, c)) if self.pieces[i].attentions else None

        def task() -> None:
            if first:  # the chain's output gradient, cut into its chunks (zero for the padding tiles)
                grad = self._chain_grad(j)
                chunks = self._chunks[j]
                size = self.runs[j, chunks[0]].output().shape[0]
                pad = size * len(chunks) - grad.shape[0]
                if pad:
                    grad = torch.cat([grad, grad.new_zeros((pad, *grad.shape[1:]))])
                self._chunk_grads[j] = tuple(grad.split(size))
            for cc in span or (c,):  # a span's backward needs every chunk's gradient
                if self.runs[j, cc].output_grad is None:
                    self.runs[j, cc].output_grad = self._chunk_grads[j][self._chunks[j].index(cc)]
            if span is None:
                run.backward_piece(i)
            elif run.next_backward == i:
                span_backward([self.runs[j, cc] for cc in span], i)
        return task

    def close(self) -> None:
        """Drops the step's tasks and the pieces' state once the step is recorded: the tasks'
        closures refer back to this object, and without this each step's objects would wait for
        Python's cycle collector, whose full passes then stall a later step (200 ms and more here)."""
        self.fwd_tasks.clear()
        self.bwd_tasks.clear()
        self.runs.clear()
        self.filler.tasks.clear()

    def encoder_s(self) -> float:
        """The time of this rank's encoder tasks this step: measured where the executor times them,
        else their estimates."""
        tasks = [t for by in (self.fwd_tasks, self.bwd_tasks) for chain in by.values() for t in chain]
        return float(sum(self.filler.executor.spent_s(t) for t in tasks))

    def sample(self, stages: int, sync_s: float, before_s: float, agree_s: float, tp: TPWaitStats) -> StepSample:
        """This rank's figures of the step (``stages``: the pipeline's stage count; ``sync_s``: the
        encoder's gradient sum; ``before_s``: the runtime's own work before the step's; ``agree_s``:
        its collectives before it; ``tp``: the TP waits): on CUDA a task's launch is not its
        duration, the pieces' figures are NaN (the profile's stay)."""
        p, n, ex = self.filler.progress, len(self.pieces), self.filler.executor

        def mean(by_chain: dict[int, list[FillTask]]) -> list[float]:
            ts = [[ex.measured_s(t) for t in chain] for chain in by_chain.values()]
            return [statistics.mean(x[i] for x in ts) if ts else float("nan") for i in range(n)]

        fwd, bwd, wgrad = stage_figures([op.key for op in p.ops], [op.action.stage for op in p.ops], p.op_busy_s,
                                        stages)
        count, gap, wait = tp_op_figures(tp)
        return StepSample(lead=p.lead_busy_s, sync=sync_s, outside=float("nan"), plan=before_s, stage_fwd=fwd,
                          stage_bwd=bwd, stage_wgrad=wgrad, piece_fwd=mean(self.fwd_tasks),
                          piece_bwd=mean(self.bwd_tasks), tp_count=count, tp_gap=gap, tp_wait=wait, agree=agree_s)

    # -- called by the LLM's first stage -------------------------------------------------------
    def output(self, llm_microbatch: int) -> torch.Tensor:
        """The encoder output feeding ``llm_microbatch``: a leaf that requires grad; its gradient is
        routed back to the producer by the boundary communicator."""
        # Outside the step's ops torch runs the stage once to infer its shapes (its backward too when
        # the stage is the last one as well): there the output gives its values, and no gradient
        # goes back from it (the step's own forward of the microbatch asks again).
        track = self.filler.progress.in_op
        local = self._local_output(llm_microbatch, track)
        return local if self.moved is None else self.moved.assemble(llm_microbatch, local, track)

    def running_forward(self) -> int:
        """The LLM microbatch of the first stage's forward running now (0 outside the step's ops,
        where torch infers the stage's shapes on the first microbatch's inputs)."""
        p = self.filler.progress
        if not p.in_op or p.next_op is None:
            return 0
        action = p.next_op.action
        if action.kind != "F" or action.stage != 0:
            raise RuntimeError(f"encoder_output: called in {action.kind}{action.microbatch} of stage {action.stage}, "
                               "not in the first stage's forward: pass the microbatch")
        return action.microbatch

    def _local_output(self, llm_microbatch: int, track: bool = True) -> torch.Tensor:
        """The rows of ``llm_microbatch``'s image tokens this replica ran itself (``track``: their
        gradient goes back to their producer)."""
        j = self.boundary.encoder_microbatch[llm_microbatch]
        here = self.plan.producer[j] == self.plan.rank
        if here:
            self.filler.force(llm_microbatch)  # also when all its rows go to other replicas: they need them now
        if self.own_tiles[llm_microbatch] == 0:  # none: nothing was computed here, no gradient goes back
            return torch.zeros(self.boundary.output_shapes[j], dtype=self.boundary.dtype, device=self.boundary.device)
        if not here and (probe := self.boundary.output_probe(llm_microbatch)) is not None:
            # It comes from another rank and is late: run this rank's tasks while it comes.
            self.waits.wait_for_output(probe, self.plan.output_arrival_s[j])
        leaf = self.boundary.output(llm_microbatch).detach()
        if track:
            leaf.requires_grad_(True).register_hook(lambda g: self._on_grad(llm_microbatch, g))
        return leaf

    def _on_grad(self, llm_microbatch: int, grad: torch.Tensor) -> None:
        j = self.boundary.send_grad(llm_microbatch, grad.detach())
        if self.plan.mode == "megatron" and self.plan.producer[j] == self.plan.rank:
            # Megatron: the encoder is part of stage 0, its backward runs inside stage 0's B.
            for c in self._chunks[j]:
                for task in reversed(self.bwd_tasks[j, c]):
                    self.filler.run_now(task)
