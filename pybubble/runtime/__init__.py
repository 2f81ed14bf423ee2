"""pybubble's runtime: runs the encoder's kernel-level tasks inside the bubbles of a real
torch.distributed pipeline (with :mod:`pybubble.testing`'s trainer, the only part of pybubble that
imports torch; its planning, :mod:`pybubble.placement`, does not).

A trainer adopts :class:`EncoderRuntime` under torchrun (or :func:`launch` to start its ranks on
one machine); the other names are its parts, for those who build their own loop."""

from __future__ import annotations

from ..placement.measured import CostHistory, MeasuredCosts, StepSample
from ..placement.plan import PlannedOp, PlannedTask, RankPlan, rank_plan
from ..placement.records import FillerStats, StepRecord, TPWaitStats, consumer_delays
from ..placement.slots import SlotLayout
from ..placement.step_placement import PLACEMENTS, Placement, make_placement, predict_step_s
from .batch import EncoderBatch
from .boundary import BoundaryCommunicator
from .cuda import SideStream, llm_stream, side_stream
from .data_parallel import observe_data_parallel
from .encoder_runtime import EncoderRuntime
from .encoder_step import EncoderStep
from .executors import CudaExecutor, Executor, HostExecutor
from .grad_sync import sync_grads
from .filler import BubbleFiller
from .idle_worker import IdleWorker, shared_idle_worker
from .launcher import exit_rank, init_distributed, launch, run_rank
from .options import BalanceOptions, PieceOptions, RuntimeOptions, TrainerGroups
from .parallel_groups import ParallelGroups, resolve_groups
from .pipelining import fill_pipeline_waits, schedule_microbatches, schedule_table
from .probe import WorkProbe
from .reporting import gather_figures, gather_report, report_of
from .progress import StepProgress
from .segments import MicrobatchRun, Piece, split_into_pieces
from .task import FillTask
from .tensor_parallel import fill_tp_waits
from .torch_seams import TESTED_TORCH, check_torch_seams
from .waits import DataParallelWaits, PipelineWaits, TensorParallelWaits

__all__ = ["BalanceOptions", "BoundaryCommunicator", "BubbleFiller", "CostHistory", "CudaExecutor", "DataParallelWaits", "EncoderBatch",
           "EncoderRuntime", "EncoderStep", "Executor", "FillTask", "FillerStats", "HostExecutor", "IdleWorker", "MeasuredCosts",
           "MicrobatchRun", "PLACEMENTS", "ParallelGroups", "Piece", "PieceOptions", "PipelineWaits", "Placement", "PlannedOp",
           "PlannedTask", "RankPlan", "RuntimeOptions", "SideStream", "SlotLayout", "StepProgress", "StepRecord", "StepSample", "TESTED_TORCH",
           "TPWaitStats", "TensorParallelWaits", "TrainerGroups", "WorkProbe", "check_torch_seams", "consumer_delays", "exit_rank",
           "fill_pipeline_waits", "fill_tp_waits", "gather_figures", "gather_report", "init_distributed", "launch", "llm_stream", "make_placement",
           "observe_data_parallel", "predict_step_s", "rank_plan", "report_of", "resolve_groups", "run_rank",
           "schedule_microbatches", "schedule_table", "shared_idle_worker", "side_stream", "split_into_pieces",
           "sync_grads"]
