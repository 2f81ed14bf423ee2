"""Adapter: plugs a :class:`BubbleFiller` into torch.distributed.pipelining's schedules.

The schedules, single-stage (``Schedule1F1B``, ``ScheduleGPipe``) and multi-stage
(``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``,
``ScheduleDualPipeV``: ``_PipelineScheduleRuntime._step_microbatches``), wait on point-to-point
work through the module-level ``_wait_batch_p2p`` of ``torch.distributed.pipelining.schedules``;
while :func:`fill_pipeline_waits` is active that function is replaced by one that lets the filler
run planned tasks before the work completes, and the stages' ``forward_one_chunk``,
``backward_one_chunk`` (a full backward ``B`` or, with ``full_backward=False``, the input-gradient
``I``) and ``backward_weight_one_chunk`` (``W``) mark the filler's op boundaries. The user's
schedule object is not changed. :func:`schedule_table` reads the schedule's own action table
(``pipeline_order``), which the runtime simulates and the filler follows. These are private torch
names, so only the versions in ``SUPPORTED_TORCH`` are accepted.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.pipelining import schedules as _schedules
from torch.profiler import record_function

from ..llm.tables import ACTION_KINDS, Action, Table, gpipe, one_f_one_b
from ..measure import names as trace_names
from .waits import PipelineWaits

SUPPORTED_TORCH = ("2.13",)
"""torch major.minor versions whose private pipelining hooks this adapter was checked against."""


def check_torch_version(version: str | None = None) -> None:
    """Raises ``RuntimeError`` unless ``version`` (default: the installed torch) is supported."""
    version = torch.__version__ if version is None else version
    major_minor = ".".join(version.split("+")[0].split(".")[:2])
    if major_minor not in SUPPORTED_TORCH:
        raise RuntimeError(
            f"torch {version} is not supported by pybubble.runtime's pipelining adapter "
            f"(it hooks private torch.distributed.pipelining functions; supported: "
            f"{', '.join(SUPPORTED_TORCH)})")


def schedule_microbatches(schedule) -> int:
    """The microbatches per step of a ``torch.distributed.pipelining`` schedule: the count it was
    built with. torch keeps it in a private attribute (``_n_microbatches``; no public accessor in
    the supported versions): this is the one place that reads it (a trainer may pass
    ``microbatches=`` to :class:`~pybubble.runtime.EncoderRuntime` instead)."""
    n = getattr(schedule, "_n_microbatches", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"schedule: {type(schedule).__name__} has no microbatch count (_n_microbatches = {n!r}); "
                         "pass microbatches=")
    return n


def schedule_table(schedule: Any) -> Table:
    """The compute actions of a torch schedule's action table, as pybubble's
    :data:`~pybubble.llm.tables.Table` (``{rank: [Action]}``, in each rank's order of execution).

    Multi-stage schedules run their own table (``pipeline_order``): it is read as it is
    (``OVERLAP_F_B`` actions unfolded into their sub-actions; communication, gradient-reduce and
    idle steps left out). ``Schedule1F1B`` and ``ScheduleGPipe`` run their own loop, not their
    ``pipeline_order`` (torch 2.13's 1F1B table numbers the last rank's microbatches from 1): the
    tables of that loop are pybubble's :func:`~pybubble.llm.tables.one_f_one_b` and
    :func:`~pybubble.llm.tables.gpipe`. ValueError for a schedule with neither."""
    single = {"Schedule1F1B": one_f_one_b, "ScheduleGPipe": gpipe}
    for cls in type(schedule).__mro__:
        if cls.__module__ == _schedules.__name__ and cls.__name__ in single:
            return single[cls.__name__](schedule._num_stages, schedule_microbatches(schedule))
    order = getattr(schedule, "pipeline_order", None)
    if not order:
        raise ValueError(f"schedule: {type(schedule).__name__} has no pipeline_order (action table)")

    def unfold(action) -> list[Action]:
        if action is None:
            return []
        if action.sub_actions is not None:
            return [a for sub in action.sub_actions for a in unfold(sub)]
        kind = getattr(action.computation_type, "value", str(action.computation_type))
        if kind not in ACTION_KINDS:
            return []
        return [Action(int(action.stage_index), kind, int(action.microbatch_index))]

    return {int(r): [a for action in order[r] for a in unfold(action)] for r in sorted(order)}


@contextlib.contextmanager
def fill_pipeline_waits(waits: PipelineWaits, stage: Any) -> Iterator[PipelineWaits]:
    """While active, the pipelining schedules' waits on p2p work go to ``waits`` (its filler runs
    tasks in them), and the ops of ``stage`` (a ``PipelineStage``, or this rank's stages of a
    multi-stage schedule) mark the filler's op boundaries. An op that is not the one the filler expects next (its table's order)
    raises ``RuntimeError``: the plan would not describe the step."""
    check_torch_version()
    if not hasattr(_schedules, "_wait_batch_p2p"):
        raise RuntimeError("torch.distributed.pipelining.schedules has no _wait_batch_p2p to hook")
    stages = list(stage) if isinstance(stage, (list, tuple)) else [stage]
    original_wait = _schedules._wait_batch_p2p
    names = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
    saved = []
    for st in stages:
        present = [name for name in names if hasattr(st, name)]
        saved.append((st, present, {name: st.__dict__[name] for name in present if name in st.__dict__}))

    def marked(fn, name: str, stage_index: int):
        @functools.wraps(fn)
        def op(chunk_id, *args, **kwargs):
            if name == "forward_one_chunk":
                kind = "F"
            elif name == "backward_one_chunk":
                kind = "B" if kwargs.get("full_backward", args[1] if len(args) > 1 else True) else "I"
            else:
                kind = "W"
            expected = progress.next_op
            if expected is not None and expected.key != (kind, int(chunk_id)):
                raise RuntimeError(f"stage {stage_index} ran {kind}{chunk_id} where its action table has "
                                   f"{expected.action.kind}{expected.action.microbatch} next")
            progress.op_begin()
            try:
                # Named as torch's own pipeline runtime names its actions in profiles.
                with record_function(trace_names.op_name(stage_index, kind, int(chunk_id))):
                    return fn(chunk_id, *args, **kwargs)
            finally:
                progress.op_end()
        return op

    progress = waits.filler.progress
    _schedules._wait_batch_p2p = waits.wait
    for st, present, _ in saved:
        for name in present:
            setattr(st, name, marked(getattr(st, name), name, getattr(st, "stage_index", 0)))
    try:
        yield waits
    finally:
        _schedules._wait_batch_p2p = original_wait
        for st, present, own in saved:
            for name in present:
                if name in own:
                    setattr(st, name, own[name])
                else:
                    delattr(st, name)  # back to the class's method
