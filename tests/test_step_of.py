"""`step_of` places each row in the step window that holds it, as a plain scan would."""

from __future__ import annotations

import random

import polars as pl

from traceq.relations.link import step_of


def reference(times: list[int | None], windows: list[tuple[int, int, int | None]]) -> list:
    """The last window (by start, file order on ties) starting at or before t, if t is
    before its end; null otherwise."""
    ordered = sorted(windows, key=lambda w: w[1])
    out = []
    for t in times:
        last = None
        for window in ordered:
            if t is not None and window[1] <= t:
                last = window
        out.append(last[0] if last and last[2] is not None and t < last[2] else None)
    return out


def test_random_windows_and_times_match_a_plain_scan() -> None:
    rng = random.Random(7)
    for _ in range(200):
        starts = [rng.randrange(0, 1000) for _ in range(rng.randrange(1, 6))]
        windows = [
            (i, s, None if rng.random() < 0.1 else s + rng.randrange(0, 300))
            for i, s in enumerate(starts)
        ]
        times = [None if rng.random() < 0.1 else rng.randrange(-50, 1400) for _ in range(50)]
        steps = pl.DataFrame(
            [w for w in windows],
            schema={"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64},
            orient="row",
        )
        frame = pl.DataFrame({"ts_ns": times}, schema={"ts_ns": pl.Int64})
        assert step_of(frame, steps).to_list() == reference(times, windows)


def test_no_steps_or_no_rows_give_null_steps() -> None:
    steps = pl.DataFrame(schema={"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64})
    frame = pl.DataFrame({"ts_ns": [1, 2]})
    assert step_of(frame, steps).to_list() == [None, None]
    assert (
        step_of(
            frame.clear(), steps.extend(pl.DataFrame({"step": [0], "ts_ns": [0], "end_ns": [9]}))
        ).len()
        == 0
    )
