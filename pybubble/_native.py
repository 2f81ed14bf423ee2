"""The compiled core, ``pybubble._core``, and what to do when it is missing.

The core is built when the package is installed (``pip install .``). Python run from a source
checkout's root finds the checkout's ``pybubble/`` folder first, which has no compiled core: instead of
Python's "cannot import name '_core' from partially initialized module", :func:`require_core` says
what happened and the two ways out. The README's development section shows the same command.
"""

from __future__ import annotations

import importlib.util
import os

EDITABLE_INSTALL = ("pip install --no-build-isolation -Ceditable.rebuild=true -Ceditable.verbose=false "
                    "-Cbuild-dir=build/editable -e .")
"""Installs a checkout in editable mode, its core rebuilt when pybubble is imported after a change
(scikit-build-core's editable rebuild needs the build environment kept: no build isolation)."""

MISSING_CORE = (
    "pybubble's compiled core (pybubble._core) is not in {folder}.\n"
    "Python imported the pybubble/ folder of a source checkout, which has no compiled core: it comes\n"
    "first when you run `python -m ...`, `python -c ...` or a script saved in the checkout's root.\n"
    "Either:\n"
    "  - run from any other folder (e.g. `cd ~`), so that the installed pybubble is imported\n"
    "    (the `pybubble` command works from anywhere); or\n"
    "  - install the checkout in editable mode, rebuilt on import after a change:\n"
    "      pip install scikit-build-core pybind11 cmake ninja\n"
    f"      {EDITABLE_INSTALL}"
)
"""The message when the core is missing (``{folder}``: where it was looked for)."""


def require_core() -> None:
    """Raises ImportError with :data:`MISSING_CORE` when ``pybubble._core`` cannot be found."""
    if importlib.util.find_spec("pybubble._core") is None:
        folder = os.path.dirname(os.path.abspath(__file__))
        raise ImportError(MISSING_CORE.format(folder=folder))


__all__ = ["EDITABLE_INSTALL", "MISSING_CORE", "require_core"]
