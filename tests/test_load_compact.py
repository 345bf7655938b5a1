"""The loader's memory savers keep every value: events compacted at the cut (exact `args`
text, minus the whitespace between tokens), Categorical text columns, `args` keys parsed a
slice at a time and only where they occur, integer keys as Int64 (text and `as_int` where a
value is not a JSON integer), the slower integer readings only where needed,
and flows in the same order as one three-key sort.

References are independent: the stdlib `json` for values, a whole-text `pl.read_ndjson`
for `args_frame`, a plain-Python reading for `as_int`, Polars' own multi-key sort.
"""

from __future__ import annotations

import io
import json
import re

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import traceq
from traceq.loader import frames as F
from traceq.loader.decode import CATEGORICAL, POLARS_INTEGERS, decode, decode_stream

ARGS = (
    '{"a" : 1.0 ,\n "b\\u00e9": "x\\n\\"}\\u00e9",  "c": 1e300, "d": -0.0,'
    ' "e": [ 1, {"f" : null} ], "big": 123456789012345678901234567890}'
)
WHITESPACE_OUTSIDE_STRINGS = re.compile(r'("(?:[^"\\]|\\.)*")|\s+')


def without_whitespace(text: str) -> str:
    return WHITESPACE_OUTSIDE_STRINGS.sub(lambda m: m[1] or "", text)


def document(args_text: str, indent: str = "\n   ") -> bytes:
    event = (
        f'{{{indent}"ph": "X",{indent}"cat": "cpu_op",{indent}"name": "aten::mm",'
        f'{indent}"pid": 7,{indent}"tid": 8,{indent}"ts": 1.5,{indent}"dur": 2,'
        f'{indent}"args": {args_text}\n  }}'
    )
    return ('{"traceEvents": [\n  ' + ",\n  ".join([event] * 3) + "\n]}").encode()


def test_args_keep_their_exact_text_without_the_whitespace_between_tokens() -> None:
    data = document(ARGS)
    for decoded in (decode(data), decode_stream([data[i : i + 7] for i in range(0, 999, 7)])):
        args = decoded.events["args"].to_list()
        assert args == [without_whitespace(ARGS)] * 3
        assert [json.loads(a) for a in args] == [json.loads(ARGS)] * 3
        assert "1.0" in args[0] and "1e300" in args[0] and "\\u00e9" in args[0]


def test_text_columns_with_few_values_are_categorical_everywhere() -> None:
    trace = traceq.load(io.BytesIO(document(ARGS)), cache=False)
    for column in CATEGORICAL:
        assert trace.events.schema[column] == pl.Categorical, column
    assert trace.events.schema["name"] == pl.String and trace.events.schema["args"] == pl.String
    assert trace.events["ph"].to_list() == ["X"] * 3
    assert trace.ops["pid"].to_list() == [7] * 3 and trace.ops["tid"].to_list() == [8] * 3
    found = trace.sql("SELECT count(*) AS n FROM events WHERE cat = 'cpu_op' AND ph = 'X'")
    assert found["n"].item() == 3
    like = trace.sql("SELECT count(*) AS n FROM events WHERE cat LIKE 'cpu%' AND pid LIKE '7'")
    assert like["n"].item() == 3


keys = st.sampled_from(["a", "b c", "External id", "stream", 'q"', "é"])
# Integers as far as Polars reads them (past them the loader refuses the trace, in one line).
integers = st.integers(*POLARS_INTEGERS)
values = st.none() | st.integers(-5, 5) | st.text(max_size=4) | st.lists(integers, max_size=2)
args_texts = st.none() | st.dictionaries(keys, values, max_size=4).map(
    lambda d: json.dumps(d, ensure_ascii=False)
)


@settings(max_examples=60, deadline=None)
@given(st.lists(args_texts, max_size=20), st.integers(1, 8))
def test_args_frame_equals_one_parse_of_the_whole_text(texts: list, rows: int) -> None:
    fields = {"a": "_a", "b c": "bc", "External id": "ext", "missing": "_m", 'q"': "q", "é": "e"}
    args = pl.Series("args", texts, dtype=pl.String)
    whole = args.fill_null("{}").str.join("\n").cast(pl.Binary).item()
    schema = {key: pl.String() for key in fields}
    expected = (
        pl.read_ndjson(whole, schema=schema).rename(fields)
        if len(texts)
        else pl.DataFrame(schema=schema).rename(fields)
    )
    F.ARGS_ROWS, saved = rows, F.ARGS_ROWS
    try:
        assert_frame_equal(F.args_frame(args, fields), expected)
    finally:
        F.ARGS_ROWS = saved


