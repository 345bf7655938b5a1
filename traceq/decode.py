"""Decodes trace bytes into the top-level metadata and one Polars frame of raw events.

The hot path creates no Python object per field: msgspec validates the JSON and splits
`traceEvents` into raw slices, the slices are joined into NDJSON, and Polars parses them in
Rust. Timestamps are rebuilt from their exact decimal text whenever float64 would round them,
so `ts_ns`/`dur_ns` are exact integer nanoseconds. Every entry of `traceEvents` becomes one
row of the frame (its position is the `event` column): nothing is dropped here.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

import msgspec
import polars as pl

from traceq.errors import TraceFormatError, TraceSchemaError

# Keys of the Trace Event Format (Chrome's spec); values stay text unless numeric by spec.
EVENT_SCHEMA: dict[str, pl.DataType] = {
    "ph": pl.String(),
    "cat": pl.String(),
    "name": pl.String(),
    "pid": pl.String(),
    "tid": pl.String(),
    "ts": pl.Float64(),
    "dur": pl.Float64(),
    "tts": pl.Float64(),
    "tdur": pl.Float64(),
    "id": pl.String(),
    "id2": pl.String(),
    "bind_id": pl.String(),
    "bp": pl.String(),
    "s": pl.String(),
    "scope": pl.String(),
    "cname": pl.String(),
    "sf": pl.String(),
    "stack": pl.String(),
    "args": pl.String(),
}
BATCH = 200_000
# Below 2**43 us a float64 keeps 3 exact decimals; above it, re-read the text.
EXACT_FLOAT_LIMIT_US = float(2**43)
TIMED_PHASES = ("X", "B", "E", "i", "I", "C", "s", "t", "f", "b", "e", "n", "O", "N", "D")
# NUL cannot occur in valid JSON, so it separates events; newlines inside events go.
_TO_NDJSON = bytes.maketrans(b"\n\r\x00", b"  \n")
# What Polars writes when a string field held another JSON type: check those rows strictly.
_SUSPECT_TEXT = (
    r'^(?:-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|\{\s*(?:".*|\})'
    r'|\[\s*(?:"|-?\d|\[|\{|\]|true|false|null).*)$'
)
EXACT_CHECK_BELOW = 100_000  # events; above, the floats themselves show whether text is needed
_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"


class _StrictEvent(msgspec.Struct):
    """The types the format requires; used only to explain a rejected event precisely."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: dict[str, Any] | None = None


class _Times(msgspec.Struct, gc=False):
    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw] | list[msgspec.Raw])
_EVENT_SLICES = msgspec.json.Decoder(list[msgspec.Raw])
_TIMES = msgspec.json.Decoder(list[_Times])
_STRICT = msgspec.json.Decoder(_StrictEvent)


@dataclass(frozen=True)
class Decoded:
    """The trace's top-level keys (all but `traceEvents`) and its events, one row each."""

    metadata: dict[str, Any]
    events: pl.DataFrame


def decode(buf: bytes | bytearray | memoryview) -> Decoded:
    """Parse a whole trace document; raise a `TraceError` subclass on anything malformed."""
    try:
        top = _TOP.decode(buf)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(_json_problem(str(exc))) from None
    if isinstance(top, list):  # the format's "JSON Array" form: just the events
        metadata: dict[str, Any] = {}
        slices = top
        events_json: bytes | msgspec.Raw = b""
    else:
        if "traceEvents" not in top:
            keys = ", ".join(sorted(top)[:8]) or "none"
            raise TraceFormatError(
                f"not a trace: the JSON object has no 'traceEvents' (keys: {keys})"
            )
        metadata = {k: msgspec.json.decode(v) for k, v in top.items() if k != "traceEvents"}
        events_json = top["traceEvents"]
        try:
            slices = _EVENT_SLICES.decode(events_json)
        except msgspec.ValidationError:
            raise TraceSchemaError("not a trace: 'traceEvents' is not a list") from None
    events = _parse_events(slices)
    events = _with_exact_times(events, slices, events_json)
    _validate(events, slices)
    return Decoded(metadata=metadata, events=events)


def _json_problem(message: str) -> str:
    if "truncated" in message:
        return "truncated JSON: the file ends mid-way (was the profiler stopped while writing?)"
    return f"not valid JSON: {message.removeprefix('JSON is malformed: ')}"


def _parse_events(slices: list[msgspec.Raw]) -> pl.DataFrame:
    frames = []
    for start in range(0, len(slices), BATCH):
        batch = slices[start : start + BATCH]
        ndjson = b"\x00".join(batch).translate(_TO_NDJSON)
        try:
            frames.append(pl.read_ndjson(io.BytesIO(ndjson), schema=EVENT_SCHEMA))
        except pl.exceptions.PolarsError as exc:
            raise _explain(batch, start, exc) from None
    if not frames:
        return pl.DataFrame(schema=EVENT_SCHEMA).with_row_index("event")
    return pl.concat(frames, rechunk=False).with_row_index("event")


def _explain(batch: list[msgspec.Raw], start: int, exc: Exception) -> TraceSchemaError:
    """Find the first event of a batch Polars rejected and say what is wrong with it."""
    for offset, raw in enumerate(batch):
        if bytes(raw).lstrip()[:1] != b"{":
            kind = type(msgspec.json.decode(raw)).__name__
            return TraceSchemaError(f"event {start + offset} is a JSON {kind}, not an object")
        try:
            _STRICT.decode(raw)
        except msgspec.DecodeError as err:
            where = str(err).replace("`$.", "'").replace("`", "'")
            return TraceSchemaError(f"event {start + offset}: {where}")
    first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return TraceSchemaError(f"events {start}..{start + len(batch) - 1}: {first_line}")


