"""`traceq.relations.nesting` against plain references, on random intervals full of ties.

The contract: an interval's parent is the innermost other interval of its group that
contains it (`ts <= child.ts` and `child.end <= end`); "innermost" is the one that starts
last, then ends first; of identical intervals the later one in input order is the child.
`enclosing` applies the same rule between two sets. The vectorised pointer-jumping code is
checked against a stack walk (properly nested input) and a brute-force search over all
pairs (any input, overlaps included).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from traceq.relations.nesting import NONE, depths, enclosing, parents

Intervals = list[tuple[int, int, int]]  # (group, ts, end)

intervals = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 6)).map(
        lambda t: (t[0], t[1], t[1] + t[2])
    ),
    max_size=40,
)


def nested_only(candidates: Intervals) -> Intervals:
    """Keep each interval that nests in or is disjoint from all kept ones of its group."""
    kept: Intervals = []
    for g, ts, end in candidates:
        compatible = all(
            og != g
            or (ots <= ts and end <= oend)
            or (ts <= ots and oend <= end)
            or end <= ots
            or oend <= ts
            for og, ots, oend in kept
        )
        if compatible:
            kept.append((g, ts, end))
    return kept


def arrays(rows: Intervals) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not rows:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    g, ts, end = (np.array(column, dtype=np.int64) for column in zip(*rows, strict=True))
    return g, ts, end


def stack_parents(rows: Intervals) -> list[int]:
    """The textbook walk: in start order (longest first), pop what ends too early."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1], -rows[i][2], i))
    result = [NONE] * len(rows)
    stack: list[int] = []
    for i in order:
        g, _, end = rows[i]
        if stack and rows[stack[-1]][0] != g:
            stack = []
        while stack and rows[stack[-1]][2] < end:
            stack.pop()
        result[i] = stack[-1] if stack else NONE
        stack.append(i)
    return result


def innermost(child: tuple[int, int, int], candidates: Intervals, before: int | None) -> int:
    """Brute force: the containing candidate that starts last, then ends first, then is
    latest in order (`before` excludes later identical ones: those are children)."""
    g, ts, end = child
    best, best_key = NONE, None
    for j, (og, ots, oend) in enumerate(candidates):
        if j == before or og != g or not (ots <= ts and end <= oend):
            continue
        if before is not None and (ots, oend) == (ts, end) and j > before:
            continue
        key = (ots, -oend, j)
        if best_key is None or key > best_key:
            best, best_key = j, key
    return best


@given(intervals)
def test_parents_match_a_stack_walk_on_nested_intervals(candidates: Intervals) -> None:
    rows = nested_only(candidates)
    assert parents(*arrays(rows)).tolist() == stack_parents(rows)


@given(intervals)
def test_parents_match_brute_force_on_any_intervals(rows: Intervals) -> None:
    expected = [innermost(row, rows, before=i) for i, row in enumerate(rows)]
    assert parents(*arrays(rows)).tolist() == expected


@given(intervals)
def test_depth_counts_ancestors(rows: Intervals) -> None:
    parent = parents(*arrays(rows))
    expected = []
    for i in range(len(rows)):
        depth, at = 0, parent[i]
        while at != NONE:
            depth, at = depth + 1, parent[at]
        expected.append(depth)
    assert depths(parent).tolist() == expected


@given(intervals, intervals)
def test_enclosing_finds_the_innermost_outer_interval(inner: Intervals, outer: Intervals) -> None:
    outer_arrays = arrays(outer)
    found = enclosing(arrays(inner), outer_arrays, parents(*outer_arrays))
    assert found.tolist() == [innermost(row, outer, before=None) for row in inner]


def test_identical_intervals_nest_in_input_order() -> None:
    rows = [(0, 5, 9), (0, 5, 9), (0, 5, 9)]
    assert parents(*arrays(rows)).tolist() == [NONE, 0, 1]


def test_zero_duration_interval_at_a_boundary_belongs_to_the_one_starting_there() -> None:
    rows = [(0, 0, 5), (0, 5, 10), (0, 5, 5)]
    assert parents(*arrays(rows)).tolist() == [NONE, NONE, 1]
