"""What a trainer adopts: :class:`EncoderRuntime` runs the modality encoder of a
``torch.distributed.pipelining`` trainer inside the pipeline's bubbles, step by step.

Per step it shares what every rank measured in the last steps, plans anew (the core schedules
the encoder's pieces into the predicted bubbles), runs the pieces inside the schedule's waits,
hands the encoder outputs to the first stage and their gradients back, and sums the encoder's
gradients over the ranks. The first step is a profiling step, run the ``coarse`` way (the
``megatron`` way in that mode): it yields the LLM ops' and the pieces' durations that the next
plans start from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from . import torch_seams
from .boundary import TAG_BASE, BoundaryCommunicator
from .costs import FIELDS, CostHistory, stage_figures, step_sample
from .cuda import side_stream
from .data_parallel import observe_data_parallel
from .encoder_step import EncoderStep
from .pipelining import fill_pipeline_waits, schedule_table
from .placement import MeasuredCosts, check_mode, make_placement, placement_step_s, splits_backward, stage_ranks
from .segments import MicrobatchRun, split_into_pieces
from .tensor_parallel import TensorParallelWaits, TPWaitStats, fill_tp_waits, tp_op_figures


def _inputs_of(x: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (x,) if isinstance(x, torch.Tensor) else tuple(x)


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


def _cpu_capable(group: dist.ProcessGroup) -> bool:
    """Whether ``group`` carries CPU tensors (gloo, alone or beside NCCL as ``cpu:gloo,cuda:nccl``)."""
    return "gloo" in str(dist.get_backend(group))


class EncoderRuntime:
    """Runs ``encoder`` (on every rank of the pipeline) inside the bubbles of ``schedule``: a
    ``torch.distributed.pipelining`` schedule, single-stage (``Schedule1F1B``, ``ScheduleGPipe``
    over ``stage``) or multi-stage (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
    ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV`` over this rank's stages: ``stage`` is then
    their list). The step is predicted from the schedule's own action table
    (``schedule.pipeline_order``) and the encoder's pieces follow it; the encoder outputs go to
    the rank that holds the LLM's first stage.

    It runs in the process group the trainer set up (torchrun's env:// rendezvous, or
    :func:`launch`) and on the trainer's groups:

    - ``mesh``: the trainer's ``DeviceMesh`` with torchtitan's dimension names: ``"pp"`` (the
      pipeline), optionally ``"dp"`` (data-parallel replicas of the pipeline) and ``"tp"``; or
      ``pp_group``/``dp_group`` explicitly; or neither: the (first) stage's group (``stage.group``,
      by default the whole world) is the pipeline and there is no data parallelism.
    - ``group``: where the runtime's own traffic goes (cost sharing, the step's barrier, encoder
      outputs and their gradients): default the pp group itself when it carries CPU tensors
      (gloo), with tags apart from the pipeline's; on an NCCL-only pp group one gloo group per
      pipeline over the same ranks is created (every rank constructs the runtime; with explicit
      ``pp_group`` and no mesh, pass ``group``). No other group is created.
    - ``microbatches``: the schedule's microbatches per step (default: those of its action table,
      :func:`~pybubble.runtime.pipelining.schedule_table`; given, they must be the same).

    When a stage's module is sharded with FSDP2 or wrapped in DDP, its data-parallel
    collectives are observed (:func:`~pybubble.runtime.data_parallel.observe_data_parallel`):
    their waits count as ``dp`` waits, and in ``pybubble`` mode the filler runs encoder tasks in
    them. The encoder's gradients are summed over the pp group (each rank ran some of the step's
    microbatches) and averaged over the dp group.

    - ``mode``: ``megatron`` (the whole encoder inside the first stage's ops), ``coarse`` (spread
      over the ranks, forwards before the pipeline, backwards after it) or ``pybubble`` (its pieces
      inside the pipeline's waits, where the core's schedule puts them).
    - ``example``: one microbatch of encoder input (a tensor or a tuple of tensors) on ``device``:
      the encoder is traced on it and cut into kernel-level pieces (:func:`split_into_pieces`).
    - ``keep``: steps whose measured costs the plan follows (medians).

    The first stage's module (on the rank that holds it) gets the encoder output of LLM
    microbatch ``k`` from :meth:`encoder_output` (a tensor that requires grad; its gradient goes
    back to the rank that produced it). Call :meth:`step` instead of ``schedule.step``; then run the optimizer over the
    encoder's and the stage's parameters as usual.
    """

    def __init__(self, encoder: nn.Module, *, stage: Any, schedule: Any, mode: str,
                 example: torch.Tensor | Sequence[torch.Tensor], device: torch.device | str = "cpu",
                 mesh: Any = None, pp_group: dist.ProcessGroup | None = None,
                 dp_group: dist.ProcessGroup | None = None, group: dist.ProcessGroup | None = None,
                 microbatches: int | None = None, keep: int = 5):
        torch_seams.check_torch_seams()
        self.mode = check_mode(mode)
        self.encoder = encoder
        self.stage = stage
        self.stages = list(stage) if isinstance(stage, (list, tuple)) else [stage]
        """This rank's pipeline stages."""
        self.schedule = schedule
        self.device = torch.device(device)
        if mesh is not None:
            if pp_group is not None or dp_group is not None:
                raise ValueError("mesh: give a mesh or pp_group/dp_group, not both")
            names = tuple(mesh.mesh_dim_names or ())
            if "pp" not in names:
                raise ValueError(f"mesh: no 'pp' dimension (its dimensions: {names})")
            pp_group = mesh["pp"].get_group()
            dp_group = mesh["dp"].get_group() if "dp" in names else None
        self.pp_group: dist.ProcessGroup = (pp_group if pp_group is not None
                                            else getattr(self.stages[0], "group", None) or dist.group.WORLD)
        """The pipeline's ranks (the stages of the schedule's table over them)."""
        self.dp_group = dp_group if dp_group is not None and dist.get_world_size(dp_group) > 1 else None
        """The data-parallel replicas of this rank (None: no data parallelism)."""
        self.rank = dist.get_rank(self.pp_group)
        self.ranks = dist.get_world_size(self.pp_group)
        for st in self.stages:
            if getattr(st, "group_size", self.ranks) != self.ranks:
                raise ValueError(f"stage: its group has {st.group_size} ranks, the pp group {self.ranks} "
                                 "(build the PipelineStage with group= the pp group)")
        self.table = schedule_table(schedule)
        """The schedule's action table (its compute actions), which the plan simulates."""
        if len(self.table) != self.ranks:
            raise ValueError(f"schedule: its action table has {len(self.table)} ranks, the pp group {self.ranks}")
        tp = mesh["tp"].size() if mesh is not None and "tp" in tuple(mesh.mesh_dim_names or ()) else 1
        if tp > 1 and splits_backward(self.table):
            raise ValueError(f"schedule: {type(schedule).__name__} splits backwards into I and W, beside the mesh's "
                             f"tp {tp}: tensor parallelism is predicted with whole backwards only (Schedule1F1B, "
                             "ScheduleGPipe, ScheduleInterleaved1F1B)")
        owner = stage_ranks(self.table)
        self.num_stages = len(owner)
        """The pipeline's stages (over all its ranks)."""
        for st in self.stages:
            if getattr(st, "num_stages", self.num_stages) != self.num_stages:
                raise ValueError(f"stage: {st.num_stages} stages, the schedule's table has {self.num_stages}")
        mine = sorted(s for s, r in owner.items() if r == self.rank)
        given = sorted(getattr(st, "stage_index", s) for st, s in zip(self.stages, mine))
        if len(self.stages) != len(mine) or given != mine:
            raise ValueError(f"stage: stages {given} on rank {self.rank}, the schedule's table runs {mine} there")
        in_table = 1 + max(a.microbatch for row in self.table.values() for a in row)
        if microbatches is None:
            microbatches = in_table
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < self.ranks:
            raise ValueError(f"microbatches: {microbatches!r} is not an integer >= {self.ranks} (the pp ranks)")
        if microbatches != in_table:
            raise ValueError(f"microbatches: {microbatches}, the schedule's table runs {in_table}")
        self.microbatches = microbatches
        self.group = group if group is not None else self._own_group(mesh)
        kinds = [observe_data_parallel(st.submod, self._wait_dp, self.dp_group)
                 for st in self.stages if getattr(st, "submod", None) is not None]
        self.data_parallel = next((k for k in kinds if k is not None), None)
        """How the stages' modules are data-parallel: ``"fsdp"``, ``"ddp"`` or None."""
        self._dp_seen: list[float] = []
        """This step's data-parallel collectives: seconds from each one's wait to its completion."""
        self._dp_last: list[float] = []
        """The same of the last step: the room the filler gives the same collective now."""
        example = tuple(t.to(self.device) for t in _inputs_of(example))
        self.pieces = split_into_pieces(encoder, example)
        with torch.no_grad():
            out = MicrobatchRun(self.pieces, example)
            for i in range(len(self.pieces)):
                out.forward_piece(i)
            output = out.output()
        self.output_shape, self.output_dtype = tuple(output.shape), output.dtype
        self.side = side_stream(self.device)
        self.history = CostHistory(self._profile(example), keep=keep, ranks=self.ranks)
        self.costs: MeasuredCosts = self.history.initial
        self.steps = 0
        self.records: list[dict[str, Any]] = []
        """Per step: ``predicted_s``, ``start`` (perf_counter after the step's barrier), ``plan_s``,
        ``sync_s``, ``filler`` (the filler's counters), ``waits`` (per kind of wait, ``pp``,
        ``dp``, ``tp``: ``waited_s``, the LLM's time blocked in such waits with no encoder task
        running, and ``filled_s``, the encoder tasks' time inside them; None where the kind is not
        observed: ``dp`` without FSDP2/DDP on the stage, ``tp`` without tensor parallelism), ``tp``
        (what the TP waits saw, :class:`TPWaitStats`)."""
        self.trace = False
        """True: each step's filler keeps (what, start, end) of its tasks, ops and waits in
        ``records[-1]["trace"]``."""
        self.placement = None
        """The placement of the last step's encoder pieces (its ``timeline``: the LLM step as predicted)."""
        self._work: EncoderStep | None = None
        self._returned: float | None = None
        self._last_sample: np.ndarray | None = None

    def _own_group(self, mesh: Any) -> dist.ProcessGroup:
        """The group of the runtime's own traffic: the pp group when it carries CPU tensors; else
        one gloo group per pipeline of ``mesh`` (or of the world), this rank's."""
        if _cpu_capable(self.pp_group):
            return self.pp_group
        if mesh is not None:
            names = tuple(mesh.mesh_dim_names)
            pipelines = mesh.mesh.movedim(names.index("pp"), -1).reshape(-1, self.ranks).tolist()
        elif self.ranks == dist.get_world_size():
            pipelines = [list(range(self.ranks))]
        else:
            raise ValueError(f"group: the pp group's backend is {dist.get_backend(self.pp_group)!r}, which does not "
                             "carry CPU tensors; pass a gloo group over its ranks (or the mesh)")
        me = dist.get_rank()
        mine = None
        for ranks in pipelines:  # every rank creates every pipeline's group, in the same order
            g = dist.new_group(ranks, backend="gloo")
            if me in ranks:
                mine = g
        return mine

    def _wait_dp(self, works: Sequence[dist.Work]) -> None:
        """A data-parallel collective's wait (from FSDP2's or DDP's hooks): inside a step the
        filler's, with the room this collective took to complete last step."""
        work = self._work
        if work is None:
            for w in works:
                w.wait()
            return
        i = len(self._dp_seen)
        room = self._dp_last[i] if i < len(self._dp_last) else 0.0
        self._dp_seen.append(work.filler.wait_collective(works, room))

    # -- measuring -----------------------------------------------------------------------------
    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _profile(self, example: tuple[torch.Tensor, ...], repeats: int = 3) -> MeasuredCosts:
        """The pieces' durations on one microbatch and the p2p latency, shared by every rank; the
        LLM ops' durations come from the first step."""
        n = len(self.pieces)
        fwd, bwd = [[] for _ in range(n)], [[] for _ in range(n)]
        for _ in range(repeats):
            run = MicrobatchRun(self.pieces, example)
            for i in range(n):
                t = self._now()
                run.forward_piece(i)
                fwd[i].append(self._now() - t)
            run.output_grad = torch.ones_like(run.output())
            for i in range(n - 1, -1, -1):
                t = self._now()
                run.backward_piece(i)
                bwd[i].append(self._now() - t)
        self.encoder.zero_grad(set_to_none=True)
        p2p = 0.0
        if self.ranks > 1 and self.rank < 2:
            buf = torch.zeros(self.output_shape, dtype=self.output_dtype)
            for rep in range(6):
                t = time.perf_counter()
                if self.rank == 0:
                    dist.send(buf, group=self.group, group_dst=1, tag=TAG_BASE - 1)
                    dist.recv(buf, group=self.group, group_src=1, tag=TAG_BASE - 1)
                else:
                    dist.recv(buf, group=self.group, group_src=0, tag=TAG_BASE - 1)
                    dist.send(buf, group=self.group, group_dst=0, tag=TAG_BASE - 1)
                if rep:  # the first is a warm-up
                    p2p += (time.perf_counter() - t) / 10
        mine = torch.tensor([p2p, *(min(x) for x in fwd), *(min(x) for x in bwd)], dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(self.ranks)]
        dist.all_gather(every, mine, group=self.group)
        a = torch.stack(every).numpy()
        stages = self.num_stages
        return MeasuredCosts(stage_fwd_s=[1e-6] * stages, stage_bwd_s=[1e-6] * stages,  # from the first step
                             p2p_s=float(a[:, 0].max()), piece_fwd_s=a[:, 1:1 + n].mean(axis=0).tolist(),
                             piece_bwd_s=a[:, 1 + n:].mean(axis=0).tolist())

    def _sample(self, work: EncoderStep, sync_s: float, plan_s: float, tp: TPWaitStats) -> np.ndarray:
        f = work.filler
        ops = f.next_ops
        n = len(self.pieces)
        fwd_t = [[t.took_s for t in ts] for ts in work.fwd_tasks.values()]
        bwd_t = [[t.took_s for t in ts] for ts in work.bwd_tasks.values()]
        timed = self.side is None  # on CUDA a task's launch is not its duration: the profile's stay
        piece_fwd = [statistics.mean(ts[i] for ts in fwd_t) if fwd_t and timed else float("nan") for i in range(n)]
        piece_bwd = [statistics.mean(ts[i] for ts in bwd_t) if bwd_t and timed else float("nan") for i in range(n)]
        stage_fwd, stage_bwd, stage_wgrad = stage_figures(ops, f.op_stages, f.op_busy_s, self.num_stages)
        return step_sample(stage_fwd=stage_fwd, stage_bwd=stage_bwd, stage_wgrad=stage_wgrad, lead=f.lead_busy_s,
                           sync=sync_s if self.mode != "megatron" else float("nan"), outside=float("nan"),
                           plan=plan_s, piece_fwd=piece_fwd, piece_bwd=piece_bwd,
                           **dict(zip(("tp_count", "tp_gap", "tp_wait"), tp_op_figures(tp))))

    def _share_costs(self, entry: float) -> None:
        """All ranks' figures of the last step (with the trainer's time since then) into the
        history; on CUDA the CPU's clock does not time the GPU's work, so the costs stay those of
        the profiling step."""
        sample = self._last_sample.copy()
        sample[FIELDS.index("outside")] = entry - self._returned  # the trainer's own time between the two steps
        mine = torch.from_numpy(sample)
        every = [torch.zeros_like(mine) for _ in range(self.ranks)]
        with record_function("pybubble:sync"):
            dist.all_gather(every, mine, group=self.group)
        if self.device.type == "cpu" or self.steps == 1:
            with record_function("pybubble:plan"):
                self.history.add(torch.stack(every).numpy())
                self.costs = self.history.costs()

    # -- the step ------------------------------------------------------------------------------
    def encoder_output(self, microbatch: int) -> torch.Tensor:
        """On the first stage: the encoder output feeding LLM ``microbatch`` of the running step."""
        if self._work is None:
            raise RuntimeError("encoder_output: called outside EncoderRuntime.step")
        return self._work.output(microbatch)

    def step(self, encoder_input: torch.Tensor | Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        """One training step: ``encoder_input`` is the whole batch's encoder input (split into the
        schedule's microbatches along dim 0, on every rank); ``args``/``kwargs`` go to
        ``schedule.step`` (the first stage's inputs, ``target=`` on the last stage). Returns what
        ``schedule.step`` returns; the encoder's gradients are summed over the ranks when it
        returns."""
        entry = time.perf_counter()
        if self._last_sample is not None:
            self._share_costs(entry)
        t = time.perf_counter()
        mode = self.mode if self.steps > 0 or self.mode == "megatron" else "coarse"
        with record_function("pybubble:plan"):
            plan = self.placement = make_placement(mode, self.costs, self.microbatches, self.table)
            predicted = placement_step_s(plan, self.costs)
        plan_s = time.perf_counter() - t
        with record_function("pybubble:sync"):
            dist.barrier(group=self.group)
        start = time.perf_counter()
        with record_function("pybubble:setup"):
            m, inputs = self.microbatches, _inputs_of(encoder_input)
            chunks = [torch.tensor_split(x.to(self.device), m) for x in inputs]
            boundary = BoundaryCommunicator(group=self.group, rank=self.rank, first_stage_rank=plan.first_stage,
                                            producer=plan.producer, assignment=plan.assignment,
                                            output_shape=self.output_shape, dtype=self.output_dtype,
                                            device=self.device)
            boundary.begin_step()
            work = self._work = EncoderStep(plan=plan, rank=self.rank, pieces=self.pieces, costs=self.costs,
                                            boundary=boundary, inputs=lambda k: tuple(c[k] for c in chunks),
                                            side=self.side)
        filler = work.filler
        if self.device.type == "cuda" and self.steps == 0:
            filler.op_clock = self._now  # the profiling step times the GPU's ops
        if self.trace:
            filler.trace = []
        self._dp_seen = []
        try:
            with record_function("pybubble:front"):
                filler.run_front()
            filler.begin_step(frame0=start)
            tp = TensorParallelWaits(filler, self.costs.tp_gap_s, self.costs.tp_op_wait_s)
            with fill_pipeline_waits(filler, self.stages), fill_tp_waits(tp), record_function("pybubble:schedule"):
                result = self.schedule.step(*args, **kwargs)
            filler.end_pipeline()
            with record_function("pybubble:drain"):
                filler.drain()
            tp.finish()
            boundary.end_step()
        finally:
            self._work = None
            if filler.side is None and sys.exc_info()[0] is not None:
                with contextlib.suppress(Exception):  # a failed step leaves nothing running on the worker
                    filler.settle()
        self._dp_last = self._dp_seen
        t = self._now()
        spread = mode != "megatron" and self.ranks > 1  # the encoder's microbatches ran on several pp ranks
        holds = mode != "megatron" or self.rank == plan.first_stage  # megatron: on the first stage's rank only
        if spread or (holds and self.dp_group is not None):
            with record_function("pybubble:grad_sync"):
                sync_grads(self.encoder, self.pp_group if spread else None, self.dp_group if holds else None)
        sync_s = self._now() - t
        with record_function("pybubble:setup"):
            self._last_sample = self._sample(work, sync_s, plan_s, tp.stats)
        stats = filler.stats
        record = {"predicted_s": predicted, "start": start, "plan_s": plan_s, "sync_s": sync_s,
                  "filler": dataclasses.asdict(stats),
                  "waits": {"pp": {"waited_s": stats.waited_s, "filled_s": stats.filled_s},
                            "dp": {"waited_s": stats.dp_waited_s, "filled_s": stats.dp_filled_s}
                            if self.data_parallel else None,
                            "tp": {"waited_s": tp.stats.waited_s, "filled_s": tp.stats.filled_s}
                            if tp.stats.waits else None},
                  "tp": dataclasses.asdict(tp.stats)}
        if self.trace:
            record["trace"] = filler.trace
        self.records.append(record)
        self.steps += 1
        self._returned = time.perf_counter()
        return result

