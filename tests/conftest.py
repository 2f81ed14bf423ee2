"""Shared test fixtures."""

import copy

import pytest


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
