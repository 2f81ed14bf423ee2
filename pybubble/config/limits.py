"""The largest inputs pybubble accepts, in one place: what a file may hold, how large a config's
numbers may be, and (from the core, which sets them: ``_core.LIMITS``) how large a table or a
problem may grow before Python builds it. Each is chosen so that anything within it fits in memory with room on a machine of a
few GB and is read in seconds; anything beyond is refused with an error that names the field and
the limit (docs/formats.md lists them).
"""

from __future__ import annotations

from .. import _core

MAX_DOCUMENT_BYTES = 128 * 2**20
"""Largest JSON or YAML file read (128 MiB: a problem of about a million tasks). Parsing takes about
16 times a file's size in memory, so a file at the limit needs about 2 GB."""
MAX_NESTING = 64
"""Deepest nesting of lists and mappings in a document (pybubble's own documents nest 5 deep)."""
MAX_YAML_ALIASES = 256
"""Most YAML aliases (``*name``) in a config: an alias repeats a whole subtree, so a few nested
ones can stand for billions of values (the "billion laughs")."""

MAX_GPUS = 1_000_000
"""Largest cluster (``cluster.gpus``)."""
MAX_MODEL_DIM = 10_000_000
"""Largest width, head count or MLP width of a model."""
MAX_LAYERS = 100_000
"""Most layers of one model."""
MAX_TOKENS = 100_000_000
"""Most tokens in a sequence, an image or a sample."""
MAX_VOCAB = 100_000_000
"""Largest vocabulary."""
MAX_BATCH = 100_000_000
"""Largest global batch (samples per step)."""
MAX_MICROBATCHES = 100_000
"""Most LLM microbatches per pipeline in one step (global batch / (dp x micro batch))."""
MAX_TASKS: int = _core.LIMITS["tasks"]
"""Most encoder tasks in one problem: the core's limit (``_core.LIMITS['tasks']``), checked here
before the tasks are built."""
MAX_TABLE_ACTIONS: int = _core.LIMITS["actions"]
"""Most actions in a pipeline action table (ranks x chunks x microbatches x passes): the core's
limit (``_core.LIMITS['actions']``), checked here before the table is built in Python."""


__all__ = ["MAX_BATCH", "MAX_DOCUMENT_BYTES", "MAX_GPUS", "MAX_LAYERS", "MAX_MICROBATCHES", "MAX_MODEL_DIM",
           "MAX_NESTING", "MAX_TABLE_ACTIONS", "MAX_TASKS", "MAX_TOKENS", "MAX_VOCAB", "MAX_YAML_ALIASES"]
