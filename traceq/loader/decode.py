"""Decodes trace bytes into the top-level metadata and one Polars frame of raw events.

The hot path creates no Python object per field: `split` cuts the byte stream into raw
event slices at top-level boundaries (`decode_stream`, piece by piece, so the document is
never held whole) and each batch of slices is joined into NDJSON. Where the C pass is built
(`_events.c`, by setup.py where a compiler is), it reads each batch in one pass into Arrow
columns that Polars takes without copying; a batch it will not vouch for, and every batch
where it is not built, is parsed by Polars in Rust and by msgspec for `args`. `decode` does
the same on one whole buffer, with messages that count over the whole trace; it explains
bad input. Timestamps are rebuilt from their exact decimal text whenever
float64 would round them, so `ts_ns`/`dur_ns` are exact integer nanoseconds. Every entry of
`traceEvents` becomes one row of the frame (its position is the `event` column): nothing is
dropped here.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import polars as pl
from msgspec import UNSET, UnsetType

from traceq.errors import TraceFileError, TraceFormatError, TraceSchemaError
from traceq.loader.ahead import ahead
from traceq.loader.split import EventSlices, compact

try:  # the C pass (setup.py builds it where a compiler is; without one, Python reads all)
    from traceq.loader import _events
except ImportError:  # pragma: no cover - the test suite runs where it is built
    _events = None  # type: ignore[assignment]

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
}  # `args` is added as its exact JSON text
# Keys of the format that Kineto does not write (no event of ../shared/traces holds one).
# Polars' parse pays for every key of its schema in every row, present or not (~35 of 160
# ms of CPU per 100k events for these eight), so a batch is parsed without them when
# msgspec's pass over it, which runs anyway, met none. A trace that writes one in every
# event (Chrome's `tts`) costs a failed msgspec attempt that stops at its first event.
RARE_KEYS = ("tts", "tdur", "id2", "bind_id", "scope", "cname", "sf", "stack")
COMMON_SCHEMA = {key: dtype for key, dtype in EVENT_SCHEMA.items() if key not in RARE_KEYS}
# Few distinct values, one per row: as Categorical each costs 4 bytes a row instead of a
# 16-byte string view (2.16M events: 52 MB for the six instead of 200 MB). `name` stays
# text: rules, reports and SQL match it as a string everywhere.
CATEGORICAL = ("ph", "cat", "pid", "tid", "bp", "s")
BATCH = 100_000
# Below 2**43 us a float64 keeps 3 exact decimals; above it, re-read the text.
EXACT_FLOAT_LIMIT_US = float(2**43)
TIMED_PHASES = ("X", "B", "E", "i", "I", "C", "s", "t", "f", "b", "e", "n", "O", "N", "D")
# What Polars writes when a string field held another JSON type: check those rows strictly.
_SUSPECT_TEXT = (
    r'^(?:-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|\{\s*(?:".*|\})'
    r'|\[\s*(?:"|-?\d|\[|\{|\]|true|false|null).*)$'
)
_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
# `pid`/`tid` text that may have been another JSON type: an object, a list, a bool, a float.
_SUSPECT_ID = r"^(?:[\[{]|true$|false$|-?\d+(?:\.\d*)?(?:[eE]|\.))"
_BLANK = re.compile(rb"\s*\Z")
_BOM = b"\xef\xbb\xbf"
_BRACKET_OR_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')
_STRING_OR_INTEGER = re.compile(rb'"(?:[^"\\]++|\\.)*+"|(?<![\w.+-])-?\d+(?![\w.])')
# The integers Polars' JSON reader reads, even where it only skips a value (in `args`):
# past them it rejects the whole batch. JSON sets no limit; no profiler writes them.
POLARS_INTEGERS = (-(2**127), 2**128 - 1)
# What JSON calls the types of decoded values (messages never say "NoneType" or "dict").
JSON_TYPES: dict[type, str] = {
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
    dict: "an object",
    list: "an array",
}
# msgspec's type names in "Expected `float | null`, got `str` - at `$.ts`", in JSON's words;
# `int` is what an event's `pid` must be, so as a requirement it says "an integer".
_MSGSPEC_GOT = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean"}
_MSGSPEC_GOT |= {"null": "null", "object": "an object", "array": "an array"}
_MSGSPEC_WANT = {**_MSGSPEC_GOT, "int": "an integer"}
_MSGSPEC_MISMATCH = re.compile(
    r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)` - at `\$\.(?P<at>\w+)`$"
)
# Times in ns must fit in int64 even as ts + dur: 4e15 us is the year 2096 in epoch time.
MAX_TIME_US = 4e15


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


class _Fields(msgspec.Struct, gc=False):
    """The exact `args` text of an event, and whether its times were written as integers."""

    ts: int | float | None = None
    dur: int | float | None = None
    args: msgspec.Raw = msgspec.Raw(b"")


class _CommonFields(_Fields, gc=False):
    """`_Fields` of an event without the rare keys: any of them present fails validation
    (no value is ever `UNSET`), which tells the batch needs Polars' full schema, for free."""

    tts: UnsetType = UNSET
    tdur: UnsetType = UNSET
    id2: UnsetType = UNSET
    bind_id: UnsetType = UNSET
    scope: UnsetType = UNSET
    cname: UnsetType = UNSET
    sf: UnsetType = UNSET
    stack: UnsetType = UNSET


