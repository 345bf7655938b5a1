"""`traceq.relations.nesting` against plain references, on random intervals full of ties.

The contract: an interval's parent is the innermost other interval of its group that
precedes it in start order (start, then longer first, then input order) and contains it:
`ts <= child.ts` and `child.end <= end`, or, within the clock tolerance, `child.end <= end +
tolerance` when the child starts before `end`. "Innermost" is the one that starts last, then
ends first; of identical intervals the later one in input order is the child. `enclosing`
applies the same rule between two sets. The vectorised pointer-jumping code is checked
against a stack walk (properly nested input) and a brute-force search over all pairs (any
input, overlaps included), with no tolerance and with one of 2 on a grid of 0..18.
"""

from __future__ import annotations

import numpy as np
import pytest
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


TOLERANCES = pytest.mark.parametrize("tol", [0, 2])


def contains(outer: tuple[int, int, int], inner: tuple[int, int, int], tol: int) -> bool:
    """`outer` holds `inner` (same group, starts no later): exactly, or ending at most `tol`
    after it having started before its end."""
    (og, ots, oend), (g, ts, end) = outer, inner
    exact = ots <= ts and end <= oend
    return og == g and (exact or (ots <= ts < oend and end <= oend + tol))


def stack_parents(rows: Intervals, tol: int) -> list[int]:
    """The textbook walk: in start order (longest first), pop what does not contain it."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1], -rows[i][2], i))
    result = [NONE] * len(rows)
    stack: list[int] = []
    for i in order:
        g = rows[i][0]
        if stack and rows[stack[-1]][0] != g:
            stack = []
        while stack and not contains(rows[stack[-1]], rows[i], tol):
            stack.pop()
        result[i] = stack[-1] if stack else NONE
        stack.append(i)
    return result


def innermost(
    child: tuple[int, int, int], candidates: Intervals, before: int | None, tol: int
) -> int:
    """Brute force: the containing candidate that starts last, then ends first, then is
    latest in order. `before` is the child's own index among `candidates`: only those that
    precede it in start order may hold it (a later identical one is a child)."""
    _, ts, end = child
    best, best_key = NONE, None
    for j, (og, ots, oend) in enumerate(candidates):
        key = (ots, -oend, j)
        if before is not None and key >= (ts, -end, before):
            continue
        if not contains((og, ots, oend), child, tol):
            continue
        if best_key is None or key > best_key:
            best, best_key = j, key
    return best


@TOLERANCES
@given(intervals)
def test_parents_match_a_stack_walk_on_nested_intervals(tol: int, candidates: Intervals) -> None:
    rows = nested_only(candidates)
    assert parents(*arrays(rows), tolerance=tol).tolist() == stack_parents(rows, tol)


@TOLERANCES
@given(intervals)
def test_parents_match_a_stack_walk_on_any_intervals(tol: int, rows: Intervals) -> None:
    assert parents(*arrays(rows), tolerance=tol).tolist() == stack_parents(rows, tol)


@TOLERANCES
@given(intervals)
def test_parents_match_brute_force_on_any_intervals(tol: int, rows: Intervals) -> None:
    expected = [innermost(row, rows, before=i, tol=tol) for i, row in enumerate(rows)]
    assert parents(*arrays(rows), tolerance=tol).tolist() == expected


@TOLERANCES
@given(intervals)
def test_depth_counts_ancestors(tol: int, rows: Intervals) -> None:
    parent = parents(*arrays(rows), tolerance=tol)
    expected = []
    for i in range(len(rows)):
        depth, at = 0, parent[i]
        while at != NONE:
            depth, at = depth + 1, parent[at]
        expected.append(depth)
    assert depths(parent).tolist() == expected


@TOLERANCES
@given(intervals, intervals)
def test_enclosing_finds_the_innermost_outer_interval(
    tol: int, inner: Intervals, outer: Intervals
) -> None:
    outer_arrays = arrays(outer)
    parent = parents(*outer_arrays, tolerance=tol)
    found = enclosing(arrays(inner), outer_arrays, parent, tolerance=tol)
    assert found.tolist() == [innermost(row, outer, before=None, tol=tol) for row in inner]


def test_identical_intervals_nest_in_input_order() -> None:
    rows = [(0, 5, 9), (0, 5, 9), (0, 5, 9)]
    assert parents(*arrays(rows)).tolist() == [NONE, 0, 1]


def test_zero_duration_interval_at_a_boundary_belongs_to_the_one_starting_there() -> None:
    rows = [(0, 0, 5), (0, 5, 10), (0, 5, 5)]
    assert parents(*arrays(rows)).tolist() == [NONE, NONE, 1]


def test_a_child_ending_within_the_tolerance_still_nests() -> None:
    """A child that ends 300 ns after its parent (clock drift, µs rounding) is its child;
    one ending 1.5 µs after is not; a sibling that starts at the parent's end never is."""
    rows = [(0, 0, 10_000), (0, 2_000, 10_300), (0, 20_000, 30_000), (0, 21_000, 31_500)]
    rows += [(0, 40_000, 50_000), (0, 50_000, 50_400)]
    assert parents(*arrays(rows)).tolist() == [NONE, 0, NONE, NONE, NONE, NONE]
    assert parents(*arrays(rows), tolerance=0).tolist() == [NONE] * 6
