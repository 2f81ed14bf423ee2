"""What a trainer adopts: :class:`EncoderRuntime` runs the modality encoder of a
``torch.distributed.pipelining`` trainer inside the pipeline's bubbles, step by step.

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
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from ..measure import names
from .batch import EncoderBatch, Packing, chunk_counts, inputs_of
from .boundary import BoundaryCommunicator
from .cuda import side_stream
from .data_parallel import observe_data_parallel
from .encoder_step import EncoderStep
from .executors import executor_for
from .parallel_groups import ParallelGroups, agree_on_data, resolve_groups, runtime_group, world_group
from . import torch_seams
from .pipelining import fill_pipeline_waits, schedule_table
from .lockstep import ReplicaLockstep
from ..placement.measured import CostHistory, MeasuredCosts
from ..placement.plan import RankPlan, rank_plan
from ..placement.records import StepRecord, WaitFigures
from ..placement.step import (check_mode, first_stage_rank, make_placement, predict_step_s, splits_backward,
                              stage_ranks)
from .profile import check_piece_s, p2p_latency, profile_pieces, share_samples
from .replicas import MovedWork, ReplicaMoves, move_work, replica_grid
from .segments import MicrobatchRun, split_into_pieces
from .tensor_parallel import fill_tp_waits
from .waits import DataParallelWaits, TensorParallelWaits


def sync_grads(module: nn.Module, group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None = None) -> None:
    """Sums ``module``'s gradients over the ranks of ``group`` (one flat all-reduce; None: no
    sum), then averages them over ``dp_group`` (the data-parallel replicas, as FSDP2 and DDP
    average the LLM's gradients)."""
    params = list(module.parameters())
    flat = torch.cat([p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1) for p in params])
    if group is not None:
        dist.all_reduce(flat, group=group)
    if dp_group is not None:
        dist.all_reduce(flat, group=dp_group)
        flat /= dist.get_world_size(dp_group)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def check_stages(stages: Sequence[Any], table: dict, rank: int, ranks: int, schedule: str) -> int:
    """The pipeline's stage count, once ``stages`` (this rank's ``PipelineStage`` objects) are
    found to be built over the pp group and to be the stages ``table`` (that of the schedule class
    named ``schedule``) runs on ``rank``."""
    if len(table) != ranks:
        raise ValueError(f"schedule: its action table has {len(table)} ranks, the pp group {ranks}")
    owner = stage_ranks(table)
    for st in stages:
        if getattr(st, "group_size", ranks) != ranks:
            raise ValueError(f"stage: its group has {st.group_size} ranks, the pp group {ranks} "
                             "(build the PipelineStage with group= the pp group)")
        if getattr(st, "num_stages", len(owner)) != len(owner):
            raise ValueError(f"stage: {st.num_stages} stages, the schedule's table has {len(owner)}")
    if splits_backward(table) and any(isinstance(getattr(st, "submod", None), DistributedDataParallel)
                                      for st in stages):
        raise ValueError(f"stage: a DDP module beside {schedule}, which splits backwards into I and W: torch "
                         "computes W's gradients with autograd.grad, which DDP's all-reduce never sees "
                         "(pytorch/pytorch#144530), so the replicas' gradients would not be averaged "
                         "(docs/runtime.md, 'Zero-bubble schedules beside data parallelism'); shard it with FSDP2")
    mine = sorted(s for s, r in owner.items() if r == rank)
    given = sorted(getattr(st, "stage_index", s) for st, s in zip(stages, mine))
    if len(stages) != len(mine) or given != mine:
        raise ValueError(f"stage: stages {given} on rank {rank}, the schedule's table runs {mine} there")
    return len(owner)


