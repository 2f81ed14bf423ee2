"""pybubble's own test and benchmark trainer: a small multimodal LLM (a ViT, timm's or CLIP's
vision tower, and a GPT) trained with a pipeline over CPU ranks (gloo) or GPUs (NCCL), its encoder
run by :class:`~pybubble.runtime.EncoderRuntime` in each mode, with everything the tests check it
by: every schedule, FSDP2/DDP, tensor parallelism, fixed and varying data, injected faults, the
single-process reference, torch.profiler traces, plans and planning configs. Not an example to copy
(``examples/mllm.py`` is one): the tests and ``bench/`` drive it by its command line,

    python -m pybubble.testing.mllm --ranks 2 --steps 8 --mode megatron,coarse,pybubble --report r.json
    python -m pybubble.testing.mllm --runs RUNS.json        # several configurations, one launch

or by :func:`parse_args`, :func:`check_args` and :func:`run` (one launch, the report back).

Modules: :mod:`~pybubble.testing.mllm.model` (the model), :mod:`~pybubble.testing.mllm.inputs`
(the data, the losses), :mod:`~pybubble.testing.mllm.job` (the options), :mod:`~pybubble.testing.mllm.trainer`
(the ranks' training), :mod:`~pybubble.testing.mllm.faults`, :mod:`~pybubble.testing.mllm.unsplit`
(the single-process reference), :mod:`~pybubble.testing.mllm.launch` (one or several launches, the report)."""

from __future__ import annotations

from ...placement.step_placement import PLACEMENTS
from .job import TORCH_SCHEDULES, backend, check_args, chunks_of, parse_args
from .launch import finish, launch_job, main, main_runs, report, write_report
from .model import ENCODER_KINDS, FirstStage, ViTBlock, import_vision_libraries
from .trainer import train

__all__ = ["ENCODER_KINDS", "FirstStage", "PLACEMENTS", "TORCH_SCHEDULES", "ViTBlock", "backend", "check_args", "chunks_of",
           "finish", "import_vision_libraries", "main", "main_runs", "parse_args", "report", "launch_job", "train",
           "write_report"]