class _IntegerTimes(_CommonFields, gc=False):
    """`_CommonFields` of an event whose times are written as integers (older Kineto's epoch
    microseconds): a time with a fraction or an exponent fails validation, so a batch this
    decodes needs no look at how each time was written (3 ms a batch of 62k events, in
    the reading thread, which sets the decode's pace with the parsing one: 2.16M events'
    decode 3.84 -> 3.47 s and 3.61 -> 3.54 s, medians of 8 and 10 alternated). One with
    fractions (newer Kineto) fails at its first such time, which costs next to nothing,
    and is read as `_CommonFields`."""

    ts: int | None = None
    dur: int | None = None


class TimesText(msgspec.Struct, gc=False):
    """The exact decimal text of an event's times, read only when float64 may round them
    (here, and by the job's lean reader, `job.rankread`)."""

    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw] | list[msgspec.Raw])
_EVENT_SLICES = msgspec.json.Decoder(list[msgspec.Raw])
_FIELDS = msgspec.json.Decoder(_Fields)
_COMMON_FIELDS = msgspec.json.Decoder(_CommonFields)
_INTEGER_TIMES = msgspec.json.Decoder(_IntegerTimes)
_TIMES = msgspec.json.Decoder(TimesText)
# What `_read_args` tries, in order: each next one reads what the one before refused
# (a time with a fraction or an exponent, then one of the rare keys); the last refuses only
# bad input.
_READERS = (_INTEGER_TIMES, _COMMON_FIELDS, _FIELDS)
_STRICT = msgspec.json.Decoder(_StrictEvent)
_NO_ARGS = pl.Series("args", [], dtype=pl.String)


@dataclass(frozen=True)
class Decoded:
    """The trace's top-level keys (all but `traceEvents`) and its events, one row each."""

    metadata: dict[str, Any]
    events: pl.DataFrame


def decode(buf: bytes | bytearray | memoryview) -> Decoded:
    """Parse a whole trace document; raise a `TraceError` subclass on anything malformed."""
    buf = _without_bom(buf)
    if _BLANK.match(buf):
        raise TraceFileError("empty file (only whitespace)")
    try:
        top = _TOP.decode(buf)
    except msgspec.ValidationError:
        raise TraceFormatError(
            f"not a trace: the JSON document is {_json_type(buf)}, not an object with 'traceEvents'"
        ) from None
    except msgspec.DecodeError as exc:
        raise TraceFormatError(_json_problem(str(exc), buf)) from None
    except RecursionError:  # msgspec recurses per level, even into values kept raw
        raise TraceFormatError(_nesting_problem(buf)) from None
    if isinstance(top, list):  # the format's "JSON Array" form: just the events
        metadata: dict[str, Any] = {}
        slices = _EVENT_SLICES.decode(compact(buf))
    else:
        if "traceEvents" not in top:
            keys = ", ".join(_printable(key) for key in sorted(top)[:8]) or "none"
            raise TraceFormatError(
                f"not a trace: the JSON object has no 'traceEvents' (keys: {keys})"
            )
        metadata = {k: msgspec.json.decode(v) for k, v in top.items() if k != "traceEvents"}
        events_json = top["traceEvents"]
        try:
            slices = _EVENT_SLICES.decode(compact(events_json))
        except msgspec.ValidationError:
            raise TraceSchemaError(
                f"not a trace: 'traceEvents' is {_json_type(events_json)}, not an array"
            ) from None
    native = _native()
    frames = [
        _parsed(_read(slices[start : start + BATCH], start, native))
        for start in range(0, len(slices), BATCH)
    ]
    events = _concat(frames)
    _require_valid(events)
    _check_suspects(events, slices, 0)
    return Decoded(metadata=metadata, events=events)


