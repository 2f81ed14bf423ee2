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
(``pipeline_order``), which the runtime simulates and the filler follows. The private torch
names among these are reached through :mod:`pybubble.runtime.torch_seams`, which checks them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from torch.profiler import record_function

from ..llm.tables import ACTION_KINDS, Action, Table, gpipe, one_f_one_b
from ..measure import names as trace_names
from . import torch_seams
from .waits import PipelineWaits

def schedule_microbatches(schedule) -> int:
    """The microbatches per step of a ``torch.distributed.pipelining`` schedule: the count it was
    built with. torch keeps it in a private attribute (``_n_microbatches``, read through
    :func:`~pybubble.runtime.torch_seams.microbatch_count`; no public accessor in the tested
    versions; a trainer may pass ``microbatches=`` to :class:`~pybubble.runtime.EncoderRuntime`
    instead)."""
    n = torch_seams.microbatch_count(schedule)
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
        if torch_seams.is_torch_schedule_class(cls) and cls.__name__ in single:
            return single[cls.__name__](torch_seams.stage_count(schedule), schedule_microbatches(schedule))
    order = torch_seams.pipeline_order(schedule)
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
    stages = list(stage) if isinstance(stage, (list, tuple)) else [stage]
    original_wait = torch_seams.p2p_wait()
    names = torch_seams.stage_op_names()
    saved = []
    for st in stages:
        present = [name for name in names if hasattr(st, name)]
        saved.append((st, present, {name: st.__dict__[name] for name in present if name in st.__dict__}))

    def marked(fn, name: str, stage_index: int):
        @functools.wraps(fn)
        def op(chunk_id, *args, **kwargs):
            if name == names[0]:
                kind = "F"
            elif name == names[1]:
                kind = "B" if torch_seams.is_full_backward(args, kwargs) else "I"
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
    torch_seams.set_p2p_wait(waits.wait)
    for st, present, _ in saved:
        for name in present:
            setattr(st, name, marked(getattr(st, name), name, getattr(st, "stage_index", 0)))
    try:
        yield waits
    finally:
        torch_seams.set_p2p_wait(original_wait)
        for st, present, own in saved:
            for name in present:
                if name in own:
                    setattr(st, name, own[name])
                else:
                    delattr(st, name)  # back to the class's method
