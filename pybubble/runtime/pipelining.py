"""Adapter: plugs a :class:`BubbleFiller` into torch.distributed.pipelining's schedules.

The schedules wait on point-to-point work through the module-level ``_wait_batch_p2p`` of
``torch.distributed.pipelining.schedules``; while :func:`fill_pipeline_waits` is active that
function is replaced by one that lets the filler run planned tasks before the work completes, and
the stage's ``forward_one_chunk``/``backward_one_chunk`` mark the filler's op boundaries. The
user's schedule object is not changed. These are private torch names, so only the versions in
``SUPPORTED_TORCH`` are accepted.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch.distributed.pipelining import schedules as _schedules
from torch.profiler import record_function

from .filler import BubbleFiller

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


@contextlib.contextmanager
def fill_pipeline_waits(filler: BubbleFiller, stage) -> Iterator[BubbleFiller]:
    """While active, the pipelining schedules' waits on p2p work run ``filler``'s tasks, and the
    ops of ``stage`` (a ``PipelineStage``) mark its op boundaries."""
    check_torch_version()
    if not hasattr(_schedules, "_wait_batch_p2p"):
        raise RuntimeError("torch.distributed.pipelining.schedules has no _wait_batch_p2p to hook")
    original_wait = _schedules._wait_batch_p2p
    names = ("forward_one_chunk", "backward_one_chunk")
    original_ops = {name: getattr(stage, name) for name in names}
    own = {name: stage.__dict__[name] for name in names if name in stage.__dict__}

    stage_index = getattr(stage, "stage_index", 0)

    def marked(fn):
        @functools.wraps(fn)
        def op(*args, **kwargs):
            kind, mb = filler.next_op or ("?", -1)
            filler.op_begin()
            try:
                # Named as torch's own pipeline runtime names its actions in profiles.
                with record_function(f"PP:{stage_index}{kind}{mb}"):
                    return fn(*args, **kwargs)
            finally:
                filler.op_end()
        return op

    _schedules._wait_batch_p2p = filler.wait
    for name, fn in original_ops.items():
        setattr(stage, name, marked(fn))
    try:
        yield filler
    finally:
        _schedules._wait_batch_p2p = original_wait
        for name in names:
            if name in own:
                setattr(stage, name, own[name])
            else:
                delattr(stage, name)  # back to the class's method