def _with_exact_times(
    events: pl.DataFrame, slices: list[msgspec.Raw], events_json: bytes | msgspec.Raw
) -> pl.DataFrame:
    """Add `ts_ns`/`dur_ns`, exact integers, and drop the float microsecond columns."""
    needs_text = _floats_may_round(events)
    if needs_text:
        ts_text, dur_text = _time_texts(slices, events_json)
        times = pl.DataFrame({"ts": ts_text, "dur": dur_text}).select(
            _decimal_us_to_ns(pl.col("ts")).alias("ts_ns"),
            _decimal_us_to_ns(pl.col("dur")).alias("dur_ns"),
        )
        events = events.with_columns(times)
    else:
        events = events.with_columns(
            _float_us_to_ns(pl.col("ts")).alias("ts_ns"),
            _float_us_to_ns(pl.col("dur")).alias("dur_ns"),
        )
    return events.drop("ts", "dur")


def _floats_may_round(events: pl.DataFrame) -> bool:
    """Whether float64 may have rounded a timestamp's decimal text.

    Below 2**43 us it cannot. Above, a trace with fractional timestamps shows non-integral
    floats in almost every event (the float spacing there is 1/4 us), so a large trace whose
    floats are all integral has integral text; small traces are simply re-read.
    """
    time = pl.col("ts"), pl.col("dur")
    peak = events.select(pl.max_horizontal(c.abs().max() for c in time)).item() or 0.0
    if peak < EXACT_FLOAT_LIMIT_US:
        return False
    if events.height < EXACT_CHECK_BELOW:
        return True
    fractional = events.select(pl.any_horizontal((c != c.floor()).any() for c in time)).item()
    return bool(fractional)


def _time_texts(
    slices: list[msgspec.Raw], events_json: bytes | msgspec.Raw
) -> tuple[pl.Series, pl.Series]:
    source = events_json or b"[" + b",".join(slices) + b"]"
    times = _TIMES.decode(source)
    ts = b"\n".join([t.ts for t in times]).decode()
    dur = b"\n".join([t.dur for t in times]).decode()
    return _lines(ts, len(times)), _lines(dur, len(times))


def _lines(text: str, n: int) -> pl.Series:
    if n == 0:
        return pl.Series([], dtype=pl.String)
    series = pl.Series([text]).str.split("\n").explode()
    return series.replace("", None)


def _decimal_us_to_ns(text: pl.Expr) -> pl.Expr:
    """Exact: '1712195495519689.047' -> 1712195495519689047. Exponents fall back to floats."""
    whole = text.str.extract(r"^(-?\d+)(?:\.\d*)?$", 1)
    frac = text.str.extract(r"^-?\d+\.(\d+)$", 1).fill_null("0")
    frac_ns = frac.str.slice(0, 3).str.pad_end(3, "0").cast(pl.Int64)
    sign = pl.when(text.str.starts_with("-")).then(-1).otherwise(1)
    exact = whole.cast(pl.Int64) * 1000 + sign * frac_ns
    fallback = _float_us_to_ns(text.cast(pl.Float64, strict=False))
    return pl.when(whole.is_not_null()).then(exact).otherwise(fallback)


def _float_us_to_ns(us: pl.Expr) -> pl.Expr:
    """Exact below 2**43 us: the fraction is taken apart from the integer before scaling."""
    whole = us.floor()
    return whole.cast(pl.Int64) * 1000 + ((us - whole) * 1000).round().cast(pl.Int64)


def _validate(events: pl.DataFrame, slices: list[msgspec.Raw]) -> None:
    """Reject what no reader could interpret: the format's required fields and types."""
    _require(events, pl.col("ph").is_null(), "has no 'ph' (event phase)")
    timed = pl.col("ph").is_in(TIMED_PHASES)
    _require(events, timed & pl.col("ts_ns").is_null(), "has no 'ts' (timestamp)")
    _require(
        events,
        (pl.col("ph") == "X") & pl.col("dur_ns").is_null(),
        "is a complete event (ph X) without 'dur'",
    )
    _require(events, pl.col("dur_ns") < 0, "has a negative duration")
    _require(
        events,
        pl.col("args").is_not_null() & ~pl.col("args").str.starts_with("{"),
        "has 'args' that is not an object",
    )
    for field in ("name", "cat", "ph"):
        _require(
            events, pl.col(field).str.contains(_CONTROL), f"has a control character in '{field}'"
        )
    suspects = events.filter(
        pl.any_horizontal(pl.col(f).str.contains(_SUSPECT_TEXT) for f in ("name", "cat", "ph"))
    )["event"]
    for event in suspects.to_list():
        try:
            _STRICT.decode(slices[event])
        except msgspec.DecodeError as err:
            where = str(err).replace("`$.", "'").replace("`", "'")
            raise TraceSchemaError(f"event {event}: {where}") from None


def _require(events: pl.DataFrame, bad: pl.Expr, problem: str) -> None:
    offenders = events.filter(bad)
    if offenders.height:
        first = offenders.row(0, named=True)
        name = _printable(first["name"])
        more = f" (and {offenders.height - 1} more)" if offenders.height > 1 else ""
        raise TraceSchemaError(f"event {first['event']} ({name!s}) {problem}{more}")


def _printable(name: str | None) -> str:
    if name is None:
        return "unnamed"
    return re.sub(_CONTROL, "?", name)[:60]
