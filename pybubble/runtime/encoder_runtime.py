"""What a trainer adopts: :class:`EncoderRuntime` runs the modality encoder of a
``torch.distributed.pipelining`` trainer inside the pipeline's bubbles, step by step. It is built
from the trainer's encoder, stages, schedule and groups and one frozen
:class:`~pybubble.runtime.options.RuntimeOptions`; a trainer makes three calls: the constructor,
:meth:`EncoderRuntime.encoder_output` in its first stage's forward, and :meth:`EncoderRuntime.step`
in place of ``schedule.step`` (with data that varies per step, :meth:`EncoderRuntime.lay_out` before
it chooses the samples' slots).

Per step it shares what every rank measured in the last steps, plans anew (the core schedules
the encoder's pieces into the predicted bubbles; each rank's part is a
:class:`~pybubble.placement.plan.RankPlan`), runs the pieces inside the schedule's waits, hands the
encoder outputs to the first stage and their gradients back, and sums the encoder's gradients over
the ranks. The first step profiles the pieces and the p2p latency, then runs the ``coarse`` way
(the ``megatron`` way in that mode): it yields the LLM ops' durations that the next plans start
from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from ..measure import names
from ..placement.measured import CostHistory, MeasuredCosts
from ..placement.plan import RankPlan, rank_plan
from ..placement.records import LayoutFigures, StepRecord, WaitFigures
from ..placement.slots import SlotLayout, choose_layout
from ..placement.step_placement import first_stage_rank, make_placement, predict_step_s
from ..schedule.balance import deadline_gaps
from . import torch_seams
from .batch import EncoderBatch, Packing, cast_inputs, chunk_counts, inputs_of
from .cuda import side_stream
from .data_parallel import observe_data_parallel
from .encoder_step import EncoderStep
from .executors import executor_for
from .lockstep import ReplicaLockstep, start_together
from .options import RuntimeOptions, legacy_arguments
from .parallel_groups import ParallelGroups, agree_on_data, runtime_group, world_group
from .grad_sync import gradient_route, share_grads, timed_grad_sync
from .pipelining import fill_pipeline_waits
from .profile import check_piece_s
from .replicas import MovedWork, ReplicaBalance, ReplicaMoves
from .schedule_shape import PipelineShape
from .packed import PackedEncoder, check_traceable
from .segments import MicrobatchRun, split_into_pieces, traces_made
from .step_costs import StepCosts
from .tensor_parallel import fill_tp_waits
from .waits import DataParallelWaits, TensorParallelWaits


def check_packing(pack_chunks: bool, ranks: int, mode: str) -> None:
    """Refuses ``pack_chunks`` where it cannot be: beside several pipeline ranks, or in megatron mode."""
    if pack_chunks and (ranks > 1 or mode == "megatron"):
        raise ValueError(f"pack_chunks: needs one pipeline rank and mode pybubble or coarse (packed chains' "
                         f"outputs are cut where they run), got {ranks} pipeline ranks, mode {mode!r}")


def output_of(pieces: Sequence[Any], example: tuple[torch.Tensor, ...]) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of the encoder's output on ``example``, its pieces run in turn."""
    with torch.no_grad():
        run = MicrobatchRun(pieces, example)
        for i in range(len(pieces)):
            run.forward_piece(i)
        output = run.output()
    return tuple(output.shape), output.dtype


@dataclass
class StepData:
    """A step's encoder input as the runtime runs it."""

    batch: EncoderBatch
    """Each slot's tiles (this replica's, moved-in ones included)."""
    own: list[int]
    """Per slot, the chain's rows for this replica's own first stage."""
    moved: MovedWork | None
    """The work moved between replicas (None: none)."""
    packing: Packing
    """How the chains are packed."""
    chains: EncoderBatch
    """The chains' inputs as they run."""


