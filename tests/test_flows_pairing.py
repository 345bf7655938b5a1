"""`frames.flows` pairs flow points by (category, id): the first start and the first end of
each, ordered by start time then start event, the flows without a start after them in the
order of their ends; a point without an id pairs with nothing. Checked against a plain
pairing written from that sentence, on points with repeated ids, ends without starts,
starts without ends, missing ids and two categories."""

from __future__ import annotations

import random

import polars as pl

from traceq.loader.frames import flows

Point = tuple[int, str, str, str | None, int]  # event, ph, cat, flow_id, ts_ns


def _points(rows: list[Point]) -> pl.DataFrame:
    frame = pl.DataFrame(
        rows, schema=["event", "ph", "cat", "flow_id", "ts_ns"], orient="row"
    ).with_columns(
        pl.col("event").cast(pl.UInt32),
        pl.col("ph").cast(pl.Categorical),
        pl.col("cat").cast(pl.Categorical),
        (pl.col("event").cast(pl.Int64) % 3).alias("pid"),
        (pl.col("event").cast(pl.Int64) % 5).alias("tid"),
    )
    return frame.select("event", "ph", "cat", "flow_id", "pid", "tid", "ts_ns")


def _expected(rows: list[Point]) -> list[tuple[object, ...]]:
    starts: dict[tuple[str, str | None], Point] = {}
    ends: dict[tuple[str, str | None], Point] = {}
    for row in rows:
        side = starts if row[1] == "s" else ends if row[1] == "f" else None
        if side is not None:
            side.setdefault((row[2], row[3]), row)
    paired = []
    for key, start in sorted(starts.items(), key=lambda kv: (kv[1][4], kv[1][0])):
        end = ends.get(key) if key[1] is not None else None  # no id pairs nothing
        paired.append((*key, start[0], start[4], *((end[0], end[4]) if end else (None, None))))
    alone = [
        (*key, None, None, end[0], end[4])
        for key, end in ends.items()
        if key not in starts or key[1] is None
    ]
    return paired + sorted(alone, key=lambda row: row[4])


def _paired(rows: list[Point]) -> list[tuple[object, ...]]:
    got = flows(_points(rows)).with_columns(pl.col("cat").cast(pl.String))
    columns = ["cat", "flow_id", "start_event", "start_ts_ns", "end_event", "end_ts_ns"]
    return list(got.select(columns).iter_rows())


def test_first_start_and_first_end_of_each_id() -> None:
    rows: list[Point] = [
        (0, "s", "ac2g", "7", 50),
        (1, "s", "ac2g", "7", 10),  # a second start of id 7: not its start
        (2, "f", "ac2g", "7", 60),
        (3, "f", "ac2g", "7", 70),  # a second end: not its end
        (4, "s", "fwdbwd", "7", 5),  # the same id in another category: another flow
        (5, "f", "ac2g", "9", 80),  # an end without a start
        (6, "s", "ac2g", "8", 20),  # a start without an end
        (7, "t", "ac2g", "8", 25),  # a step: neither
    ]
    assert _paired(rows) == [
        ("fwdbwd", "7", 4, 5, None, None),
        ("ac2g", "8", 6, 20, None, None),
        ("ac2g", "7", 0, 50, 2, 60),
        ("ac2g", "9", None, None, 5, 80),
    ]
    assert _paired(rows) == _expected(rows)


def test_random_points_pair_as_the_plain_pairing_does() -> None:
    rng = random.Random(13)
    for _ in range(50):
        rows: list[Point] = [
            (
                event,
                rng.choice("ssfft"),
                rng.choice(["ac2g", "fwdbwd"]),
                rng.choice([str(i) for i in range(6)] + [None]),
                rng.randrange(100),
            )
            for event in range(rng.randrange(1, 40))
        ]
        assert _paired(rows) == _expected(rows)
