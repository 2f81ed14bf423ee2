"""pybubble's runtime: runs the encoder's kernel-level tasks inside the bubbles of a real
torch.distributed pipeline (the only part of pybubble that imports torch).

A trainer adopts :class:`EncoderRuntime` under torchrun (or :func:`launch` to start its ranks on
one machine); the other names are its parts, for those who build their own loop."""

from .boundary import BoundaryCommunicator
from .costs import CostHistory
from .cuda import SideStream, llm_stream, side_stream
from .data_parallel import observe_data_parallel
from .encoder_runtime import EncoderRuntime, sync_grads
from .encoder_step import EncoderStep
from .filler import BubbleFiller, FillTask, WorkProbe
from .launcher import exit_rank, init_distributed, launch, run_rank
from .pipelining import fill_pipeline_waits, schedule_microbatches, schedule_table
from .placement import PLACEMENTS, MeasuredCosts, Placement, make_placement, predict_step_s
from .segments import MicrobatchRun, Piece, split_into_pieces
from .idle_worker import IdleWorker, shared_idle_worker
from .tensor_parallel import TensorParallelWaits, TPWaitStats, consumer_delays, fill_tp_waits
from .torch_seams import TESTED_TORCH, check_torch_seams

__all__ = [
    "BoundaryCommunicator", "BubbleFiller", "CostHistory", "EncoderRuntime", "EncoderStep", "FillTask", "PLACEMENTS",
    "MeasuredCosts", "MicrobatchRun", "Piece", "Placement", "SideStream", "TESTED_TORCH", "WorkProbe",
    "check_torch_seams", "exit_rank", "fill_pipeline_waits", "init_distributed", "launch", "llm_stream",
    "make_placement", "observe_data_parallel", "predict_step_s", "run_rank", "schedule_microbatches", "schedule_table",
    "side_stream",
    "split_into_pieces", "sync_grads", "TensorParallelWaits", "TPWaitStats", "consumer_delays", "fill_tp_waits",
    "IdleWorker", "shared_idle_worker",
]
