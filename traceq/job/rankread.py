"""Reads from a rank's file only the events and fields a job's map reads, and counts the rest.

The map reads the complete (`ph` X) events of five frames — ops, runtime calls, GPU
activities, annotations and `ProfilerStep` windows — and of those a few fields: name,
process, thread, times and three `args` keys (`External id`, `correlation`, `device`), plus
the whole `args` of the few events that are collectives. The loader's NDJSON decode
(`loader.decode`) parses every field of every event and keeps every `args` as text, to be
parsed again per frame: three quarters of a rank's map. Here msgspec decodes each event
into a `Struct` of just those fields (it skips the rest of each object in C), keeping its
`args` as the raw slice of the file, then decodes every `args` in one batch (one call, and
a collective's whole `args` is its slice as it is: no second pass over the file); Python
keeps the events the map reads, and only their columns are built; `ph` and `cat` are kept for every
event, so each event is either read or counted (`RankEvents.unread`).

Every column is the one the loader would give, value for value (`read_frame` builds the
same columns from the loader's events; `tests/test_job_rankload.py` compares them): the
same `event` numbers, exact integer nanoseconds, and `args` values read as integers. What
this reader cannot promise to read the same — a file the loader would reject or explain,
a field of another JSON type, an `args` value that is not a plain integer — raises
`Unread`, and the caller decodes the file with the loader instead. Events the map does not
read are not validated: a defect there is the loader's to report, when it reads them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec
import polars as pl

from traceq.loader import frames as F
from traceq.loader.decode import (
    EXACT_FLOAT_LIMIT_US,
    MAX_TIME_US,
    TimesText,
    decimal_us_to_ns,
    float_us_to_ns,
)
from traceq.loader.source import read_bytes
from traceq.loader.split import compact
from traceq.relations.collectives import BACKEND_RANGE, COMM_KERNEL, COMM_OP

# Lower-cased categories of the frames the map reads (any case in the file, as the loader).
READ_CATS = frozenset([*F.OP_CATS, *F.RUNTIME_CATS, *F.GPU_CATS, *F.ANNOTATION_CATS])
STEP_PREFIX = "ProfilerStep#"  # a step window may carry any category (`loader.frames.steps`)
# `args` keys read, and the columns they become (`loader.frames` reads them the same way).
ARGS = {
    "External id": "_external_id",
    "external id": "_external_id_old",
    "correlation": "correlation",
    "device": "_device",
}
# Events whose whole `args` the map reads: collectives (`relations.collectives`).
COLLECTIVE_NAME = "|".join(f"(?:{p})" for p in (COMM_KERNEL, COMM_OP, BACKEND_RANGE))
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Unread(Exception):
    """The file needs the loader, to explain it or to read it exactly; says why."""


class _Args(msgspec.Struct, gc=False):
    """The `args` keys the map reads, as integers (as Kineto writes them)."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_old: int | None = msgspec.field(default=None, name="external id")
    correlation: int | None = None
    device: int | None = None