def check_microbatches(microbatches: int | None, table: dict, ranks: int) -> int:
    """The schedule's microbatches per step: those of its action table (``microbatches``, when
    given, must be the same)."""
    in_table = 1 + max(a.microbatch for row in table.values() for a in row)
    if microbatches is None:
        microbatches = in_table
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < ranks:
        raise ValueError(f"microbatches: {microbatches!r} is not an integer >= {ranks} (the pp ranks)")
    if microbatches != in_table:
        raise ValueError(f"microbatches: {microbatches}, the schedule's table runs {in_table}")
    return microbatches


def output_of(pieces: Sequence[Any], example: tuple[torch.Tensor, ...]) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of the encoder's output on ``example``, its pieces run in turn."""
    with torch.no_grad():
        run = MicrobatchRun(pieces, example)
        for i in range(len(pieces)):
            run.forward_piece(i)
        output = run.output()
    return tuple(output.shape), output.dtype


def balanced_batch(runtime: "EncoderRuntime", batch: EncoderBatch) -> tuple[EncoderBatch, list[int], MovedWork | None]:
    """With ``balance_replicas`` (not in megatron mode): the step's encoder work balanced over the
    replicas (:func:`~pybubble.runtime.replicas.move_work`): the chains' inputs, each chain's rows
    for this replica's first stage, the moved work; else the batch as it is."""
    if runtime.grid is None or runtime.mode == "megatron":
        runtime.moves = None
        return batch, batch.tiles, None
    with record_function(names.region("sync")):
        chains, own, moved = move_work(
            batch, replica=dist.get_rank(runtime.dp_group), replicas=runtime.replicas, pp_rank=runtime.rank,
            pp_ranks=runtime.ranks, grid=runtime.grid, group=runtime.world_group,
            first_stage=first_stage_rank(runtime.table), chunk_tiles=runtime.chunk_tiles, device=runtime.device,
            packed=runtime.pack_chunks)
    runtime.moves = moved.moves
    return chains, own, moved


def check_packing(pack_chunks: bool, ranks: int, mode: str) -> bool:
    """``pack_chunks`` where it can be: one pipeline rank, not megatron (ValueError else)."""
    if pack_chunks and (ranks > 1 or mode == "megatron"):
        raise ValueError(f"pack_chunks: needs one pipeline rank and mode pybubble or coarse (packed chains' "
                         f"outputs are cut where they run), got {ranks} pipeline ranks, mode {mode!r}")
    return bool(pack_chunks)


def sync_step_grads(encoder: nn.Module, plan: RankPlan, rank: int, ranks: int, pp_group: dist.ProcessGroup | None,
                    dp_group: dist.ProcessGroup | None) -> bool:
    """The encoder's gradients summed over the pp ranks that ran its microbatches and averaged over
    the replicas; False when this rank has none to sync."""
    spread = plan.mode != "megatron" and ranks > 1  # the encoder's microbatches ran on several pp ranks
    holds = plan.mode != "megatron" or rank == plan.first_stage  # megatron: on the first stage's rank only
    if not (spread or (holds and dp_group is not None)):
        return False
    with record_function(names.region("grad_sync")):
        sync_grads(encoder, pp_group if spread else None, dp_group if holds else None)
    return True


def start_step(runtime: "EncoderRuntime", plan: RankPlan) -> tuple[RankPlan, float, float]:
    """The step's start on every rank at once: with several replicas
    :meth:`~pybubble.runtime.lockstep.ReplicaLockstep.start` (the plan predicted as they run it, the
    collectives' time and the waits for other replicas it counts), else the pipeline's barrier."""
    if runtime.lockstep is not None:
        return runtime.lockstep.start(plan, runtime.placement, runtime.costs, runtime.rank,
                                      runtime.dp_waits.collectives_s, runtime.steps > 0)
    dist.barrier(group=runtime.group)
    return plan, 0.0, 0.0