def decode_stream(
    pieces: Iterable[bytes], on_events: Callable[[int], None] | None = None
) -> Decoded:
    """Parse a trace piece by piece (`split.EventSlices`): one piece of the document and
    the frame built so far are held, never the whole document. `on_events` hears the count
    of events parsed after each piece.

    Two cores work at once (`ahead`): a thread reads, cuts and joins the next batch, with
    msgspec's half of it where there is no C pass (`_read`, holding the GIL), while this
    thread reads the batch before (`_parsed`: the C pass or Polars, releasing it). The C
    pass stays here too: in the reading thread, beside the cutting, the decode was slower
    (2.60-3.01 against 2.26-2.78 s, 2.16M events, three alternated pairs). Polars' work
    stays in this thread, in order, as before: run in the other thread, its allocations
    interleaved with this one's, the peak grew by ~90 MB. The frames are those `decode`
    builds, batch for batch.

    Raises `Unsplittable` or a `TraceError` on bad input; the caller re-reads the file with
    `decode`, whose messages (counted over the whole trace) are the ones users see.
    """
    split = EventSlices(pieces)
    frames: list[pl.DataFrame] = []
    start, reported = 0, None
    batches = ahead(_read_batches(split, _native()))
    try:
        for read in batches:
            frame = _parsed(read)
            _check_suspects(frame, read.batch, read.start)
            frames.append(frame)
            start = read.start + len(read.batch)
            if read.piece_end and on_events is not None:
                on_events(reported := start)
    finally:
        batches.close()  # stops the reading thread when a batch failed
    if on_events is not None and reported != start:  # no events at all
        on_events(start)
    events = _concat(frames)
    _require_valid(events)
    metadata = {k: msgspec.json.decode(v) for k, v in split.metadata.items()}
    return Decoded(metadata=metadata, events=events)


@dataclass(frozen=True)
class _Read:
    """A batch with msgspec's half of its parse done (or its error), for Polars' half."""

    batch: list[msgspec.Raw]
    start: int
    ndjson: bytes
    float_times: bool  # a time written with a fraction or an exponent
    args: pl.Series
    schema: dict[str, pl.DataType]  # the keys Polars parses (`_read_args` says which)
    error: TraceSchemaError | None
    piece_end: bool  # the last batch of its piece: progress is reported after it
    native: bool = False  # both halves wait for `_parsed`'s one C pass (`_events`)


def _native() -> bool:
    """Whether the C pass reads the batches: built, and not turned off (`TRACEQ_NATIVE=0`)."""
    return _events is not None and os.environ.get("TRACEQ_NATIVE") != "0"


def _read_batches(split: EventSlices, native: bool) -> Iterator[_Read]:
    """Each piece's events in batches, read by msgspec (GIL held)."""
    start = 0
    for slices in split:
        for at in range(0, len(slices), BATCH):
            batch = slices[at : at + BATCH]
            yield _read(batch, start, native, piece_end=at + BATCH >= len(slices))
            start += len(batch)


def _read(batch: list[msgspec.Raw], start: int, native: bool, piece_end: bool = True) -> _Read:
    """A batch's events joined as NDJSON (compacted events hold no newline; every parser
    reads this copy), then msgspec's half of it unless the C pass (`native`) is to read
    it in `_parsed`."""
    ndjson = b"\n".join(batch)
    if native:
        return _Read(batch, start, ndjson, False, _NO_ARGS, COMMON_SCHEMA, None, piece_end, True)
    return _msgspec_half(batch, start, ndjson, piece_end)