class _Clock:
    """A step's entry and the time its collectives before the step's work took."""

    def __init__(self) -> None:
        self.entry, self.met = time.perf_counter(), 0.0

    @contextlib.contextmanager
    def meeting(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.met += time.perf_counter() - t


class EncoderRuntime:
    """Runs ``encoder`` (on every rank of the pipeline) inside the bubbles of ``schedule``: a
    ``torch.distributed.pipelining`` schedule, single-stage (``Schedule1F1B``, ``ScheduleGPipe``
    over ``stage``) or multi-stage (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
    ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV`` over this rank's stages: ``stage`` is then
    their list). The step is predicted from the schedule's own action table and the encoder's
    pieces follow it; the encoder outputs go to the rank that holds the LLM's first stage.

    ``example``: one microbatch (with data that varies per step: one chunk of tiles) of encoder
    input, on which the encoder is traced and cut into pieces. ``groups``: the trainer's groups, a
    ``DeviceMesh``, a torchtitan ``ParallelDims`` or a
    :class:`~pybubble.runtime.options.TrainerGroups` (None: the stage's group is the pipeline).
    ``options``: a :class:`~pybubble.runtime.options.RuntimeOptions` (default: pybubble mode).
    ``device``: default the stage's. The keyword arguments of earlier releases (``mode=``,
    ``mesh=``, ``piece_s=`` ...) still work, with a ``DeprecationWarning`` naming the replacement.
    See docs/runtime.md.
    """

    def __init__(self, encoder: nn.Module, *, stage: Any = None, schedule: Any,
                 example: torch.Tensor | Sequence[torch.Tensor],
                 groups: Any = None, options: RuntimeOptions | None = None, device: torch.device | str | None = None,
                 **deprecated: Any):
        self.options, trainer_groups = legacy_arguments(options, groups, deprecated)
        torch_seams.check_torch_seams()
        self.mode = self.options.mode
        """``megatron``, ``coarse`` or ``pybubble`` (the options' mode)."""
        self.encoder, self.schedule = encoder, schedule
        self.stages = (torch_seams.schedule_stages(schedule) if stage is None else
                       list(stage) if isinstance(stage, (list, tuple)) else [stage])
        """This rank's pipeline stages (None given: the schedule's)."""
        self.device = torch.device(device if device is not None else getattr(self.stages[0], "device", "cpu"))
        self.groups: ParallelGroups = trainer_groups.resolve(getattr(self.stages[0], "group", None))
        """The trainer's groups the runtime works on."""
        self.dp_group = self.groups.dp
        """The data-parallel replicas' group (None: one replica)."""
        self.pipeline = PipelineShape.of(self.stages, schedule, self.groups, self.options.microbatches)
        """The schedule as the runtime sees it on this rank."""
        self.microbatches = self.pipeline.microbatches
        """The schedule's microbatches per step."""
        self.group = trainer_groups.traffic if trainer_groups.traffic is not None else runtime_group(
            self.groups, self.pipeline.ranks)
        """Where the runtime's own traffic goes."""
        self.world_group = world_group()
        """Every rank (gloo): where the ranks agree on each step's data before it starts."""
        self.dp_waits = DataParallelWaits()
        kinds = [observe_data_parallel(st.submod, self.dp_waits, self.dp_group)
                 for st in self.stages if getattr(st, "submod", None) is not None]
        self.data_parallel = next((k for k in kinds if k is not None), None)
        """How the stages' modules are data-parallel: ``"fsdp"``, ``"ddp"`` or None."""
        self.replicas = 1 if self.dp_group is None else dist.get_world_size(self.dp_group)
        self.dp_reduce, self._grads_to = gradient_route(self.options, self.stages, self.replicas,
                                                        first_stage_rank(self.pipeline.table), self.groups.pp)
        """How the encoder's gradients are reduced over the replicas: ``"mean"`` or ``"sum"``."""
        balance = self.options.balance
        check_packing(balance.pack_chunks, self.pipeline.ranks, self.mode)
        self._cut(encoder, example)
        self.replica_balance = None if not balance.replicas else ReplicaBalance(
            group=self.world_group, dp_group=self.dp_group, pp_rank=self.pipeline.rank, pp_ranks=self.pipeline.ranks,
            first_stage=first_stage_rank(self.pipeline.table), chunk_tiles=self.chunk_tiles, device=self.device,
            packed=balance.pack_chunks)
        """With ``balance.replicas``: each step's encoder work moved between the replicas."""
        self.side = side_stream(self.device)
        every = self.world_group, dist.get_world_size(self.world_group)
        self.measured = StepCosts(*(every if self.replicas > 1 else (self.group, self.pipeline.ranks)),
                                  self.options.keep, self.device)
        """The costs the plans follow, measured as the steps run."""
        self.lockstep = (ReplicaLockstep(self.pipeline.table, self.world_group, self.options.keep)
                         if self.replicas > 1 else None)
        """With several replicas: the step predicted as they run it, waiting for each other."""
        self.steps = 0
        self.records: list[StepRecord] = []
        """One :class:`~pybubble.placement.records.StepRecord` per step."""
        self.placement = None
        """The placement of the last step's encoder pieces (its ``timeline``: the LLM step as predicted)."""
        self.plan: RankPlan | None = None
        """This rank's plan of the last step."""
        self._layout: SlotLayout | None = None  # the next step's layout of its samples (lay_out)
        self._work: EncoderStep | None = None  # the running step

    def _cut(self, encoder: nn.Module, example: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """The encoder traced on ``example`` and cut before each kernel."""
        self.example = cast_inputs(inputs_of(example), self.device, self.options.compute_dtype)
        """One chunk of encoder input: the pieces' fixed shape (its dim 0: the tiles of a chunk)."""
        self.chunk_tiles = int(self.example[0].shape[0])
        """Tiles of one chunk: the encoder's pieces run on this many at a time."""
        if isinstance(encoder, PackedEncoder):  # its layout comes in as tensors: none may be read as a value
            check_traceable(encoder, self.example)
        self.kernels = self.pieces = split_into_pieces(encoder, self.example, self.options.compute_dtype)
        """The encoder cut before each kernel; :attr:`pieces` merges them at the profile."""
        self.spanning = self.chunk_tiles == 1 and any(k.attentions for k in self.kernels)
        """Whether an image may span chunks: the encoder attends by segment
        (:mod:`~pybubble.runtime.spans`) and its pieces run one chunk (tile) at a time."""
        self.piece_s = check_piece_s(self.options.pieces.min_s, self.mode)
        self.output_shape, self.output_dtype = output_of(self.kernels, self.example)

    @property
    def trace(self) -> bool:
        """Whether each step's record keeps (what, start, end) of its tasks, ops and waits."""
        return self.options.trace

    @trace.setter
    def trace(self, on: bool) -> None:
        """Deprecated: the trace is an option (``RuntimeOptions(trace=...)``)."""
        warnings.warn("setting EncoderRuntime.trace is deprecated: pass options=RuntimeOptions(trace=...)",
                      DeprecationWarning, stacklevel=2)
        self.options = dataclasses.replace(self.options, trace=bool(on))

    @property
    def moves(self) -> ReplicaMoves | None:
        """The last step's moves of encoder work between the replicas (None: none balanced)."""
        return None if self.replica_balance is None or self.mode == "megatron" else self.replica_balance.moves

    @property
    def costs(self) -> MeasuredCosts | None:
        """The costs the next plan takes (None before the first step's profile)."""
        return self.measured.costs

    @property
    def history(self) -> CostHistory | None:
        """The measured costs of the last steps (None before the first step's profile)."""
        return self.measured.history

    @property
    def _step_mode(self) -> str:
        """The next step's mode: the profiling step runs the coarse way (megatron in that mode)."""
        return self.mode if self.steps > 0 or self.mode == "megatron" else "coarse"

    def encoder_output(self, microbatch: int | None = None) -> torch.Tensor:
        """On the first stage: the output feeding LLM ``microbatch`` (None: the running forward's)."""
        if self._work is None:
            raise RuntimeError("encoder_output: called outside EncoderRuntime.step")
        return self._work.output(self._work.running_forward() if microbatch is None else microbatch)

    def share_grads(self) -> None:
        """``grads_to="first_stage"``: the encoder's gradients sent from the first stage's rank to the
        pipeline's others (every pp rank calls it, after clipping, before the optimizer steps)."""
        share_grads(self.encoder, self.groups.pp if self._grads_to is not None else None, self._grads_to)

    def predict(self, tiles: Sequence[int]) -> float | None:
        """The step (s) this runtime predicts for microbatches of ``tiles`` tiles each, in its mode
        with its last costs (None before the first step measured them): to compare layouts of a
        step's samples before choosing one (this replica's own work; moves not counted; with
        ``pack_chunks`` the packed chains')."""
        pack = self.chunk_tiles if self.options.balance.pack_chunks else None
        return None if self.costs is None else predict_step_s(
            self._step_mode, self.costs, self.microbatches, self.pipeline.table,
            chunk_counts(Packing.of(tiles, pack).packed, self.chunk_tiles))

    def lay_out(self, sample_tiles: Sequence[int] | np.ndarray, per_chunk: int | None = None) -> SlotLayout:
        """The next step's samples over the LLM's slots: ``sample_tiles``, each sample's tiles in the
        trainer's order (``len / microbatches`` per slot, sample i given slot ``i // rows``; packed
        chunks: its patches, ``per_chunk`` of them a chunk). With ``options.balance.slots`` and costs
        measured, the layout predicted shortest (:func:`slot_layout`), else the given one. The
        trainer runs its samples in ``layout.order``; the step's record names it."""
        self._layout = slot_layout(self, sample_tiles, per_chunk)
        return self._layout

    def step(self, encoder_input: EncoderBatch | torch.Tensor | Sequence[torch.Tensor], *args: Any,
             **kwargs: Any) -> Any:
        """One training step: ``encoder_input`` is the step's encoder input as it comes, an
        :class:`~pybubble.runtime.batch.EncoderBatch` (each microbatch's tiles, varying per step), or
        one batch of a fixed shape (split into the schedule's microbatches along dim 0), on every
        rank; ``args``/``kwargs`` go to ``schedule.step`` (the first stage's inputs, ``target=`` on
        the last stage). Returns what ``schedule.step`` returns; the encoder's gradients are summed
        over the ranks when it returns. Data that does not fit is refused on every rank before the
        step (ValueError). The stages: agree on the data, balance it, measure, plan, start on every
        rank, run, sync the gradients, record."""
        clock, traced = _Clock(), traces_made()
        batch = self._agree(encoder_input, clock)
        with clock.meeting():
            data = step_data(batch, None if self.mode == "megatron" else self.replica_balance,
                            self.chunk_tiles if self.options.balance.pack_chunks else None, self.spanning)
            self._measure(clock.entry)
        plan, plan_s = self._plan(data.chains)
        work, start, waits_s = self._start(plan, data, clock)
        # the runtime's own work and its collectives before the step's work (the profiling step's
        # first collectives wait for every process to start, its profile is no step's)
        own_s, met_s = ((time.perf_counter() - clock.entry - clock.met, clock.met) if self.steps > 0
                        else (float("nan"), float("nan")))
        self._work = work
        try:
            profiling_cuda = self.device.type == "cuda" and self.steps == 0  # its ops timed on the GPU
            result, tp = run_step(work, self.schedule, self.stages, self.dp_waits, self.costs, start, args, kwargs,
                                  trace=self.trace, op_clock=self.measured.now if profiling_cuda else None)
        finally:
            self._work = None
        p = self.pipeline
        sync_s = timed_grad_sync(self.encoder, work.plan, p.rank, p.ranks, self.groups.pp, self.dp_group,
                                 self.measured.now, mean=self.dp_reduce == "mean", to=self._grads_to)
        self._record(work, data, tp, start, plan_s, sync_s, own_s, met_s, waits_s, traces_made() - traced)
        return result

    def _start(self, plan: RankPlan, data: StepData, clock: _Clock) -> tuple[EncoderStep, float, tuple[float, float]]:
        """Every rank starts the step at once (:func:`~pybubble.runtime.lockstep.start_together`), then
        this rank's work begins: the work, its start and the replicas' collectives' and waits' time
        the prediction counts."""
        t = time.perf_counter()
        plan, meet_s, wait_s = start_together(self.lockstep, self.group, plan, self.placement, self.costs,
                                              self.pipeline.rank, self.dp_waits.collectives_s, self.steps > 0)
        self.plan, start = plan, time.perf_counter()
        clock.met += start - t
        work = EncoderStep.begin(plan, data.batch.tiles, data.own, data.moved, data.packing, data.chains,
                                 pieces=self.pieces, group=self.group, rank=self.pipeline.rank,
                                 output=(self.output_shape, self.output_dtype), device=self.device,
                                 chunk_tiles=self.chunk_tiles, executor=executor_for(self.side))
        return work, start, (meet_s, wait_s)

    def _record(self, work: EncoderStep, data: StepData, tp: TensorParallelWaits, start: float, plan_s: float,
                sync_s: float | None, own_s: float, met_s: float, waits_s: tuple[float, float], traces: int) -> None:
        """The step's figures kept for the next plan and its :class:`~pybubble.placement.records.StepRecord`."""
        with record_function(names.region("setup")):
            sync = float("nan") if sync_s is None else sync_s
            self.measured.last_sample = work.sample(self.pipeline.stages, sync, own_s, met_s, tp.stats).vector()
        self.records.append(step_record(work, data, tp, self._layout, start=start, plan_s=plan_s, sync_s=sync_s,
                                        meet_s=waits_s[0], wait_s=waits_s[1], chunk_tiles=self.chunk_tiles,
                                        moves=self.moves, data_parallel=self.data_parallel is not None, traces=traces))
        work.close()
        self._layout = None
        self.steps, self.measured.returned = self.steps + 1, time.perf_counter()

    def _measure(self, entry: float) -> None:
        """The profile before the first step, later every rank's figures of the last step shared."""
        if self.measured.history is None:
            p = self.pipeline
            self.pieces = self.measured.profile(self.kernels, self.example, self.group, p.rank, p.ranks, p.stages,
                                                (self.output_shape, self.output_dtype), self.piece_s)
            self.encoder.zero_grad(set_to_none=True)
        else:
            self.measured.share(entry, self.steps)

    def _agree(self, encoder_input: EncoderBatch | torch.Tensor | Sequence[torch.Tensor], clock: _Clock
               ) -> EncoderBatch:
        """The step's batch, once every rank found its own fit to run (every rank refuses a step any
        rank refused, before anything of it runs)."""
        batch = EncoderBatch.of(encoder_input, self.microbatches).to(None, self.options.compute_dtype)
        problem = batch.problem(self.example, self.microbatches, self._layout)
        with clock.meeting(), record_function(names.region("sync")):
            agree_on_data(problem, self.world_group)
        return batch.to(self.device)

    def _plan(self, chains: EncoderBatch) -> tuple[RankPlan, float]:
        """This step's placement for ``chains``' chunks and this rank's plan (the profiling step runs
        the coarse way, megatron in that mode), and the time planning took."""
        t = time.perf_counter()
        with record_function(names.region("plan")):
            chunks, spans = chains.chunk_counts(self.chunk_tiles), chain_spans(chains) if self.spanning else None
            self.placement = make_placement(self._step_mode, self.costs, self.microbatches, self.pipeline.table, chunks,
                                            spans, spans and [p.attentions > 0 for p in self.pieces])
            self.plan = rank_plan(self.placement, self.pipeline.rank, self.costs, [p.name for p in self.pieces])
        return self.plan, time.perf_counter() - t



def chain_spans(chains: EncoderBatch) -> list[list[int]] | None:
    """Each chain's chunks in spans (an image across several chunks, its attention over all of
    them: :mod:`~pybubble.runtime.spans`), from the chains' images of an encoder that spans
    chunks; None where no span has several chunks."""
    if chains.images is None or not any(g > 1 for x in chains.images for g in x):
        return None
    return chains.images


def slot_layout(runtime: EncoderRuntime, sample_tiles: Sequence[int] | np.ndarray, per_chunk: int | None
                ) -> SlotLayout:
    """The layout :meth:`EncoderRuntime.lay_out` takes: with ``options.balance.slots`` and costs
    measured, the one :meth:`EncoderRuntime.predict` says is shortest
    (:func:`~pybubble.placement.slots.choose_layout`, the last plan's room per slot), else the given one."""
    if not (runtime.options.balance.slots and runtime.costs is not None):
        return SlotLayout.as_given(sample_tiles, runtime.microbatches, per_chunk)
    problem = runtime.placement.problem if runtime.placement is not None else None
    return choose_layout(sample_tiles, runtime.microbatches, runtime.predict,
                         None if problem is None else deadline_gaps(problem), runtime.chunk_tiles, per_chunk)


def step_data(batch: EncoderBatch, replica_balance: ReplicaBalance | None, pack: int | None,
              spans: bool = False) -> StepData:
    """The step's encoder work balanced over the replicas (with a ``replica_balance``:
    :func:`~pybubble.runtime.replicas.move_work`; ``spans``: images may span chunks, and whole
    images move where some replica's do) and packed (``pack``: the chunk's tiles, with ``balance.pack_chunks``:
    :class:`~pybubble.runtime.batch.Packing`)."""
    own, moved = batch.tiles, None
    if replica_balance is not None:
        with record_function(names.region("sync")):
            batch, own, moved = replica_balance.balance(batch, whole=spans)
    packing = Packing.of(batch.tiles, pack)
    return StepData(batch=batch, own=own, moved=moved, packing=packing, chains=packing.batch(batch))


def run_step(work: EncoderStep, schedule: Any, stages: Sequence[Any], dp_waits: DataParallelWaits,
             costs: MeasuredCosts, start: float, args: tuple, kwargs: dict, *, trace: bool = False,
             op_clock: Callable[[], float] | None = None) -> tuple[Any, TensorParallelWaits]:
    """``schedule`` (over this rank's ``stages``) with ``work``'s tasks in its waits: the front, the
    schedule, the drain (``start``: the step's frame origin; ``costs``: the plan's, for the TP waits'
    room; ``trace``: keep the step's trace; ``op_clock``: how the ops are timed, when not by the
    host's clock)."""
    filler = work.filler
    if op_clock is not None:
        filler.progress.op_clock = op_clock
    if trace:
        filler.record_trace()
    dp_waits.begin_step(filler)
    completed = False
    try:
        with record_function(names.region("front")):
            filler.run_front()
        filler.progress.begin_step(frame0=start)
        tp = TensorParallelWaits(filler, costs.tp_gap_s, costs.tp_op_wait_s)
        with fill_pipeline_waits(work.waits, stages), fill_tp_waits(tp), record_function(names.region("schedule")):
            result = schedule.step(*args, **kwargs)
        filler.progress.end_pipeline()
        with record_function(names.region("drain")):
            filler.drain()
        tp.finish()
        work.boundary.end_step()
        if work.moved is not None:
            work.moved.wait_sends()
        completed = True
    finally:
        dp_waits.end_step(completed)
        if sys.exc_info()[0] is not None:
            with contextlib.suppress(Exception):  # a failed step leaves nothing running on the worker
                filler.settle()
    return result, tp


def step_record(work: EncoderStep, data: StepData, tp: TensorParallelWaits, layout: SlotLayout | None, *,
                start: float, plan_s: float, sync_s: float | None, meet_s: float, wait_s: float, chunk_tiles: int,
                moves: ReplicaMoves | None, data_parallel: bool, traces: int = 0) -> StepRecord:
    """The :class:`~pybubble.placement.records.StepRecord` of the step ``work`` ran."""
    stats = work.filler.stats
    return StepRecord(
        predicted_s=work.plan.predicted_step_s, start=start, plan_s=plan_s, sync_s=sync_s or 0.0, filler=stats,
        tp=tp.stats,
        waits={"pp": WaitFigures(stats.waited_s, stats.filled_s),
               "dp": WaitFigures(stats.dp_waited_s, stats.dp_filled_s) if data_parallel else None,
               "tp": WaitFigures(tp.stats.waited_s, tp.stats.filled_s) if tp.stats.waits else None},
        dp_collectives_s=meet_s, dp_replicas_s=wait_s, trace=work.filler.trace, tiles=data.batch.tiles,
        chunks=data.chains.chunk_counts(chunk_tiles), spans=[list(x) for x in work.plan.spans] or None,
        encoder_s=work.encoder_s(),
        llm_s=sum(work.filler.progress.op_busy_s),
        imbalance=None if moves is None else (moves.imbalance(False), moves.imbalance(True)),
        layout=None if layout is None else LayoutFigures(layout.name, layout.given_tiles, layout.slot_tiles),
        traces=traces)


__all__ = ["EncoderRuntime", "StepData", "slot_layout", "step_data", "check_packing", "output_of", "run_step", "step_record"]