def begin_work(runtime: "EncoderRuntime", plan: RankPlan, batch: EncoderBatch, own: list[int],
               moved: MovedWork | None, packing: Packing, chains: EncoderBatch) -> EncoderStep:
    """The step's boundary communicator and moved work (their receives posted) and encoder work
    (``chains``: ``batch``'s chains as they run, ``packing`` says how)."""
    with record_function(names.region("setup")):
        shapes = [(own[k], *runtime.output_shape[1:]) for k in plan.assignment]
        boundary = BoundaryCommunicator(group=runtime.group, rank=runtime.rank, first_stage_rank=plan.first_stage,
                                        producer=plan.producer, assignment=plan.assignment,
                                        output_shapes=shapes, dtype=runtime.output_dtype, device=runtime.device)
        boundary.begin_step()
        if moved is not None:
            moved.begin_step(runtime.output_shape[1:], runtime.output_dtype)
        size = runtime.chunk_tiles
        return EncoderStep(plan=plan, pieces=runtime.pieces, boundary=boundary, tiles=batch.tiles, own_tiles=own,
                           moved=moved, packing=packing, inputs=lambda k, c: chains.chunk(k, c, size),
                           executor=executor_for(runtime.side))


class EncoderRuntime:
    """Runs ``encoder`` (on every rank of the pipeline) inside the bubbles of ``schedule``: a
    ``torch.distributed.pipelining`` schedule, single-stage (``Schedule1F1B``, ``ScheduleGPipe``
    over ``stage``) or multi-stage (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
    ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV`` over this rank's stages: ``stage`` is then
    their list). The step is predicted from the schedule's own action table and the encoder's
    pieces follow it; the encoder outputs go to the rank that holds the LLM's first stage.

    The trainer's groups (:func:`~pybubble.runtime.parallel_groups.resolve_groups`): a torchtitan
    ``parallel_dims``, a ``mesh`` (with ``roles`` when its dimensions are not named pp/dp/tp or as
    torchtitan names them), or ``pp_group``/``dp_group``/``tp_group``; with none, the (first)
    stage's group is the pipeline. ``group``: where the runtime's own traffic goes (default the pp
    group when it carries CPU tensors; else one gloo group per pipeline is created). ``mode``:
    ``megatron``, ``coarse`` or ``pybubble``; ``example``: one microbatch of encoder input, on
    which the encoder is traced and cut into pieces; ``keep``: steps whose measured costs the plan
    follows (medians). ``balance_replicas``: varying data's encoder work moved between the replicas;
    ``pack_chunks`` (one pipeline rank, not megatron): each replica's tiles run as one stream of
    chunks (:class:`~pybubble.runtime.batch.Packing`). ``piece_s``: pybubble's pieces, kernels merged to
    at least this many seconds (:func:`~pybubble.runtime.profile.check_piece_s`). See docs/runtime.md.
    """

    def __init__(self, encoder: nn.Module, *, stage: Any, schedule: Any, mode: str,
                 example: torch.Tensor | Sequence[torch.Tensor], device: torch.device | str = "cpu",
                 mesh: Any = None, parallel_dims: Any = None, roles: dict | None = None,
                 pp_group: dist.ProcessGroup | None = None, dp_group: dist.ProcessGroup | None = None,
                 tp_group: dist.ProcessGroup | None = None, group: dist.ProcessGroup | None = None,
                 microbatches: int | None = None, keep: int = 5, balance_replicas: bool = False,
                 pack_chunks: bool = False, piece_s: float | None = None):
        torch_seams.check_torch_seams()
        self.mode, self.encoder, self.schedule, self.device = check_mode(mode), encoder, schedule, torch.device(device)
        self.stages = list(stage) if isinstance(stage, (list, tuple)) else [stage]
        """This rank's pipeline stages."""
        self.groups: ParallelGroups = resolve_groups(
            mesh=mesh, parallel_dims=parallel_dims, roles=roles, pp_group=pp_group, dp_group=dp_group,
            tp_group=tp_group, default_pp=getattr(self.stages[0], "group", None))
        """The trainer's groups the runtime works on."""
        self.pp_group, self.dp_group = self.groups.pp, self.groups.dp
        self.rank, self.ranks = dist.get_rank(self.pp_group), dist.get_world_size(self.pp_group)
        self.table = schedule_table(schedule)
        """The schedule's action table (its compute actions), which the plan simulates."""
        self.num_stages = check_stages(self.stages, self.table, self.rank, self.ranks, type(schedule).__name__)
        self.microbatches = check_microbatches(microbatches, self.table, self.ranks)
        self.groups.check_schedule(self.table, type(schedule).__name__)
        self.group = group if group is not None else runtime_group(self.groups, self.ranks)
        self.world_group = world_group()
        """Every rank (gloo): where the ranks agree on each step's data before it starts."""
        self.dp_waits = DataParallelWaits()
        kinds = [observe_data_parallel(st.submod, self.dp_waits, self.dp_group)
                 for st in self.stages if getattr(st, "submod", None) is not None]
        self.data_parallel = next((k for k in kinds if k is not None), None)
        """How the stages' modules are data-parallel: ``"fsdp"``, ``"ddp"`` or None."""
        self.replicas = 1 if self.dp_group is None else dist.get_world_size(self.dp_group)
        self.pack_chunks = check_packing(pack_chunks, self.ranks, self.mode)
        """Whether each step's chains are packed (:class:`~pybubble.runtime.batch.Packing`)."""
        self.grid = replica_grid(self.world_group, self.dp_group, self.rank, self.ranks) if balance_replicas else None
        """With ``balance_replicas`` over several replicas: the world rank of each replica's
        pipeline ranks (the moves' traffic)."""
        self.moves: ReplicaMoves | None = None
        """The last step's moves of encoder work between the replicas (None: none balanced)."""
        self.example = tuple(t.to(self.device) for t in inputs_of(example))
        """One chunk of encoder input: the pieces' fixed shape (its dim 0: the tiles of a chunk)."""
        self.kernels = self.pieces = split_into_pieces(encoder, self.example)
        """The encoder cut before each kernel; :attr:`pieces` merges them at the profile (:func:`profile_pieces`)."""
        self.piece_s = check_piece_s(piece_s, self.mode)
        self.output_shape, self.output_dtype = output_of(self.kernels, self.example)
        self.side, self.keep = side_stream(self.device), keep
        self.history: CostHistory | None = None
        """The measured costs of the last steps (None before the first step's profile)."""
        self.lockstep = ReplicaLockstep(self.table, self.world_group, keep) if self.replicas > 1 else None
        """With several replicas: the step predicted as they run it, waiting for each other."""
        self.costs: MeasuredCosts | None = None
        self.steps = 0
        self.records: list[StepRecord] = []
        """One :class:`~pybubble.placement.records.StepRecord` per step."""
        self.trace = False
        """True: each step's record keeps (what, start, end) of its tasks, ops and waits."""
        self.placement = None
        """The placement of the last step's encoder pieces (its ``timeline``: the LLM step as predicted)."""
        self.plan: RankPlan | None = None
        """This rank's plan of the last step."""
        self._work, self._returned, self._last_sample = None, None, None  # the running step, the last's return and figures

    # -- measuring -----------------------------------------------------------------------------
    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _profile(self, example: tuple[torch.Tensor, ...]) -> None:
        """Before the first step: the p2p latency and the pieces with their durations (:func:`profile_pieces`)."""
        p2p = p2p_latency(self.group, self.rank, self.ranks, self.output_shape, self.output_dtype)
        group, ranks = self._cost_group
        self.pieces, initial = profile_pieces(self.kernels, example, self._now, group, self.num_stages, p2p, self.piece_s)
        self.encoder.zero_grad(set_to_none=True)
        self.history = CostHistory(initial, keep=self.keep, ranks=ranks)
        self.costs = self.history.initial

    @property
    def _cost_group(self) -> tuple[dist.ProcessGroup | None, int]:
        """Where the measured figures are shared, and its ranks: the pipeline's, or every rank's with
        several replicas (they plan from the same costs; a collective counts as the last to reach it saw it)."""
        every = (self.world_group, dist.get_world_size(self.world_group))
        return (self.group, self.ranks) if self.lockstep is None else every

    def _share_costs(self, entry: float) -> None:
        """All ranks' figures of the last step (with the trainer's time since then) into the
        history; on CUDA the CPU's clock does not time the GPU's work, so the costs stay those of
        the profiling step."""
        with record_function(names.region("sync")):
            every = share_samples(self._last_sample, entry - self._returned, *self._cost_group)
        if self.device.type == "cpu" or self.steps == 1:
            with record_function(names.region("plan")):
                self.history.add(every)
                self.costs = self.history.costs()

    # -- the step ------------------------------------------------------------------------------
    def encoder_output(self, microbatch: int) -> torch.Tensor:
        """On the first stage: the encoder output feeding LLM ``microbatch`` of the running step."""
        if self._work is None:
            raise RuntimeError("encoder_output: called outside EncoderRuntime.step")
        return self._work.output(microbatch)

    def _plan(self, batch: EncoderBatch) -> tuple[RankPlan, float]:
        """This step's placement for ``batch``'s chunks (the chains as they run: packed ones with
        ``pack_chunks``) and this rank's plan (the profiling step runs the coarse way, megatron in
        that mode), and the time planning took."""
        t = time.perf_counter()
        with record_function(names.region("plan")):
            chunks = batch.chunk_counts(self.chunk_tiles)
            self.placement = make_placement(self._step_mode, self.costs, self.microbatches, self.table, chunks)
            self.plan = rank_plan(self.placement, self.rank, self.costs, [p.name for p in self.pieces])
        return self.plan, time.perf_counter() - t

    def predict(self, tiles: Sequence[int]) -> float | None:
        """The step (s) this runtime predicts for microbatches of ``tiles`` tiles each, in its mode
        with its last costs (None before the first step measured them): to compare layouts of a
        step's samples before choosing one (this replica's own work; moves not counted; with
        ``pack_chunks`` the packed chains')."""
        return None if self.costs is None else predict_step_s(
            self._step_mode, self.costs, self.microbatches, self.table,
            chunk_counts(Packing.of(tiles, self.chunk_tiles if self.pack_chunks else None).packed, self.chunk_tiles))

    @property
    def _step_mode(self) -> str:
        """The next step's mode: the profiling step runs the coarse way (megatron in that mode)."""
        return self.mode if self.steps > 0 or self.mode == "megatron" else "coarse"

    @property
    def chunk_tiles(self) -> int:
        """Tiles of one chunk: the encoder's pieces run on this many at a time."""
        return int(self.example[0].shape[0])

    def _run(self, work: EncoderStep, start: float, args: tuple, kwargs: dict) -> tuple[Any, TensorParallelWaits]:
        """The pipeline's schedule with the encoder's tasks in its waits: the front, the schedule,
        the drain."""
        filler = work.filler
        if self.device.type == "cuda" and self.steps == 0:
            filler.progress.op_clock = self._now  # the profiling step times the GPU's ops
        if self.trace:
            filler.record_trace()
        self.dp_waits.begin_step(filler)
        self._work = work
        completed = False
        try:
            with record_function(names.region("front")):
                filler.run_front()
            filler.progress.begin_step(frame0=start)
            tp = TensorParallelWaits(filler, self.costs.tp_gap_s, self.costs.tp_op_wait_s)
            with fill_pipeline_waits(work.waits, self.stages), fill_tp_waits(tp), \
                    record_function(names.region("schedule")):
                result = self.schedule.step(*args, **kwargs)
            filler.progress.end_pipeline()
            with record_function(names.region("drain")):
                filler.drain()
            tp.finish()
            work.boundary.end_step()
            if work.moved is not None:
                work.moved.wait_sends()
            completed = True
        finally:
            self._work = None
            self.dp_waits.end_step(completed)
            if sys.exc_info()[0] is not None:
                with contextlib.suppress(Exception):  # a failed step leaves nothing running on the worker
                    filler.settle()
        return result, tp

    def _sync_grads(self, plan: RankPlan) -> float | None:
        """The encoder's gradients summed over the ranks (:func:`sync_step_grads`), timed."""
        t = self._now()
        synced = sync_step_grads(self.encoder, plan, self.rank, self.ranks, self.pp_group, self.dp_group)
        return self._now() - t if synced else None

    def step(self, encoder_input: EncoderBatch | torch.Tensor | Sequence[torch.Tensor], *args: Any,
             **kwargs: Any) -> Any:
        """One training step: ``encoder_input`` is the step's encoder input as it comes, an
        :class:`~pybubble.runtime.batch.EncoderBatch` (each microbatch's tiles, varying per step), or
        one batch of a fixed shape (split into the schedule's microbatches along dim 0), on every
        rank; ``args``/``kwargs`` go to ``schedule.step`` (the first stage's inputs, ``target=`` on
        the last stage). Returns what ``schedule.step`` returns; the encoder's gradients are summed
        over the ranks when it returns. Data that does not fit is refused on every rank before the
        step (ValueError)."""
        entry = time.perf_counter()
        batch = (encoder_input if isinstance(encoder_input, EncoderBatch)
                 else EncoderBatch.split(encoder_input, self.microbatches))
        problem = batch.problem(self.example, self.microbatches)
        t = time.perf_counter()
        with record_function(names.region("sync")):
            agree_on_data(problem, self.world_group)
        met = time.perf_counter() - t  # the runtime's collectives before the step's work
        batch = batch.to(self.device)
        t = time.perf_counter()
        batch, own, moved = balanced_batch(self, batch)
        packing = Packing.of(batch.tiles, self.chunk_tiles if self.pack_chunks else None)
        chains = packing.batch(batch)
        if self.history is None:
            self._profile(self.example)
        elif self._last_sample is not None:
            self._share_costs(entry)
        met += time.perf_counter() - t
        plan, plan_s = self._plan(chains)
        t = time.perf_counter()
        with record_function(names.region("sync")):
            plan, meet_s, wait_s = start_step(self, plan)
        start = time.perf_counter()
        met += start - t
        self.plan = plan
        work = begin_work(self, plan, batch, own, moved, packing, chains)
        # the runtime's own work and its collectives before the step's work (the profiling step's
        # first collectives wait for every process to start, its profile is no step's)
        own_s, met_s = ((time.perf_counter() - entry - met, met) if self.steps > 0 else (float("nan"), float("nan")))
        result, tp = self._run(work, start, args, kwargs)
        sync_s = self._sync_grads(plan)
        with record_function(names.region("setup")):
            sync = float("nan") if sync_s is None else sync_s
            self._last_sample = work.sample(self.num_stages, sync, own_s, met_s, tp.stats).vector()
        stats = work.filler.stats
        self.records.append(StepRecord(
            predicted_s=plan.predicted_step_s, start=start, plan_s=plan_s, sync_s=sync_s or 0.0, filler=stats,
            tp=tp.stats,
            waits={"pp": WaitFigures(stats.waited_s, stats.filled_s),
                   "dp": WaitFigures(stats.dp_waited_s, stats.dp_filled_s) if self.data_parallel else None,
                   "tp": WaitFigures(tp.stats.waited_s, tp.stats.filled_s) if tp.stats.waits else None},
            dp_collectives_s=meet_s, dp_replicas_s=wait_s, trace=work.filler.trace, tiles=batch.tiles,
            chunks=chains.chunk_counts(self.chunk_tiles),
            encoder_s=work.encoder_s(), llm_s=sum(work.filler.progress.op_busy_s),
            imbalance=None if self.moves is None else (self.moves.imbalance(False), self.moves.imbalance(True))))
        work.close()
        self.steps, self._returned = self.steps + 1, time.perf_counter()
        return result