def _msgspec_half(batch: list[msgspec.Raw], start: int, ndjson: bytes, piece_end: bool) -> _Read:
    """`_read_args` on a joined batch, or its error. `args` is each event's own JSON text,
    from msgspec: Polars would re-serialize it lossily (unescaped keys and backslashes, 1.0
    written as 1)."""
    try:
        float_times, args, schema = _read_args(ndjson, batch, start)
    except TraceSchemaError as exc:
        return _Read(batch, start, ndjson, False, _NO_ARGS, EVENT_SCHEMA, exc, piece_end)
    return _Read(batch, start, ndjson, float_times, args, schema, None, piece_end)


def _parsed(read: _Read) -> pl.DataFrame:
    """Polars' half of a batch: its parse, then msgspec's error if there was one (Polars'
    complaint first: its parse is the stricter one), then the assembled frame. A batch
    the C pass leaves alone gets msgspec's half here, then Polars' as always."""
    if read.native:
        frame = _native_frame(read)
        if frame is not None:
            return frame
        read = _msgspec_half(read.batch, read.start, read.ndjson, read.piece_end)
    frame = _read_fields(read.ndjson, read.batch, read.start, read.schema)
    if read.error is not None:
        raise read.error
    return _assemble(frame, read.float_times, read.args, read.ndjson, read.start)


class _Capsules:
    """A column as the Arrow PyCapsule interface hands it over (Polars imports it)."""

    def __init__(self, schema: object, array: object) -> None:
        self._capsules = (schema, array)

    def __arrow_c_array__(self, requested_schema: object = None) -> tuple[object, object]:
        return self._capsules


def _native_frame(read: _Read) -> pl.DataFrame | None:
    """The batch read by the C pass (`_events.c`, GIL released): the same columns and
    values as Polars' and msgspec's halves, or None where it leaves the batch to them
    (an escape, a non-ASCII byte, a value of an unusual type, a rare key, ...)."""
    parsed = _events.parse(read.ndjson, len(read.batch))
    if parsed is None:
        return None
    columns, float_times = parsed
    frame = pl.DataFrame([pl.Series(_Capsules(*column)) for column in columns])
    fields = _every_key(frame, COMMON_SCHEMA)
    return _assemble(fields, float_times, frame["args"], read.ndjson, read.start)


def json_type(value: Any) -> str:
    """What JSON calls `value`'s type: null, a boolean, a number, a string, an array, an object."""
    return JSON_TYPES.get(type(value), type(value).__name__)


def _json_type(raw: bytes | bytearray | memoryview | msgspec.Raw) -> str:
    return json_type(msgspec.json.decode(raw))


