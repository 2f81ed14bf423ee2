"""The bubble-filling problem (pybubble.problem/1): lanes with free windows, LLM microbatch
dependency points, and the encoder's kernel tasks."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import _core
from ..config.checks import array, integer, number, required, shown
from ..config.documents import PathOrDict, naming, read_document, write_document
from ..costs.kernels import PHASES, RESOURCES
from ..llm.timeline import Timeline, Windows
from .arrays import ProblemArrays, Tasks

PROBLEM_FORMAT = "pybubble.problem/1"
"""The format key of a problem document."""


def _from_core(name: str, doc: str) -> property:
    """A read-only property that reads the core problem's attribute `name`."""
    return property(lambda self: getattr(self.core, name), doc=doc)


class Problem:
    """A checked problem. Build one with :func:`load_problem` (JSON), :meth:`from_arrays` or
    :meth:`on_timeline` (the encoder's tasks in a simulated LLM step's bubbles)."""

    __slots__ = ("core", "lane_names")

    def __init__(self, core: _core.Problem, lane_names: Sequence[str] | None = None):
        self.core = core
        """The core's checked problem."""
        names = list(lane_names) if lane_names is not None else [f"lane{i}" for i in range(core.num_lanes)]
        if len(names) != core.num_lanes:
            raise ValueError(f"lane_names: {len(names)} names for {core.num_lanes} lanes")
        self.lane_names = names
        """One name per lane (as in the JSON document)."""

    @classmethod
    def from_arrays(cls, arrays: ProblemArrays, lane_names: Sequence[str] | None = None) -> "Problem":
        """Builds a problem from its arrays; checked by the core (ValueError naming the field)."""
        if not isinstance(arrays, ProblemArrays):
            raise ValueError(f"arrays: {shown(arrays)} is not a ProblemArrays")
        return cls(_core.Problem(arrays), lane_names)  # the core reads the container's fields by name

    @classmethod
    def on_timeline(cls, timeline: Timeline, tasks: Tasks | Sequence[Mapping[str, Any]], lanes_per_stage: int = 1,
                    windows: tuple[Windows, Windows] | None = None,
                    lane_names: Sequence[str] | None = None, prefetch: int = 0) -> "Problem":
        """The problem of placing `tasks` into the bubbles of `timeline`: the step is the LLM frame
        (its ``horizon``), microbatch k carries (F_k, B_k), and every lane of a pipeline rank sees
        the rank's compute_free and link_free windows.

        ``tasks``: :class:`Tasks` (as ``EncoderWork.tasks`` gives them) or a list of problem/1 task
        dicts without "id" (its index is its id): "lane" (rank * lanes_per_stage + k), "duration",
        "resource" ("compute" or "comm"), "phase" ("fwd" or "bwd"), "microbatch" and "after".
        ``windows``: the (compute_free, link_free) of every lane, when the caller computed them once
        for many problems or when the lanes are not this step's ranks (then give ``lane_names``:
        e.g. an encoder on GPUs of its own, free the whole step). ``prefetch``: the first this-many LLM
        microbatches take their encoder output from the previous step (a frozen encoder's forward
        for the next step runs in this one): their ``forward_needed`` and ``grad_ready`` are the
        horizon, so the forward may run anywhere in the step (:func:`prefetched_needs`).
        ValueError naming the field.
        """
        if windows is None:
            windows = (timeline.compute_free.repeated(lanes_per_stage), timeline.link_free.repeated(lanes_per_stage))
        compute, link = windows
        names = (list(lane_names) if lane_names is not None else
                 [f"pp{r}.lane{k}" for r in range(timeline.ranks) for k in range(lanes_per_stage)])
        if compute.lanes != len(names):
            raise ValueError(f"windows: {compute.lanes} lanes, expected {len(names)}")
        forward_needed, grad_ready = prefetched_needs(timeline, prefetch)
        arrays = ProblemArrays(horizon=timeline.step_time, compute_free=compute, link_free=link,
                               forward_needed=forward_needed, grad_ready=grad_ready, tasks=Tasks.coerce(tasks))
        return cls.from_arrays(arrays, names)

    horizon = _from_core("horizon", "The LLM-only step time (us).")
    num_lanes = _from_core("num_lanes", "Number of lanes.")
    num_tasks = _from_core("num_tasks", "Number of encoder tasks.")
    num_microbatches = _from_core("num_microbatches", "Number of LLM (and encoder) microbatches.")

    def arrays(self) -> ProblemArrays:
        """The problem's arrays (a copy the caller may change)."""
        return ProblemArrays.from_core(self.core.arrays())

    def with_tasks(self, tasks: Tasks | Sequence[Mapping[str, Any]]) -> "Problem":
        """The problem of `tasks` (as :meth:`on_timeline` takes them) in this problem's bubbles: the
        same horizon, lanes, windows and microbatches, shared with it by the core (not copied or
        checked again), the tasks checked. Many problems on one step's bubbles (a search's
        candidates) are built this way at the cost of their tasks alone."""
        return Problem(self.core.with_tasks(Tasks.coerce(tasks)), self.lane_names)

    def joined(self, blocks: Sequence["Problem"], counts: Sequence[int]) -> "Problem":
        """The problem, on this problem's bubbles, of `blocks` (problems made :meth:`with_tasks` of
        these bubbles, each the tasks of one microbatch, microbatch 0) one after another, block b
        repeated ``counts[b]`` times, each copy a microbatch of its own numbered from 0: the blocks'
        tasks were checked once, and a joined problem costs copying them (a search's partitions).
        ValueError for a block on other bubbles or of another microbatch, a negative count, or more
        copies than microbatches."""
        if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Sequence) \
                or not all(isinstance(b, Problem) for b in blocks):
            raise ValueError(f"blocks: {shown(blocks)} is not a list of Problem")
        return Problem(self.core.joined([b.core for b in blocks], counts), self.lane_names)

    def with_durations(self, durations: np.ndarray) -> "Problem":
        """The same problem with new task durations (checked)."""
        a = self.arrays()
        a.tasks.duration = np.asarray(durations, dtype=np.float64)
        return Problem.from_arrays(a, self.lane_names)

    def free_windows(self) -> list[dict[str, list[tuple[float, float]]]]:
        """Per lane, its free windows by resource: ``[{"compute": [(start, end), ...], "comm":
        [...]}, ...]`` (``comm`` tasks use the ``link_free`` windows)."""
        a = self.arrays()
        return [{"compute": a.compute_free.of(lane), "comm": a.link_free.of(lane)} for lane in range(self.num_lanes)]

    def to_dict(self) -> dict[str, Any]:
        """The problem as a pybubble.problem/1 document."""
        a = self.arrays()
        lanes = [{"name": name, "compute_free": [[s, e] for s, e in wins["compute"]],
                  "link_free": [[s, e] for s, e in wins["comm"]]}
                 for name, wins in zip(self.lane_names, self.free_windows())]
        return {
            "format": PROBLEM_FORMAT,
            "horizon": float(a.horizon),
            "lanes": lanes,
            "microbatches": [{"forward_needed": float(f), "grad_ready": float(g)}
                             for f, g in zip(a.forward_needed, a.grad_ready)],
            "tasks": [{"id": i, **t} for i, t in enumerate(a.tasks.to_dicts())],
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the problem as pybubble.problem/1 JSON."""
        write_document(path, self.to_dict())

    def __repr__(self) -> str:
        return (f"Problem(horizon={self.horizon}, lanes={self.num_lanes}, "
                f"microbatches={self.num_microbatches}, tasks={self.num_tasks})")


def prefetched_needs(timeline: Timeline, prefetch: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The LLM microbatches' (forward_needed, grad_ready) when the encoder forward of the first
    `prefetch` of them runs in the step before (frozen encoders): those need nothing of this step
    before its horizon."""
    n = integer(prefetch, "prefetch", minimum=0, maximum=timeline.microbatches)
    forward_needed, grad_ready = timeline.forward_needed, timeline.grad_ready
    forward_needed[:n] = grad_ready[:n] = timeline.step_time
    return forward_needed, grad_ready


def _windows(lane: Mapping[str, Any], key: str, where: str) -> list[tuple[float, float]]:
    out = []
    for w, win in enumerate(array(required(lane, key, where), f"{where}.{key}")):
        f = f"{where}.{key}[{w}]"
        if not isinstance(win, list) or len(win) != 2:
            raise ValueError(f"{f}: {shown(win)} is not a [start, end] pair")
        out.append((number(win[0], f + "[0]"), number(win[1], f + "[1]")))
    return out


def load_problem(source: PathOrDict | Problem) -> Problem:
    """Loads and checks a pybubble.problem/1 from a JSON file path or a parsed dict.

    Raises ValueError naming the bad field and its value, e.g. ``tasks[17].after[0]: 23 is not < 17``.
    """
    if isinstance(source, Problem):
        return source
    doc = read_document(source, PROBLEM_FORMAT)
    with naming(source):
        return _problem(doc)


def _problem(doc: Mapping[str, Any]) -> Problem:
    horizon = number(required(doc, "horizon", ""), "horizon")
    names: list[str] = []
    offsets: dict[str, list[int]] = {"compute_free": [0], "link_free": [0]}
    starts: dict[str, list[float]] = {k: [] for k in offsets}
    ends: dict[str, list[float]] = {k: [] for k in offsets}
    for i, lane in enumerate(array(required(doc, "lanes", ""), "lanes")):
        where = f"lanes[{i}]"
        name = required(lane, "name", where)
        if not isinstance(name, str):
            raise ValueError(f"{where}.name: {shown(name)} is not a string")
        names.append(name)
        for key in offsets:
            for s, e in _windows(lane, key, where):
                starts[key].append(s)
                ends[key].append(e)
            offsets[key].append(len(starts[key]))
    fn, gr = [], []
    for k, mb in enumerate(array(required(doc, "microbatches", ""), "microbatches")):
        where = f"microbatches[{k}]"
        fn.append(number(required(mb, "forward_needed", where), where + ".forward_needed"))
        gr.append(number(required(mb, "grad_ready", where), where + ".grad_ready"))
    windows = {key: Windows(offset=np.array(offsets[key], np.int64), start=np.array(starts[key], np.float64),
                            end=np.array(ends[key], np.float64)) for key in offsets}
    arrays = ProblemArrays(horizon=horizon, compute_free=windows["compute_free"], link_free=windows["link_free"],
                           forward_needed=np.array(fn, np.float64), grad_ready=np.array(gr, np.float64),
                           tasks=Tasks.from_dicts(array(required(doc, "tasks", ""), "tasks")))
    return Problem.from_arrays(arrays, names)


__all__ = ["PROBLEM_FORMAT", "PHASES", "RESOURCES", "Problem", "load_problem", "prefetched_needs"]
