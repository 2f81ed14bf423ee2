"""The compiled core, ``pybubble._core``, and what to do when it is missing.

The core is built when the package is installed (``pip install .``). Python run from a source
checkout finds the checkout's ``pybubble/`` folder first, which has no compiled core: instead of
Python's "cannot import name '_core' from partially initialized module", :func:`require_core` says
what happened and the two ways out.
"""

from __future__ import annotations

import importlib.util
import os

MISSING_CORE = (
    "pybubble's compiled core (pybubble._core) is not in {folder}.\n"
    "This usually means Python found the source checkout's pybubble/ folder instead of the installed package\n"
    "(it does when you run from the checkout's root). Either:\n"
    "  - run from another folder (e.g. `cd /tmp`), so the installed package is imported; or\n"
    "  - install the checkout in editable mode, rebuilt on import:\n"
    "      pip install --no-build-isolation -Ceditable.rebuild=true -Cbuild-dir=build/editable -e .\n"
    "    (needs: pip install scikit-build-core pybind11 cmake ninja)."
)
"""The message when the core is missing."""


def require_core() -> None:
    """Raises ImportError with :data:`MISSING_CORE` when ``pybubble._core`` cannot be found."""
    if importlib.util.find_spec("pybubble._core") is None:
        folder = os.path.dirname(os.path.abspath(__file__))
        raise ImportError(MISSING_CORE.format(folder=folder))


__all__ = ["MISSING_CORE", "require_core"]
