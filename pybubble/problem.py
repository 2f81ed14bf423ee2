"""The bubble-filling problem (pybubble.problem/1): lanes with free windows, LLM microbatch
dependency points, and the encoder's kernel tasks."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from . import _core
from .formats import PathOrDict, array, field, integer, number, read_document, write_document

FORMAT = "pybubble.problem/1"
RESOURCES = ("compute", "comm")
PHASES = ("fwd", "bwd")


class Problem:
    """A checked problem. Build one with :func:`load_problem` (JSON) or :meth:`from_arrays`."""

    __slots__ = ("core", "lane_names")

    def __init__(self, core: _core.Problem, lane_names: Sequence[str] | None = None):
        self.core = core
        names = list(lane_names) if lane_names is not None else [f"lane{i}" for i in range(core.num_lanes)]
        if len(names) != core.num_lanes:
            raise ValueError(f"lane_names: {len(names)} names for {core.num_lanes} lanes")
        self.lane_names = names

    @classmethod
    def from_arrays(cls, *, lane_names: Sequence[str] | None = None, **arrays: Any) -> "Problem":
        """Builds a problem from flat arrays (the keys of :meth:`arrays`; ``num_lanes`` optional);
        checked by the core."""
        return cls(_core.Problem(_core_arrays(arrays)), lane_names)

    @property
    def horizon(self) -> float:
        """The LLM-only step time (us)."""
        return self.core.horizon

    @property
    def num_lanes(self) -> int:
        return self.core.num_lanes

    @property
    def num_tasks(self) -> int:
        return self.core.num_tasks

    @property
    def num_microbatches(self) -> int:
        return self.core.num_microbatches

    def arrays(self) -> dict[str, Any]:
        """The problem's fields as flat NumPy arrays (the arguments of :meth:`from_arrays`)."""
        a = self.core.arrays()
        flat = {"horizon": a["horizon"], "num_lanes": self.core.num_lanes}
        for group, prefix in _WINDOW_GROUPS:
            flat.update({f"{prefix}_{k}": v for k, v in a[group].items()})
        flat["forward_needed"], flat["grad_ready"] = a["forward_needed"], a["grad_ready"]
        flat.update(a["tasks"])
        return flat

    def with_durations(self, durations: np.ndarray) -> "Problem":
        """The same problem with new task durations (checked)."""
        a = self.arrays()
        a["duration"] = np.asarray(durations, dtype=np.float64)
        return Problem.from_arrays(lane_names=self.lane_names, **a)

    def free_windows(self) -> list[dict[str, list[tuple[float, float]]]]:
        """Per lane, its free windows by resource: ``[{"compute": [(start, end), ...], "comm":
        [...]}, ...]`` (``comm`` tasks use the ``link_free`` windows)."""
        a = self.arrays()
        out = []
        for lane in range(self.num_lanes):
            wins = {}
            for resource, prefix in zip(RESOURCES, ("compute", "link")):
                b, e = a[f"{prefix}_offset"][lane], a[f"{prefix}_offset"][lane + 1]
                wins[resource] = list(zip(a[f"{prefix}_start"][b:e].tolist(), a[f"{prefix}_end"][b:e].tolist()))
            out.append(wins)
        return out

    def predecessors(self) -> list[list[int]]:
        """The ``after`` list of every task."""
        a = self.arrays()
        ao, af = a["after_offset"].tolist(), a["after"].tolist()
        return [af[ao[t]:ao[t + 1]] for t in range(self.num_tasks)]

    def to_dict(self) -> dict[str, Any]:
        """The problem as a pybubble.problem/1 document."""
        a = self.arrays()
        lanes = [{"name": name,
                  "compute_free": [[s, e] for s, e in wins["compute"]],
                  "link_free": [[s, e] for s, e in wins["comm"]]}
                 for name, wins in zip(self.lane_names, self.free_windows())]
        preds = self.predecessors()
        tasks = [
            {"id": i, "lane": int(a["lane"][i]), "duration": float(a["duration"][i]),
             "resource": RESOURCES[a["resource"][i]], "phase": PHASES[a["phase"][i]],
             "microbatch": int(a["microbatch"][i]), "after": preds[i]}
            for i in range(self.num_tasks)
        ]
        return {
            "format": FORMAT,
            "horizon": float(a["horizon"]),
            "lanes": lanes,
            "microbatches": [{"forward_needed": float(f), "grad_ready": float(g)}
                             for f, g in zip(a["forward_needed"], a["grad_ready"])],
            "tasks": tasks,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the problem as pybubble.problem/1 JSON."""
        write_document(path, self.to_dict())

    def __repr__(self) -> str:
        return (f"Problem(horizon={self.horizon}, lanes={self.num_lanes}, "
                f"microbatches={self.num_microbatches}, tasks={self.num_tasks})")


_WINDOW_GROUPS = (("compute_free", "compute"), ("link_free", "link"))
_TASK_ARRAYS = ("lane", "microbatch", "resource", "phase", "after_offset", "after", "duration")


def _core_arrays(flat: Mapping[str, Any]) -> SimpleNamespace:
    """The core's nested arrays (``_core.Problem``) from the flat keys of :meth:`Problem.arrays`."""
    keys = ["horizon", *(f"{p}_{k}" for _, p in _WINDOW_GROUPS for k in ("offset", "start", "end")),
            "forward_needed", "grad_ready", *_TASK_ARRAYS]
    unknown = sorted(set(flat) - set(keys) - {"num_lanes"})
    missing = [k for k in keys if k not in flat]
    if unknown or missing:
        raise ValueError(f"arrays: {'unknown ' + ', '.join(unknown) if unknown else 'missing ' + ', '.join(missing)}")
    num_lanes = flat.get("num_lanes")
    if num_lanes is not None:
        if isinstance(num_lanes, bool) or not isinstance(num_lanes, (int, np.integer)):
            raise ValueError(f"num_lanes: {num_lanes!r} is not an integer")
        for _, p in _WINDOW_GROUPS:
            if np.ndim(flat[f"{p}_offset"]) == 1 and len(flat[f"{p}_offset"]) != num_lanes + 1:
                raise ValueError(f"{p}_free: offsets hold {len(flat[f'{p}_offset'])} entries, "
                                 f"expected {num_lanes + 1}")
    groups = {g: SimpleNamespace(**{k: flat[f"{p}_{k}"] for k in ("offset", "start", "end")})
              for g, p in _WINDOW_GROUPS}
    return SimpleNamespace(horizon=flat["horizon"], forward_needed=flat["forward_needed"],
                           grad_ready=flat["grad_ready"], tasks=SimpleNamespace(**{k: flat[k] for k in _TASK_ARRAYS}),
                           **groups)


def _windows(lane: Mapping[str, Any], key: str, where: str) -> list[tuple[Any, Any]]:
    out = []
    for w, win in enumerate(array(field(lane, key, where), f"{where}.{key}")):
        f = f"{where}.{key}[{w}]"
        if not isinstance(win, list) or len(win) != 2:
            raise ValueError(f"{f}: {win!r} is not a [start, end] pair")
        out.append((number(win[0], f + "[0]"), number(win[1], f + "[1]")))
    return out


def _choice(value: Any, names: Sequence[str], where: str) -> int:
    if value not in names:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(names)}")
    return names.index(value)


