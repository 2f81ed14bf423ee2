"""The names pybubble's runtime gives its spans in a torch.profiler trace, and the pipeline ops'
names, written and read in this one place (the runtime formats them, ``pybubble measure`` and
``pybubble calibrate --trace`` parse them).

- ``PP:<stage><F|B|I|W><microbatch>``: a pipeline op, as torch's own pipeline runtime names its
  actions (:func:`op_name`, :data:`OP`);
- ``pybubble:task:e<j><f|b>.<piece>``: an encoder task of encoder microbatch j, forward or
  backward (:func:`task_name`, :data:`TASK`);
- ``pybubble:wait``, ``pybubble:dp_wait``, ``pybubble:tp_wait``: the LLM blocked in a wait of the
  pipeline, of a data-parallel collective, or of a tensor-parallel collective (:data:`WAIT`,
  :data:`DP_WAIT`, :data:`TP_WAIT`);
- ``pybubble:<region>``: the runtime's own regions of a step (:data:`REGIONS`).
"""

from __future__ import annotations

import re

PREFIX = "pybubble:"
WAIT = "pybubble:wait"
"""A pipeline wait (p2p), or a wait inside an op for an encoder output from another rank."""
DP_WAIT = "pybubble:dp_wait"
"""A data-parallel collective's wait (FSDP2's all-gather and reduce-scatter, DDP's all-reduce)."""
TP_WAIT = "pybubble:tp_wait"
"""A tensor-parallel collective's wait."""
REGIONS = ("plan", "sync", "setup", "front", "schedule", "drain", "grad_sync")
"""The runtime's regions of a step, in order: planning, the step's barrier and cost sharing, the
step's set-up, the encoder work before the pipeline, the pipeline's schedule, the encoder work after
it, the encoder's gradient sum."""


def region(name: str) -> str:
    """The annotation of one of the runtime's :data:`REGIONS`."""
    if name not in REGIONS:
        raise ValueError(f"region: {name!r} is not one of {', '.join(REGIONS)}")
    return PREFIX + name


def op_name(stage: int, kind: str, microbatch: int) -> str:
    """A pipeline op's annotation, e.g. ``PP:0F3``."""
    return f"PP:{stage}{kind}{microbatch}"


def task_label(chain: int, phase: str, piece: str) -> str:
    """An encoder task's label (a trace row's name), e.g. ``e3f.blocks.0.attn:bmm``: encoder
    microbatch ``chain``, ``phase`` ``fwd`` or ``bwd``, the piece's name."""
    return f"e{chain}{phase[0]}.{piece}"


def task_name(label: str) -> str:
    """An encoder task's annotation from its :func:`task_label`."""
    return f"{PREFIX}task:{label}"


OP = re.compile(r"^PP:(\d+)([FBIW])(\d+)$")
"""A pipeline op's annotation: groups stage, kind, microbatch."""
OP_OR_ROW = re.compile(r"^(?:PP:)?(\d+)([FBIW])(\d+)$")
"""A pipeline op's annotation, or its name as a row of the runtime's own trace (``0F3``)."""
TASK = re.compile(r"^pybubble:task:e(\d+)([fb])\.")
"""An encoder task's annotation: groups encoder microbatch, ``f`` or ``b``."""
PIPELINE_WAIT = re.compile(r"^pybubble:wait$")
"""The pipeline's waits."""
DP_WAIT_SPAN = re.compile(r"^pybubble:dp_wait$")
"""The data-parallel collectives' waits."""
TP_WAIT_SPAN = re.compile(r"^pybubble:tp_wait$")
"""The tensor-parallel collectives' waits."""
WAITS = re.compile(r"^pybubble:(wait|dp_wait|tp_wait)$")
"""Every wait of the LLM: the pipeline's, the data-parallel and the tensor-parallel collectives'."""
SCHEDULE_SPAN = re.compile(r"^pybubble:schedule$")
"""The span of the pipeline's schedule."""
SYNC = re.compile(r"^pybubble:(grad_sync|sync)$")
"""The runtime's own synchronisation (the step's barrier and cost sharing, the gradient sum)."""
INSIDE_OPS = re.compile(r"^pybubble:(task:|wait$|dp_wait$)")
"""What runs inside an op's span but is not the op's own time: tasks, waits for an encoder output
from another rank, and data-parallel collectives' waits (a tensor-parallel wait is part of the op)."""
REGION = re.compile(r"^pybubble:(wait|dp_wait|tp_wait|front|drain|grad_sync|sync|schedule)")
"""The runtime's regions that are not work of their own (the work inside them is)."""
