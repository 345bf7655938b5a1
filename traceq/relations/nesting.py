"""Interval nesting: which event encloses which, on one thread or stream.

CPU ops, annotations and Python frames nest by time on their thread; the profiler records
no parent pointers for ops. Finding the innermost enclosing interval is a stack problem,
solved here without a Python loop over rows: each interval's candidate parent starts as its
predecessor in start order and jumps along the candidates' own candidates (pointer jumping)
until it contains the interval. Arrays in, arrays out; -1 means "none".

Real clocks are not exact, so "contains" has a tolerance at the end: a child may end up to
`TOLERANCE_NS` after its parent, provided it starts before the parent ends. Old traces write
`ts` and `dur` as whole µs, each rounded on its own, so a child's `ts + dur` can land up to
1 µs past its parent's (floor(a) + floor(b) loses less than 2 µs against a + b, and the
difference of two such sums is at most one whole µs); events of one thread are also stamped
by clocks that drift a few hundred ns. One thread runs one call stack, so an op that starts
inside another and ends within 1 µs of it is its child, not a sibling: siblings never
overlap, and one that starts at or after the previous op's end is never nested by this rule.
The start needs no tolerance: rounding is monotonic, so a child never starts before its
parent.
"""

from __future__ import annotations

import numpy as np

NONE = -1
# 1 µs: the most that rounding `ts` and `dur` to whole µs can move a child's end past its
# parent's (see above), and well above the clock drift of one thread (a few hundred ns).
TOLERANCE_NS = 1_000


def _outside(cand_end: np.ndarray, ts: np.ndarray, end: np.ndarray, tolerance: int) -> np.ndarray:
    """Whether candidates ending at `cand_end` (each starting no later than its interval)
    fail to contain the intervals (`ts`, `end`): the interval ends after the candidate, by
    more than `tolerance` or having started at or after the candidate's end.

    Failing is transitive along start order (if A fails B and B fails C, A fails C), which is
    what lets pointer jumping skip the intervals a candidate already failed."""
    late = end - cand_end
    return (late > 0) & ((late > tolerance) | (ts >= cand_end))


def parents(
    group: np.ndarray, ts: np.ndarray, end: np.ndarray, tolerance: int = TOLERANCE_NS
) -> np.ndarray:
    """Index of each interval's innermost enclosing interval in the same group, or -1.

    Innermost: the one that starts last (then ends first). Ties (same start and end) nest
    in input order: the later one is the child. `tolerance`: see the module docstring.
    """
    n = len(ts)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((np.arange(n), -end, ts, group))
    g, t, e = group[order], ts[order], end[order]
    guess = np.arange(-1, n - 1, dtype=np.int64)
    guess[1:][g[1:] != g[:-1]] = NONE
    todo = np.flatnonzero(guess >= 0)
    while todo.size:
        cand = guess[todo]
        outside = _outside(e[cand], t[todo], e[todo], tolerance)
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
    tolerance: int = TOLERANCE_NS,
) -> np.ndarray:
    """Index of the innermost `outer` interval enclosing each `inner` interval, or -1.

    Both are (group, ts, end) arrays; `outer_parent` is `parents(*outer)` with the same
    `tolerance`.
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
        outside = _outside(oend[cand], its[todo], iend[todo], tolerance)
        todo = todo[outside]
        found[todo] = outer_parent[found[todo]]
        todo = todo[found[todo] >= 0]
    return found
