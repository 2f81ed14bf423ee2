"""pybubble's runtime: runs the encoder's kernel-level tasks inside the bubbles of a real
torch.distributed pipeline (the only part of pybubble that imports torch).

A trainer adopts :class:`EncoderRuntime` under torchrun (or :func:`launch` to start its ranks on
one machine); the other names are its parts, for those who build their own loop. The names are
imported when first used, so that the plan's modules (:mod:`pybubble.runtime.plan`,
:mod:`pybubble.runtime.placement`) load without torch."""

from __future__ import annotations

import importlib

_WHERE = {
    "EncoderBatch": "batch", "BoundaryCommunicator": "boundary", "CostHistory": "costs", "StepSample": "costs",
    "SideStream": "cuda", "llm_stream": "cuda", "side_stream": "cuda",
    "observe_data_parallel": "data_parallel", "EncoderRuntime": "encoder_runtime", "sync_grads": "encoder_runtime",
    "EncoderStep": "encoder_step", "HostExecutor": "executors", "CudaExecutor": "executors",
    "BubbleFiller": "filler", "FillTask": "task", "WorkProbe": "probe",
    "exit_rank": "launcher", "init_distributed": "launcher", "launch": "launcher", "run_rank": "launcher",
    "TESTED_TORCH": "torch_seams", "check_torch_seams": "torch_seams", "fill_pipeline_waits": "pipelining",
    "schedule_microbatches": "pipelining", "schedule_table": "pipelining",
    "PLACEMENTS": "placement", "MeasuredCosts": "placement", "Placement": "placement", "make_placement": "placement",
    "predict_step_s": "placement", "rank_plan": "placement",
    "PlannedOp": "plan", "PlannedTask": "plan", "RankPlan": "plan",
    "ParallelGroups": "parallel_groups", "resolve_groups": "parallel_groups",
    "StepProgress": "progress", "FillerStats": "records", "StepRecord": "records", "TPWaitStats": "records",
    "consumer_delays": "records",
    "MicrobatchRun": "segments", "Piece": "segments", "split_into_pieces": "segments",
    "IdleWorker": "idle_worker", "shared_idle_worker": "idle_worker",
    "fill_tp_waits": "tensor_parallel",
    "DataParallelWaits": "waits", "PipelineWaits": "waits", "TensorParallelWaits": "waits",
}

__all__ = ["BoundaryCommunicator", "EncoderBatch", "BubbleFiller", "CostHistory", "CudaExecutor", "DataParallelWaits",
    "EncoderRuntime", "EncoderStep", "FillTask", "FillerStats", "HostExecutor", "IdleWorker", "MeasuredCosts",
    "MicrobatchRun", "PLACEMENTS", "ParallelGroups", "Piece", "PipelineWaits", "Placement", "PlannedOp",
    "PlannedTask", "RankPlan", "TESTED_TORCH", "SideStream", "StepProgress", "StepRecord", "StepSample",
    "TPWaitStats", "TensorParallelWaits", "WorkProbe", "check_torch_seams", "consumer_delays", "exit_rank",
    "fill_pipeline_waits", "fill_tp_waits", "init_distributed", "launch", "llm_stream", "make_placement",
    "observe_data_parallel", "predict_step_s", "rank_plan", "resolve_groups", "run_rank", "schedule_microbatches",
    "schedule_table", "shared_idle_worker", "side_stream", "split_into_pieces", "sync_grads"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'pybubble.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
