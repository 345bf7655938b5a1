"""`breakdown.union_ns`: the covered length of each group's intervals, against a plain
merge of sorted intervals in Python on random groups (overlapping, nested, touching,
zero-length and repeated intervals)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceq.relations.intervals import union_ns

_INTERVAL = st.tuples(
    st.integers(0, 2),  # step
    st.sampled_from(["COMP", "COMM"]),
    st.integers(0, 60),  # start
    st.integers(0, 25),  # length
)


def _merged_length(intervals: list[tuple[int, int]]) -> int:
    """Sort by start, merge what overlaps or touches, add up the blocks."""
    total, block = 0, None
    for start, end in sorted(intervals):
        if block is not None and start <= block[1]:
            block = (block[0], max(block[1], end))
            continue
        if block is not None:
            total += block[1] - block[0]
        block = (start, end)
    return total + (block[1] - block[0] if block else 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(_INTERVAL, max_size=40))
def test_union_is_the_merged_length_of_each_group(rows: list[tuple[int, str, int, int]]) -> None:
    frame = pl.DataFrame(
        [(step, kind, start, start + length) for step, kind, start, length in rows],
        schema={"step": pl.Int64, "type": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )
    for by in (["step", "type"], ["step"]):
        found = {
            tuple(row[:-1]): row[-1] for row in union_ns(frame, by).select(*by, "union_ns").rows()
        }
        groups: dict[tuple[object, ...], list[tuple[int, int]]] = {}
        for step, kind, start, length in rows:
            key = (step, kind) if len(by) == 2 else (step,)
            groups.setdefault(key, []).append((start, start + length))
        assert found == {key: _merged_length(spans) for key, spans in groups.items()}
    assert union_ns(frame, ["step"]).schema["union_ns"] == pl.Int64
