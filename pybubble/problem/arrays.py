"""The typed containers of a bubble-filling problem's arrays: the encoder's tasks (:class:`Tasks`)
and the whole problem (:class:`ProblemArrays`: horizon, the lanes' free windows, the LLM
microbatches' dependency points, the tasks). The core takes a problem in exactly this form and
gives it back in it; every module that builds or reads a problem's arrays uses these, so a field
has one name everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config.checks import integer, number, one_of, required
from ..costs.kernels import PHASES, RESOURCES
from ..llm.timeline import Windows

TASK_FIELDS = ("lane", "microbatch", "duration", "resource", "phase", "after_offset", "after")
"""The fields of :class:`Tasks`, in order."""


@dataclass(kw_only=True, slots=True, eq=False)
class Tasks:
    """The encoder's kernel tasks as flat arrays (task i is the i-th entry of each; its
    predecessors are ``after[after_offset[i]:after_offset[i + 1]]``)."""

    lane: np.ndarray
    """int64: the lane each task runs on."""
    microbatch: np.ndarray
    """int64: the encoder microbatch each task belongs to."""
    duration: np.ndarray
    """float64: each task's duration (us)."""
    resource: np.ndarray
    """int64: index in ``RESOURCES`` (0 compute, 1 comm)."""
    phase: np.ndarray
    """int64: index in ``PHASES`` (0 fwd, 1 bwd)."""
    after_offset: np.ndarray
    """int64, one more than the tasks: where each task's predecessors begin in ``after``."""
    after: np.ndarray
    """int64: predecessor ids."""

    def __len__(self) -> int:
        return len(self.duration)

    @classmethod
    def empty(cls) -> "Tasks":
        """No task."""
        none = np.zeros(0, np.int64)
        return cls(lane=none, microbatch=none, duration=np.zeros(0), resource=none, phase=none,
                   after_offset=np.zeros(1, np.int64), after=none)

    @classmethod
    def from_dicts(cls, tasks: Sequence[Any], *, id_required: bool = True) -> "Tasks":
        """The tasks of ``pybubble.problem/1`` task dicts ("lane", "microbatch", "duration",
        "resource", "phase", "after", and "id" equal to the index), checked field by field.

        With ``id_required=False`` the "id" may be left out. ValueError naming the field, e.g.
        ``tasks[3].after[0]: 'x' is not an integer``; ranges and order are checked by the core.
        """
        n = len(tasks)
        lane = np.empty(n, np.int64)
        mb = np.empty(n, np.int64)
        dur = np.empty(n, np.float64)
        res = np.empty(n, np.int64)
        ph = np.empty(n, np.int64)
        after_offset = np.zeros(n + 1, np.int64)
        after: list[int] = []
        for i, t in enumerate(tasks):
            where = f"tasks[{i}]"
            if id_required or (isinstance(t, Mapping) and "id" in t):
                tid = integer(required(t, "id", where), where + ".id")
                if tid != i:
                    raise ValueError(f"{where}.id: {tid} is not its index {i}")
            lane[i] = integer(required(t, "lane", where), where + ".lane")
            mb[i] = integer(required(t, "microbatch", where), where + ".microbatch")
            dur[i] = number(required(t, "duration", where), where + ".duration")
            res[i] = RESOURCES.index(one_of(required(t, "resource", where), RESOURCES, where + ".resource"))
            ph[i] = PHASES.index(one_of(required(t, "phase", where), PHASES, where + ".phase"))
            preds = required(t, "after", where)
            if isinstance(preds, (str, bytes, Mapping)) or not isinstance(preds, (Sequence, np.ndarray)):
                raise ValueError(f"{where}.after: expected a list, got {type(preds).__name__}")
            for q, p in enumerate(preds):
                after.append(integer(p, f"{where}.after[{q}]"))
            after_offset[i + 1] = len(after)
        return cls(lane=lane, microbatch=mb, duration=dur, resource=res, phase=ph, after_offset=after_offset,
                   after=np.array(after, np.int64))

    @classmethod
    def coerce(cls, tasks: "Tasks | Sequence[Mapping[str, Any]]") -> "Tasks":
        """`tasks` as :class:`Tasks`: given as such, or as a list of task dicts without "id"."""
        if isinstance(tasks, Tasks):
            return tasks
        if isinstance(tasks, (str, bytes, Mapping)) or not isinstance(tasks, Sequence):
            raise ValueError(f"tasks: expected Tasks or a list of task dicts, got {type(tasks).__name__}")
        return cls.from_dicts(tasks, id_required=False)

    def to_dicts(self) -> list[dict[str, Any]]:
        """The tasks as ``pybubble.problem/1`` task dicts without "id" (the list index is the id)."""
        ao, af = self.after_offset.tolist(), self.after.tolist()
        return [{"lane": lane, "duration": d, "resource": RESOURCES[r], "phase": PHASES[p], "microbatch": j,
                 "after": af[ao[i]:ao[i + 1]]}
                for i, (lane, d, r, p, j) in enumerate(zip(self.lane.tolist(), self.duration.tolist(),
                                                            self.resource.tolist(), self.phase.tolist(),
                                                            self.microbatch.tolist()))]

    def predecessors(self) -> list[list[int]]:
        """The ``after`` list of every task."""
        ao, af = self.after_offset.tolist(), self.after.tolist()
        return [af[ao[t]:ao[t + 1]] for t in range(len(self))]


@dataclass(kw_only=True, slots=True, eq=False)
class ProblemArrays:
    """A whole ``pybubble.problem/1`` as arrays: what :class:`pybubble.problem.problem.Problem`
    hands the core and reads back from it."""

    horizon: float
    """The LLM-only step time (us)."""
    compute_free: Windows
    """Per lane, the windows where the LLM leaves the compute units idle."""
    link_free: Windows
    """Per lane, the windows where the LLM leaves the network idle."""
    forward_needed: np.ndarray
    """float64: F_k per LLM microbatch k."""
    grad_ready: np.ndarray
    """float64: B_k per LLM microbatch k."""
    tasks: Tasks
    """The encoder's tasks."""

    @property
    def num_lanes(self) -> int:
        """Number of lanes."""
        return self.compute_free.lanes

    @classmethod
    def from_core(cls, d: Mapping[str, Any]) -> "ProblemArrays":
        """The nested dict the core's ``Problem.arrays()`` returns, as containers."""
        return cls(horizon=float(d["horizon"]), compute_free=Windows(**d["compute_free"]),
                   link_free=Windows(**d["link_free"]), forward_needed=d["forward_needed"],
                   grad_ready=d["grad_ready"], tasks=Tasks(**d["tasks"]))


__all__ = ["TASK_FIELDS", "ProblemArrays", "Tasks"]
