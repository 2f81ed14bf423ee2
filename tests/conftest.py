"""Test session set-up: the tests import the installed pybubble (with its compiled extension).

``python -m pytest`` puts the working directory first on sys.path, where the bare source folder
pybubble/ (no extension) would shadow the installed package; drop it before any test imports
pybubble. ``pytest`` alone (as in CI) never adds it, and then this changes nothing.
"""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]
