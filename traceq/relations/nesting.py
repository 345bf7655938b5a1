"""Interval nesting: which event encloses which, on one thread or stream.

CPU ops, annotations and Python frames nest by time on their thread; the profiler records
no parent pointers for ops. Finding the innermost enclosing interval is a stack problem,
solved here without a Python loop over rows: each interval's candidate parent starts as its
predecessor in start order and jumps along the candidates' own candidates (pointer jumping)
until it contains the interval. Arrays in, arrays out; -1 means "none".
"""

from __future__ import annotations

import numpy as np

NONE = -1


def parents(group: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Index of each interval's innermost enclosing interval in the same group, or -1.

    Ties (same start and end) nest in input order: the later one is the child.
    """
    n = len(ts)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((np.arange(n), -end, ts, group))
    g, e = group[order], end[order]
    guess = np.arange(-1, n - 1, dtype=np.int64)
    guess[1:][g[1:] != g[:-1]] = NONE
    todo = np.flatnonzero(guess >= 0)
    while todo.size:
        cand = guess[todo]
        outside = e[cand] < e[todo]
        todo = todo[outside]
        guess[todo] = guess[guess[todo]]
        todo = todo[guess[todo] >= 0]
    result = np.full(n, NONE, dtype=np.int64)
    has = guess >= 0
    result[order[has]] = order[guess[has]]
    return result


def depths(parent: np.ndarray) -> np.ndarray:
    """Number of ancestors of each interval, given `parents`."""
    depth = np.zeros(len(parent), dtype=np.int32)
    ancestor = parent.copy()
    live = np.flatnonzero(ancestor >= 0)
    while live.size:
        depth[live] += 1
        ancestor[live] = parent[ancestor[live]]
        live = live[ancestor[live] >= 0]
    return depth


def enclosing(
    inner: tuple[np.ndarray, np.ndarray, np.ndarray],
    outer: tuple[np.ndarray, np.ndarray, np.ndarray],
    outer_parent: np.ndarray,
) -> np.ndarray:
    """Index of the innermost `outer` interval enclosing each `inner` interval, or -1.

    Both are (group, ts, end) arrays; `outer_parent` is `parents(*outer)`.
    """
    ig, its, iend = inner
    og, ots, oend = outer
    found = np.full(len(its), NONE, dtype=np.int64)
    if len(its) == 0 or len(ots) == 0:
        return found
    order = np.lexsort((-oend, ots, og))
    for value in np.intersect1d(np.unique(ig), np.unique(og)):
        rows = np.flatnonzero(ig == value)
        members = order[og[order] == value]
        at = np.searchsorted(ots[members], its[rows], side="right") - 1
        ok = at >= 0
        found[rows[ok]] = members[at[ok]]
    todo = np.flatnonzero(found >= 0)
    while todo.size:
        cand = found[todo]
        outside = oend[cand] < iend[todo]
        todo = todo[outside]
        found[todo] = outer_parent[found[todo]]
        todo = todo[found[todo] >= 0]
    return found