def _without_bom(buf: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
    """Drop a UTF-8 byte order mark (editors on Windows add one); JSON forbids it."""
    if bytes(buf[:3]) == _BOM:
        return memoryview(buf)[3:]
    return buf


def _json_problem(message: str, buf: bytes | bytearray | memoryview) -> str:
    if "truncated" in message:
        return "truncated JSON: the file ends mid-way (was the profiler stopped while writing?)"
    at = re.search(r"\(byte (\d+)\)", message)
    if at:
        start = max(int(at[1]) - 1, 0)  # msgspec points past a leading minus sign
        word = re.search(rb"-?(NaN|Infinity|inf|nan)", bytes(buf[start : start + 10]))
        if word:
            return (
                f"not valid JSON: {word[0].decode()} at byte {start + word.start()} "
                "(JSON has no NaN or Infinity; the writer produced an invalid number)"
            )
        byte = bytes(buf[int(at[1]) : int(at[1]) + 1])
        if byte and byte[0] < 0x20:
            return (
                f"not valid JSON: control character 0x{byte[0]:02x} inside a string at byte "
                f"{at[1]} (it must be written escaped)"
            )
    return f"not valid JSON: {message.removeprefix('JSON is malformed: ')}"


def _nesting_problem(buf: bytes | bytearray | memoryview) -> str:
    """Where a document nests too deeply to decode (a trace's events are a few levels deep).

    Runs only after the decoder gave up, so a scan in Python costs nothing on good input.
    """
    depth = deepest = where = 0
    for token in _BRACKET_OR_STRING.finditer(buf):
        if token[0] in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest, where = depth, token.start()
        elif token[0] in (b"]", b"}"):
            depth -= 1
    return (
        f"JSON nested too deeply: {deepest:,} levels of arrays or objects at byte {where} "
        f"(the decoder stops near {sys.getrecursionlimit():,}; trace events nest a few levels)"
    )


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The batches' frames as one (each batch is one chunk: later filters run 3x faster on
    few chunks than on Polars' hundreds), or the empty frame with every column."""
    if not frames:
        empty = _categorized(pl.DataFrame(schema={**EVENT_SCHEMA, "args": pl.String()}))
        return (
            empty.with_row_index("event")
            .with_columns(
                pl.lit(None, pl.Int64).alias("ts_ns"), pl.lit(None, pl.Int64).alias("dur_ns")
            )
            .drop("ts", "dur")
        )
    return without_null_storage(pl.concat(frames))


def without_null_storage(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with each all-null column as a broadcast null (Polars stores it as one
    scalar): a String column keeps a 16-byte view per row even for nulls, and 8 of the 20
    event columns (`tts`, `id2`, `stack`, ...) are null in every row of a Kineto trace:
    ~250 MB on 2.16M events. Values and dtypes are unchanged."""
    empty = [
        name for name, column in frame.to_dict().items() if column.null_count() == frame.height
    ]
    if not frame.height or not empty:
        return frame
    return frame.with_columns(pl.lit(None, frame.schema[name]).alias(name) for name in empty)


def _read_fields(
    ndjson: bytes, batch: list[msgspec.Raw], start: int, schema: dict[str, pl.DataType]
) -> pl.DataFrame:
    """Polars' parse of a batch's `schema` keys, one chunk (Polars returns 100s of chunks;
    later filters run 3x faster on one), with every key of `EVENT_SCHEMA`, in its order: the
    ones not parsed are null. Releases the GIL while it parses."""
    try:
        frame = pl.read_ndjson(io.BytesIO(ndjson), schema=schema).rechunk()
    except pl.exceptions.PolarsError as exc:
        raise _explain(batch, start, exc) from None
    return frame if len(schema) == len(EVENT_SCHEMA) else _every_key(frame, schema)


def _every_key(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """`frame`'s columns of `schema`'s keys, and the other keys of `EVENT_SCHEMA` as nulls,
    in `EVENT_SCHEMA`'s order."""
    return frame.select(
        pl.col(key) if key in schema else pl.lit(None, dtype).alias(key)
        for key, dtype in EVENT_SCHEMA.items()
    )


def _read_args(
    ndjson: bytes, batch: list[msgspec.Raw], start: int
) -> tuple[bool, pl.Series, dict[str, pl.DataType]]:
    """msgspec's pass over a batch: whether a time was written with a fraction or an
    exponent, the `args` column (each event's raw `args`), and the schema Polars is to
    parse (without `RARE_KEYS` unless an event holds one). `decode_stream` runs it in its
    reading thread, the `args` column and the look at the times too: that thread waits for
    the other, which parses and assembles, so what it takes of the other's work shortens
    the load (2.16M events: 6.1 -> 5.1 s, median of 5 alternated decodes)."""
    fields, decoder = _decode_fields(ndjson, batch, start)
    schema = EVENT_SCHEMA if decoder is _FIELDS else COMMON_SCHEMA
    float_times = decoder is not _INTEGER_TIMES and any(
        type(f.ts) is float or type(f.dur) is float for f in fields
    )
    text = _args_text(b"\n".join([f.args for f in fields]), start)
    return float_times, _args_column(text, len(fields)), schema


def _decode_fields(
    ndjson: bytes, batch: list[msgspec.Raw], start: int
) -> tuple[list[_Fields], msgspec.json.Decoder]:
    """The batch read by the first of `_READERS` that takes it, and that decoder; what
    the last refuses is bad input, which `_explain` words."""
    *lenient, strictest = _READERS
    for decoder in lenient:
        with contextlib.suppress(msgspec.DecodeError):  # a fraction, or a rare key
            return decoder.decode_lines(ndjson), decoder
    try:
        return strictest.decode_lines(ndjson), strictest
    except msgspec.DecodeError as exc:
        raise _explain(batch, start, exc) from None


def _assemble(
    frame: pl.DataFrame, float_times: bool, args: pl.Series, ndjson: bytes, start: int
) -> pl.DataFrame:
    """The batch's frame: row index, `args` text, exact times, Categorical columns."""
    frame = frame.with_row_index("event", offset=start).with_columns(args)
    return _categorized(without_null_storage(_with_exact_times(frame, float_times, ndjson)))


def _categorized(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col(CATEGORICAL).cast(pl.Categorical))


def _args_text(text: bytes, start: int) -> str:
    """The batch's `args`, one line each, as text."""
    try:
        return text.decode()
    except UnicodeDecodeError as exc:
        event = start + text.count(b"\n", 0, exc.start)
        raise TraceSchemaError(f"event {event}: 'args' is not valid UTF-8") from None


def _args_column(lines: str, n: int) -> pl.Series:
    """Each event's raw `args` text, one line each; a missing or null `args` is null."""
    args = _lines(lines, n)
    return args.to_frame().select(pl.when(args != "null").then(args)).to_series().alias("args")


def _explain(batch: list[msgspec.Raw], start: int, exc: Exception) -> TraceSchemaError:
    """Find the first event of a batch Polars rejected and say what is wrong with it."""
    for offset, raw in enumerate(batch):
        if bytes(raw).lstrip()[:1] != b"{":
            return TraceSchemaError(
                f"event {start + offset} is {_json_type(raw)}, not a JSON object"
            )
        try:
            _STRICT.decode(raw)
        except msgspec.DecodeError as err:
            return _strict_problem(start + offset, err)
    for offset, raw in enumerate(batch):
        number = _unreadable_integer(bytes(raw))
        if number is not None:
            shown = number if len(number) <= 24 else f"{number[:12]}...{number[-6:]}"
            return TraceSchemaError(
                f"event {start + offset} holds the integer {shown} ({len(number.lstrip('-'))} "
                f"digits), beyond what the parser reads ({POLARS_INTEGERS[0]:.2e} to "
                f"{POLARS_INTEGERS[1]:.2e})"
            )
    first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return TraceSchemaError(f"events {start}..{start + len(batch) - 1}: {first_line}")


def _unreadable_integer(raw: bytes) -> str | None:
    """The first integer of an event's text (outside strings) that Polars cannot read.
    Runs only on a batch Polars rejected and msgspec accepted."""
    low, high = POLARS_INTEGERS
    for token in _STRING_OR_INTEGER.finditer(raw):
        text = token[0]
        if text[:1] != b'"' and not low <= int(text) <= high:
            return text.decode()
    return None


def _with_exact_times(events: pl.DataFrame, float_times: bool, ndjson: bytes) -> pl.DataFrame:
    """Add `ts_ns`/`dur_ns`, exact integers, and drop the float microsecond columns."""
    _require(
        events,
        pl.max_horizontal(pl.col("ts").abs(), pl.col("dur").abs()) >= MAX_TIME_US,
        f"has a timestamp or duration beyond {MAX_TIME_US:.0e} us (not a clock reading)",
    )
    if _floats_may_round(events, float_times):
        texts = _TIMES.decode_lines(ndjson)
        n = events.height
        ts_text = _lines(b"\n".join([t.ts for t in texts]).decode(), n)
        dur_text = _lines(b"\n".join([t.dur for t in texts]).decode(), n)
        times = pl.DataFrame({"ts": ts_text, "dur": dur_text}).select(
            decimal_us_to_ns(pl.col("ts")).alias("ts_ns"),
            decimal_us_to_ns(pl.col("dur")).alias("dur_ns"),
        )
        events = events.with_columns(times)
    else:
        events = events.with_columns(
            float_us_to_ns(pl.col("ts")).alias("ts_ns"),
            float_us_to_ns(pl.col("dur")).alias("dur_ns"),
        )
    return events.drop("ts", "dur")


def _floats_may_round(events: pl.DataFrame, float_times: bool) -> bool:
    """Whether float64 may have rounded a timestamp's decimal text.

    Below 2**43 us it cannot (three decimals stay exact). Above, integers are still exact
    (times are below MAX_TIME_US < 2**53), so only a time written with a fraction or an
    exponent (`float_times`: msgspec handed it over as a float) needs the text.
    """
    if not float_times:
        return False
    time = pl.col("ts"), pl.col("dur")
    peak = events.select(pl.max_horizontal(c.abs().max() for c in time)).item() or 0.0
    return peak >= EXACT_FLOAT_LIMIT_US


def _lines(text: str, n: int) -> pl.Series:
    if n == 0:
        return pl.Series([], dtype=pl.String)
    lines = pl.Series([text]).str.split("\n").explode()
    return lines.to_frame().select(pl.when(lines != "").then(lines)).to_series()


def decimal_us_to_ns(text: pl.Expr) -> pl.Expr:
    """Exact: '1712195495519689.047' -> 1712195495519689047. Exponents fall back to floats.

    Digits below the nanosecond (Kineto writes none) round to the nearest, ties away from 0.
    """
    whole = text.str.extract(r"^(-?\d+)(?:\.\d*)?$", 1)
    frac = text.str.extract(r"^-?\d+\.(\d+)$", 1).fill_null("0")
    sub_ns = frac.str.slice(3, 1).fill_null("0") >= "5"
    frac_ns = frac.str.slice(0, 3).str.pad_end(3, "0").cast(pl.Int64) + sub_ns.cast(pl.Int64)
    sign = pl.when(text.str.starts_with("-")).then(-1).otherwise(1)
    exact = whole.cast(pl.Int64) * 1000 + sign * frac_ns
    fallback = float_us_to_ns(text.cast(pl.Float64, strict=False))
    return pl.when(whole.is_not_null()).then(exact).otherwise(fallback)


def float_us_to_ns(us: pl.Expr) -> pl.Expr:
    """Exact below 2**43 us: the fraction is taken apart from the integer before scaling."""
    whole = us.floor()
    return whole.cast(pl.Int64) * 1000 + ((us - whole) * 1000).round().cast(pl.Int64)


def _require_valid(events: pl.DataFrame) -> None:
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
    for key in ("name", "cat", "ph"):
        _require(events, _contains(events, key, _CONTROL), f"has a control character in '{key}'")


def _contains(events: pl.DataFrame, column: str, pattern: str) -> pl.Expr:
    """Rows whose `column` matches `pattern`. A Categorical column holds a few distinct
    values: those are matched, not every row's text (casting 2.16M Categorical rows back to
    strings for five regex checks cost more than the checks)."""
    if events.schema[column] != pl.Categorical:
        return pl.col(column).str.contains(pattern)
    values = events[column].unique().drop_nulls().cast(pl.String)
    matching = values.filter(values.str.contains(pattern))
    if matching.is_empty():
        return pl.lit(False)
    return pl.col(column).cast(pl.String).is_in(matching.implode())


def _check_suspects(events: pl.DataFrame, slices: list[msgspec.Raw], start: int) -> None:
    """Re-read strictly the events whose text fields may have held another JSON type
    (Polars writes a number or an object given for a string field as its text)."""
    suspects = events.filter(
        pl.any_horizontal(
            *(_contains(events, f, _SUSPECT_TEXT) for f in ("name", "cat", "ph")),
            *(_contains(events, f, _SUSPECT_ID) for f in ("pid", "tid")),
        )
    )["event"]
    for event in suspects.to_list():
        try:
            _STRICT.decode(slices[event - start])
        except msgspec.DecodeError as err:
            raise _strict_problem(event, err) from None


def _strict_problem(event: int, err: msgspec.DecodeError) -> TraceSchemaError:
    """msgspec's message in JSON's words: "event 3: 'ts' is a string, not a number or null"."""
    mismatch = _MSGSPEC_MISMATCH.match(str(err))
    if mismatch is None:
        where = str(err).replace("`$.", "'").replace("`", "'")
        return TraceSchemaError(f"event {event}: {where}")
    want = [_MSGSPEC_WANT.get(t, t) for t in mismatch["want"].split(" | ")]
    got = _MSGSPEC_GOT.get(mismatch["got"], mismatch["got"])
    wanted = ", ".join(want[:-1]) + " or " + want[-1] if len(want) > 1 else want[0]
    return TraceSchemaError(f"event {event}: '{mismatch['at']}' is {got}, not {wanted}")


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
    return re.sub(r"[\x00-\x1f\x7f]", "?", name)[:60]  # messages stay on one line
