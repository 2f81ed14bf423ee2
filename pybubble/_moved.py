"""Modules that moved, still importable under their old names for one release: importing an old
name gives a module of the names it had, from their new places, and a ``DeprecationWarning`` that
names those places. One table, :data:`MOVED`; :func:`install` puts its finder first on
``sys.meta_path`` (``pybubble/__init__.py`` does)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {
    "pybubble.planner.workloads": ("pybubble.data.workloads", "pybubble.data.samples", "pybubble.data.mix",
                                   "pybubble.data.files", "pybubble.planner.sample_costs"),
    "pybubble.schedule.reference": ("pybubble.testing.reference",),
    "pybubble.schedule.exact": ("pybubble.testing.exact",),
    "pybubble.runtime.plan": ("pybubble.placement.plan",),
    "pybubble.runtime.placement": ("pybubble.placement.step_placement", "pybubble.placement.marks", "pybubble.placement.plan",
                                   "pybubble.placement.measured"),
    "pybubble.runtime.records": ("pybubble.placement.records",),
    "pybubble.runtime.costs": ("pybubble.placement.measured", "pybubble.runtime.profile"),
    "pybubble.measure.trace": ("pybubble.measure.trace_reader",),
    "pybubble.viz.trace": ("pybubble.viz.chrome_trace",),
}
"""Old module name: the modules its names are in now."""


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str):
        self.old = old

    def create_module(self, spec):
        return types.ModuleType(self.old)

    def exec_module(self, module) -> None:
        places = MOVED[self.old]
        for place in places:
            new = importlib.import_module(place)
            for name in getattr(new, "__all__", [n for n in vars(new) if not n.startswith("_")]):
                module.__dict__.setdefault(name, getattr(new, name))
        module.__doc__ = f"Deprecated: {self.old}'s names are in {', '.join(places)}."
        warnings.warn(f"{self.old} is deprecated: import from {', '.join(places)}", DeprecationWarning, stacklevel=2)


class MovedModules(importlib.abc.MetaPathFinder):
    """Finds the old names of :data:`MOVED` (and only those)."""

    def find_spec(self, fullname, path, target=None):
        """The spec of the stand-in module of an old name; None for any other name."""
        return importlib.util.spec_from_loader(fullname, _Alias(fullname)) if fullname in MOVED else None


def install() -> None:
    """Puts the finder first on ``sys.meta_path``, once (before an editable install's map of the
    old files)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