id_values = (
    st.none()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["0x0", "7", " 8 ", "stream 7", "3.5", "x"])
    | st.booleans()
    | st.lists(st.integers(0, 3), max_size=2)
)
id_texts = st.none() | st.dictionaries(
    st.sampled_from(["correlation", "stream", "name"]), id_values, max_size=3
).map(json.dumps)


@settings(max_examples=80, deadline=None)
@given(st.lists(id_texts, min_size=1, max_size=20), st.integers(1, 8))
def test_integer_args_read_as_int64_equal_the_text_read_through_as_int(
    texts: list, rows: int
) -> None:
    # Slices whose every id is a JSON integer parse as Int64; a slice holding anything else
    # ("0x0", 3.5, 2**70, true, a list) is read as text and through `as_int`, as before
    fields = {"correlation": "_correlation", "stream": "_stream", "name": "name"}
    args = pl.Series("args", texts, dtype=pl.String)
    whole = args.fill_null("{}").str.join("\n").cast(pl.Binary).item()
    as_text = pl.read_ndjson(whole, schema=dict.fromkeys(fields, pl.String())).rename(fields)
    expected = as_text.with_columns(F.as_int(c).alias(c) for c in ("_correlation", "_stream"))
    F.ARGS_ROWS, saved = rows, F.ARGS_ROWS
    try:
        got = F.args_frame(args, fields, integers=("correlation", "stream"))
    finally:
        F.ARGS_ROWS = saved
    assert_frame_equal(got, expected)


def test_args_frame_finds_a_key_written_with_an_escape() -> None:
    args = pl.Series(['{"Input\\u0020Dims":[[1,2]]}', None, '{"x":1}'])
    frame = F.args_frame(args, {"Input Dims": "dims", "x": "x"})
    assert frame["dims"].to_list() == ["[[1, 2]]", None, None]
    assert frame["x"].to_list() == [None, None, "1"]


def reference_int(text: str | None) -> int | None:
    """The readings `as_int` promises, in plain Python."""
    if text is None:
        return None
    for reading in (lambda t: int(t), lambda t: int(float(t))):
        try:
            value = reading(text.strip())
        except ValueError:
            continue
        return value if -(2**63) <= value < 2**63 else None
    trailing = re.search(r"(-?\d+)$", text.strip())
    return int(trailing[1]) if trailing and -(2**63) <= int(trailing[1]) < 2**63 else None


@pytest.mark.parametrize(
    "texts",
    [
        ["7", "-4", None],  # plain integers only: the fast path
        ["7", " 8 ", "stream 7", "3.0", None, "x", "0x0", "1e3", "99999999999999999999"],
    ],
)
def test_as_int_reads_every_form_and_only_those(texts: list[str | None]) -> None:
    got = pl.DataFrame({"t": texts}, schema={"t": pl.String}).select(F.as_int("t"))["t"]
    assert got.to_list() == [reference_int(t) for t in texts]
    categorical = pl.DataFrame({"t": texts}, schema={"t": pl.Categorical})
    assert categorical.select(F.as_int("t"))["t"].to_list() == got.to_list()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("sf"), st.integers(0, 6), st.integers(0, 3))))
def test_flows_are_ordered_as_by_one_three_key_sort(points: list[tuple[str, int, int]]) -> None:
    frame = pl.DataFrame(
        {
            "event": list(range(len(points))),
            "ph": [p for p, _, _ in points],
            "cat": ["ac2g"] * len(points),
            "flow_id": [str(i) for _, i, _ in points],
            "pid": [1] * len(points),
            "tid": [1] * len(points),
            "ts_ns": [t for _, _, t in points],
        },
        schema_overrides={"event": pl.UInt32, "ph": pl.Categorical, "cat": pl.Categorical},
    )
    flows = F.flows(frame)
    expected = flows.sort("start_ts_ns", "start_event", "end_event", nulls_last=True)
    assert_frame_equal(flows, expected)


