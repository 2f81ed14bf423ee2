"""Test session set-up and shared fixtures.

The tests import the installed pybubble (with its compiled extension). ``python -m pytest`` puts the
working directory first on sys.path, where the bare source folder pybubble/ (no extension) would
shadow the installed package; drop it before any test imports pybubble. ``pytest`` alone (as in
CI) never adds it, and then this changes nothing.
"""

import copy
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]


def _replaced(doc, path, value):
    """A deep copy of `doc` with the entry at `path` (a sequence of keys and indices) set to
    `value`, or removed when `value` is KeyError."""
    doc = copy.deepcopy(doc)
    *head, last = path
    target = doc
    for k in head:
        target = target[k]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return doc


@pytest.fixture
def replaced():
    """The function replaced(doc, path, value): see _replaced."""
    return _replaced