class _Event(msgspec.Struct, gc=False):
    """The fields the map reads, typed as the format requires: a value of another type
    fails the decode (`Unread`), where the loader would explain it, or read its text its
    own way (`as_int`: '7.0', 'stream 7'). `args` is the raw JSON text, decoded for every
    event in one batch (`_ARGS`, typed as before, so the same files go to the loader): a
    collective's whole `args` is this very slice."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: msgspec.Raw = msgspec.Raw(b"null")


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[_Event])
_ARGS = msgspec.json.Decoder(list[_Args | None])  # every event's `args`, one batch
_TIMES = msgspec.json.Decoder(list[TimesText])
_NONE = _Args()


@dataclass(frozen=True)
class RankEvents:
    """What the map reads of a rank: the metadata, `event, ph, cat` of every event, the
    events read (`read_frame`'s columns) and the `args` text of the collectives among
    them (`event, args`)."""

    metadata: dict[str, Any]
    phases: pl.DataFrame
    read: pl.DataFrame
    collective_args: pl.DataFrame

    @property
    def unread(self) -> pl.DataFrame:
        """How many events of each `ph` / `cat` the map did not read (flows, metadata,
        Python frames, ...): every event is either read or counted here."""
        return unread(self.phases, self.read)


def unread(phases: pl.DataFrame, read: pl.DataFrame) -> pl.DataFrame:
    """`ph, cat, events`: the events of `phases` not in `read`, counted, most first."""
    return (
        phases.join(read.select("event"), on="event", how="anti")
        .group_by("ph", "cat")
        .len("events")
        .sort("events", "ph", "cat", descending=[True, False, False], nulls_last=True)
    )


def read_rank(path: str | os.PathLike[str]) -> RankEvents:
    """The events of `path` the map reads; raises `Unread` when only the loader can say
    what the file holds, and the loader's `TraceError` for a file it cannot read at all."""
    buf = read_bytes(path)
    try:
        top = _TOP.decode(buf)
        array = top.pop("traceEvents")
        events = _EVENTS.decode(array)
        metadata = {key: msgspec.json.decode(value) for key, value in top.items()}
    except (msgspec.DecodeError, KeyError, RecursionError):
        raise Unread("not a trace object, or a field of another type") from None
    args = _decode_args(_field(events, "args"))
    phases = pl.DataFrame(
        {
            "ph": pl.Series(_field(events, "ph"), dtype=pl.Categorical),
            "cat": pl.Series(_field(events, "cat"), dtype=pl.Categorical),
        }
    ).with_row_index("event")
    texts = [*phases["ph"].unique().drop_nulls(), *phases["cat"].unique().drop_nulls()]
    if phases["ph"].null_count() or any(_CONTROL.search(text) for text in texts):
        raise Unread("an event without `ph`, or a control character")  # the loader rejects
    index = _read_index(phases, events)
    positions = index.to_list()
    read = [events[i] for i in positions]
    times = _times(read, lambda: _exact_times(array, index))
    frame = pl.DataFrame(
        {
            **phases[index].to_dict(),
            "name": pl.Series(_field(read, "name"), dtype=pl.String),
            "pid": _ids(_field(read, "pid")),
            "tid": _ids(_field(read, "tid")),
            **times,
            **_args([args[i] for i in positions]),
        }
    )
    if (frame["dur_ns"] < 0).any() or frame["name"].str.contains(_CONTROL.pattern).any():
        raise Unread("a negative duration, or a control character in a name")
    collectives = frame.with_row_index("_read").filter(pl.col("name").str.contains(COLLECTIVE_NAME))
    return RankEvents(metadata, phases, _finish(frame), _collective_args(read, collectives))


def _read_index(phases: pl.DataFrame, events: list[_Event]) -> pl.Series:
    """`event` of each complete event of `READ_CATS` (in any case) or named as a step."""
    cats = [cat for cat in phases["cat"].unique().drop_nulls() if cat.lower() in READ_CATS]
    complete = phases.filter(pl.col("ph") == "X")
    in_cats = pl.col("cat").is_in(cats).fill_null(False)
    others = complete.filter(~in_cats)["event"].to_list()
    steps = [i for i in others if (events[i].name or "").startswith(STEP_PREFIX)]
    return complete.filter(in_cats)["event"].extend(pl.Series(steps, dtype=pl.UInt32)).sort()


def _times(events: list[_Event], exact: Callable[[], dict[str, pl.Series]]) -> dict[str, pl.Series]:
    """`ts_ns`, `dur_ns` of the events read, exact as the loader's (`loader.decode`): from
    float64 where it cannot round, else from the decimal text (`exact`)."""
    ts = _field(events, "ts")
    dur = _field(events, "dur")
    times = pl.DataFrame([pl.Series("ts", ts, pl.Float64), pl.Series("dur", dur, pl.Float64)])
    peak = times.select(pl.max_horizontal(pl.all().abs().max())).item() or 0.0
    if peak >= MAX_TIME_US or times.null_count().sum_horizontal().item():
        raise Unread("a time beyond a clock reading, or an X event without times")
    if peak >= EXACT_FLOAT_LIMIT_US and any(type(t) is float for t in ts + dur):
        return exact()
    ns = times.select(float_us_to_ns(pl.col("ts")), float_us_to_ns(pl.col("dur")))
    return {"ts_ns": ns["ts"], "dur_ns": ns["dur"]}


def _exact_times(array: msgspec.Raw, index: pl.Series) -> dict[str, pl.Series]:
    """`ts_ns`, `dur_ns` from the decimal text of the events at `index` (the typed decode
    checked that each is a number)."""
    texts = _TIMES.decode(array)
    read = [texts[i] for i in index.to_list()]
    text = pl.DataFrame({"ts": _lines([t.ts for t in read]), "dur": _lines([t.dur for t in read])})
    ns = text.select(decimal_us_to_ns(pl.col("ts")), decimal_us_to_ns(pl.col("dur")))
    return {"ts_ns": ns["ts"], "dur_ns": ns["dur"]}


def _field(events: list[Any], name: str) -> list[Any]:
    return list(map(attrgetter(name), events))


def _lines(raws: list[msgspec.Raw]) -> pl.Series:
    return pl.Series([b"\n".join(raws).decode()]).str.split("\n").explode()


def _ids(ids: list[int | str | None]) -> pl.Series:
    """`pid` / `tid` as integers, as `loader.frames` reads them (`as_int` of the text):
    nearly always integers already, which Polars takes at once."""
    try:
        return pl.Series(ids, dtype=pl.Int64)
    except (TypeError, OverflowError):
        text = pl.Series([None if i is None else str(i) for i in ids], dtype=pl.String)
        return text.to_frame("id").select(F.as_int("id")).to_series()


def _decode_args(raws: list[msgspec.Raw]) -> list[_Args | None]:
    """Every event's `args` (raw JSON) decoded in one call; `Unread` when one is not an
    object (the loader rejects it) or an `ARGS` key's value is not an integer (the loader
    reads its text its own way)."""
    try:
        return _ARGS.decode(b"".join([b"[", b",".join(raws), b"]"]))
    except msgspec.DecodeError:
        raise Unread("an `args` that is not an object, or a key of another type") from None


def _args(decoded: list[_Args | None]) -> dict[str, pl.Series]:
    """The `ARGS` keys of each event's `args`, as integer columns; `Unread` when one
    does not fit 64 bits (the loader's `as_int` reads it as null)."""
    args = [a or _NONE for a in decoded]
    try:
        return {
            column: pl.Series(map(attrgetter(field), args), dtype=pl.Int64)
            for column, field in zip(ARGS.values(), _Args.__struct_fields__, strict=True)
        }
    except (OverflowError, TypeError):
        raise Unread("an `args` integer beyond 64 bits") from None


def _collective_args(read: list[_Event], collectives: pl.DataFrame) -> pl.DataFrame:
    """`event, args` of the collectives (`event`, and `_read`: their place in `read`):
    their `args` as the loader keeps the text (compacted; null when there is none)."""
    texts = [compact(read[i].args).decode() for i in collectives["_read"].to_list()]
    args = pl.Series(texts, dtype=pl.String)
    return pl.DataFrame({"event": collectives["event"], "args": args.replace("null", None)})


def _finish(frame: pl.DataFrame) -> pl.DataFrame:
    """`read_frame`'s columns from the raw ones (`cat` lower-cased, ids coalesced)."""
    return F.with_category_key(frame).select(
        "event",
        "ph",
        F.CATEGORY_KEY,
        "name",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        pl.coalesce("_external_id", "_external_id_old").alias("external_id"),
        "correlation",
        "_device",
    )


def read_frame(events: pl.DataFrame) -> pl.DataFrame:
    """The loader's events (`loader.decode`) as `read_rank` reads them: the events the
    map reads, `event, ph, _cat, name, pid, tid, ts_ns, dur_ns, external_id, correlation,
    _device`, each as `loader.frames` reads it."""
    rows = F.with_category_key(events).filter(
        (pl.col("ph") == "X")
        & (
            pl.col(F.CATEGORY_KEY).is_in(list(READ_CATS)).fill_null(False)
            | pl.col("name").str.starts_with(STEP_PREFIX).fill_null(False)
        )
    )
    rows = rows.select("event", "ph", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "args")
    args = F.args_frame(rows["args"], ARGS)
    ints = [F.as_int(column).alias(column) for column in ["pid", "tid", *ARGS.values()]]
    return _finish(pl.concat([rows.drop("args"), args], how="horizontal").with_columns(ints))
