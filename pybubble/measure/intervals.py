"""Unions of time intervals as two arrays (starts, ends), the arithmetic of measured bubbles:
union, intersection, difference, total length, clipping to a window, and the gaps between busy
intervals. Times are in any one unit (the traces': microseconds)."""

from __future__ import annotations

import numpy as np

Spans = tuple[np.ndarray, np.ndarray]
"""Intervals [start, end) as two float arrays of one length."""

NONE: Spans = (np.zeros(0), np.zeros(0))
"""No interval."""


def union(spans: Spans) -> Spans:
    """The union of intervals, as sorted disjoint intervals (touching ones merged, empty ones dropped)."""
    s, e = spans
    keep = e > s
    s, e = s[keep], e[keep]
    if not len(s):
        return NONE
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    first = np.flatnonzero(np.concatenate([[True], s[1:] > reach[:-1]]))
    last = np.concatenate([first[1:] - 1, [len(s) - 1]])
    return s[first], reach[last]


def joined(*parts: Spans) -> Spans:
    """The intervals of all ``parts`` in one (not merged: see :func:`union`)."""
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def overlap(a: Spans, b: Spans) -> Spans:
    """Intersection of two unions of disjoint sorted intervals."""
    points = np.concatenate([a[0], a[1], b[0], b[1]])
    na, nb = len(a[0]), len(b[0])
    in_a = np.concatenate([np.ones(na, np.int8), -np.ones(na, np.int8), np.zeros(2 * nb, np.int8)])
    in_b = np.concatenate([np.zeros(2 * na, np.int8), np.ones(nb, np.int8), -np.ones(nb, np.int8)])
    order = np.argsort(points, kind="stable")
    points = points[order]
    both = (np.cumsum(in_a[order]) > 0) & (np.cumsum(in_b[order]) > 0)
    return union((points[:-1][both[:-1]], points[1:][both[:-1]]))


def subtract(a: Spans, b: Spans) -> Spans:
    """``a`` less ``b`` (unions of disjoint sorted intervals): ``a`` within ``b``'s complement."""
    if not len(a[0]):
        return NONE
    b = union(b)
    return overlap(a, union((np.concatenate([[a[0][0]], b[1]]), np.concatenate([b[0], [a[1][-1]]]))))


def length(spans: Spans) -> float:
    """The intervals' lengths summed (of disjoint ones: the time they cover)."""
    return float(np.sum(spans[1] - spans[0]))


def clip(spans: Spans, lo: float, hi: float) -> Spans:
    """The parts of the intervals within [lo, hi] (empty ones dropped)."""
    s, e = np.maximum(spans[0], lo), np.minimum(spans[1], hi)
    keep = e > s
    return s[keep], e[keep]


def gaps(busy: Spans, lo: float, hi: float, min_gap_us: float) -> Spans:
    """The gaps of at least `min_gap_us` between the busy intervals (sorted, disjoint) in [lo, hi]."""
    before = np.concatenate([[lo], busy[1]])
    after = np.concatenate([busy[0], [hi]])
    keep = after - before >= min_gap_us
    return before[keep], after[keep]


__all__ = ["NONE", "Spans", "clip", "gaps", "joined", "length", "overlap", "subtract", "union"]