def test_the_largest_integers_polars_reads_load_with_their_exact_text() -> None:
    low, high = POLARS_INTEGERS
    text = f'{{"a": [{low}, {high}], "b": 0.{"1" * 45}, "c": "{"9" * 50}"}}'
    trace = traceq.load(io.BytesIO(document(text)), cache=False)
    assert trace.events["args"].to_list() == [without_whitespace(text)] * 3
    assert trace.ops.height == 3


# List texts as `args_frame` hands them over: Polars' own rendering of a JSON list, or a
# string value that looks like one; from a small alphabet on which Python's and Rust's
# regexes agree (both read `\s` and `\d` as Unicode: a no-break space, an Arabic digit).
list_texts = st.none() | st.text(alphabet="[]0123456789-, \t\u00a0\u0661x", max_size=14)
i64 = st.integers(-(2**63), 2**63 - 1) | st.integers(2**63, 2**70)


def in_int64(value: int) -> int | None:
    return value if -(2**63) <= value < 2**63 else None


def reference_int_list(text: str | None) -> list[int | None] | None:
    """`int_list` in plain Python: the regex's lists, each comma-separated item an integer
    (null past int64)."""
    if text is None or not re.fullmatch(F._INT_LIST_TEXT, text):
        return None
    inside = text[1:-1]
    if not inside.strip():
        return []
    items = [item.strip() for item in inside.split(",")]
    return [in_int64(int(item)) if item.lstrip("-").isascii() else None for item in items]


@settings(max_examples=300, deadline=None)
@given(st.lists(list_texts | st.lists(i64, max_size=4).map(json.dumps), min_size=1))
def test_int_list_reads_what_its_regex_lets_through(texts: list[str | None]) -> None:
    got = pl.DataFrame({"t": texts}, schema={"t": pl.String}).select(F.int_list("t"))["t"]
    assert got.to_list() == [reference_int_list(t) for t in texts]


def reference_shape(text: str | None) -> list[list[int | None]] | None:
    if text is None or not re.fullmatch(F._SHAPE_TEXT, text):
        return None
    return [[in_int64(item) for item in dims] for dims in json.loads(text)]


shape_texts = st.lists(st.lists(i64, max_size=3), max_size=3).map(json.dumps)
spaced_shapes = shape_texts.map(lambda t: t.replace(",", " , ").replace("[", "[ "))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | shape_texts | spaced_shapes | st.sampled_from(["[[[1]]]", "[1]"])))
def test_shapes_read_each_list_of_integers_and_nothing_deeper(texts: list[str | None]) -> None:
    got = pl.DataFrame({"t": texts}, schema={"t": pl.String}).select(F.shapes("t"))["t"]
    assert got.to_list() == [reference_shape(t) for t in texts]


def reference_str_list(text: str | None) -> list[str] | None:
    if text is None or not re.fullmatch(F._STR_LIST_TEXT, text):
        return None
    return json.loads(text)


str_list_texts = st.lists(st.text(max_size=5), max_size=3).map(json.dumps)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | str_list_texts | st.sampled_from(['["a""b"]', '["a",]', "[1]"])))
def test_str_list_reads_json_strings_with_or_without_escapes(texts: list[str | None]) -> None:
    got = pl.DataFrame({"t": texts}, schema={"t": pl.String}).select(F.str_list("t"))["t"]
    assert got.to_list() == [reference_str_list(t) for t in texts]


@pytest.mark.parametrize(
    ("event", "column", "frame", "expected"),
    [
        ({"cat": "kernel", "args": {"grid": "[007, 1, 1]"}}, "grid", "kernels", [7, 1, 1]),
        ({"cat": "kernel", "args": {"block": "[\u00a0128]"}}, "block", "kernels", [128]),
        ({"cat": "cpu_op", "args": {"Input Dims": "[[08, 2]]"}}, "shapes", "ops", [[8, 2]]),
    ],
)
def test_list_text_that_is_not_json_is_read_not_a_crash(
    event: dict, column: str, frame: str, expected: list
) -> None:
    """A list written as a string that the regexes accept but JSON does not (a leading
    zero, a no-break space) went to `str.json_decode`, which raised Polars' ComputeError
    out of `load`."""
    base = {"ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1}
    data = json.dumps({"traceEvents": [{**base, **event}]}).encode()
    trace = traceq.load(io.BytesIO(data), cache=False)
    assert trace.frames[frame][column].to_list() == [expected]