def load_problem(source: PathOrDict | Problem) -> Problem:
    """Loads and checks a pybubble.problem/1 from a JSON file path or a parsed dict.

    Raises ValueError naming the bad field and its value, e.g. ``tasks[17].after[0]: 23 is not < 17``.
    """
    if isinstance(source, Problem):
        return source
    doc = read_document(source, FORMAT)
    horizon = number(field(doc, "horizon", ""), "horizon")
    names, offsets, starts, ends = [], {"compute_free": [0], "link_free": [0]}, {}, {}
    for key in offsets:
        starts[key], ends[key] = [], []
    for i, lane in enumerate(array(field(doc, "lanes", ""), "lanes")):
        where = f"lanes[{i}]"
        name = field(lane, "name", where)
        if not isinstance(name, str):
            raise ValueError(f"{where}.name: {name!r} is not a string")
        names.append(name)
        for key in offsets:
            for s, e in _windows(lane, key, where):
                starts[key].append(s)
                ends[key].append(e)
            offsets[key].append(len(starts[key]))
    fn, gr = [], []
    for k, mb in enumerate(array(field(doc, "microbatches", ""), "microbatches")):
        where = f"microbatches[{k}]"
        fn.append(number(field(mb, "forward_needed", where), where + ".forward_needed"))
        gr.append(number(field(mb, "grad_ready", where), where + ".grad_ready"))
    tasks = task_arrays(array(field(doc, "tasks", ""), "tasks"))
    return Problem.from_arrays(
        lane_names=names, horizon=horizon, num_lanes=len(names),
        compute_offset=np.array(offsets["compute_free"], np.int64),
        compute_start=np.array(starts["compute_free"], np.float64),
        compute_end=np.array(ends["compute_free"], np.float64),
        link_offset=np.array(offsets["link_free"], np.int64),
        link_start=np.array(starts["link_free"], np.float64),
        link_end=np.array(ends["link_free"], np.float64),
        forward_needed=np.array(fn, np.float64), grad_ready=np.array(gr, np.float64),
        **tasks,
    )


def task_arrays(tasks: Sequence[Any], *, id_required: bool = True) -> dict[str, np.ndarray]:
    """The arrays of pybubble.problem/1 tasks (lane, microbatch, duration, resource, phase,
    after_offset, after) that :meth:`Problem.from_arrays` takes, checked field by field.

    Each task is a dict in problem/1 task form; with ``id_required=False`` the "id" may be left out
    (the index is the id). ValueError naming the field, e.g. ``tasks[3].after[0]: 'x' is not an
    integer``; ranges and order are checked by the core.
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
            tid = integer(field(t, "id", where), where + ".id")
            if tid != i:
                raise ValueError(f"{where}.id: {tid} is not its index {i}")
        lane[i] = _int64(field(t, "lane", where), where + ".lane")
        mb[i] = _int64(field(t, "microbatch", where), where + ".microbatch")
        dur[i] = number(field(t, "duration", where), where + ".duration")
        res[i] = _choice(field(t, "resource", where), RESOURCES, where + ".resource")
        ph[i] = _choice(field(t, "phase", where), PHASES, where + ".phase")
        preds = field(t, "after", where)
        if isinstance(preds, (str, bytes, Mapping)) or not isinstance(preds, (Sequence, np.ndarray)):
            raise ValueError(f"{where}.after: expected a list, got {type(preds).__name__}")
        for q, p in enumerate(preds):
            after.append(_int64(p, f"{where}.after[{q}]"))
        after_offset[i + 1] = len(after)
    return {"lane": lane, "microbatch": mb, "duration": dur, "resource": res, "phase": ph,
            "after_offset": after_offset, "after": np.array(after, np.int64)}


def _int64(value: Any, where: str) -> int:
    v = integer(value, where)
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"{where}: {v} is out of range")
    return v
