"""The C pass over a batch of events (`traceq.loader._events`) against the Python path it
stands in for.

Where it reads a batch, the frame must be the one msgspec's and Polars' halves build, value
for value; where it cannot be sure (an escape, a non-ASCII byte, an exponent, more digits
than int64 holds, a value of an unusual type, a rare key, a key twice), it must hand the
batch back for the Python path to read: it never guesses. Checked on every real trace
here, on generated events built to reach each of its branches, and on its memory (each
column owns its buffers; all are freed with the frames).
"""

from __future__ import annotations

import gc
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
import pytest
from conftest import REPO_ROOT as ROOT
from conftest import SHARED_TRACES, fixture_trace_paths, gpu_fixture_paths, is_kineto
from conftest import shared_trace_paths as all_shared_trace_paths
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import traceq
from traceq.errors import TraceError
from traceq.loader import decode
from traceq.loader.load import read_events

native = pytest.mark.skipif(
    decode._events is None,
    reason="traceq.loader._events is not built (installed without a C compiler): "
    "the Python path reads every batch",
)


def read(src: bytes | Path, use_native: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The decoded trace (or the error's line) as `load` reads it, one way or the other."""
    monkeypatch.setenv("TRACEQ_NATIVE", "1" if use_native else "0")
    try:
        return read_events(io.BytesIO(src) if isinstance(src, bytes) else src, None, _quiet)
    except TraceError as exc:
        return f"{type(exc).__name__}: {exc}"


def _quiet(progress: object) -> None:
    """No progress display in the tests."""


def assert_same(src: bytes | Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Both ways give equal frames and metadata, or the same error; the native result."""
    python = read(src, False, monkeypatch)
    ours = read(src, True, monkeypatch)
    if isinstance(python, str) or isinstance(ours, str):
        assert ours == python
        return ours
    assert_frame_equal(ours.events, python.events, check_exact=True, categorical_as_str=True)
    assert ours.events.schema == python.events.schema
    assert ours.metadata == python.metadata
    return ours


def test_built_where_a_compiler_is() -> None:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the install leaves the C pass out")
    assert decode._events is not None, "setup.py's optional extension did not build"


def _trace_params() -> list[Any]:
    shared = [p for p in all_shared_trace_paths() if is_kineto(p)]
    return [
        pytest.param(
            path,
            id=str(path.relative_to(SHARED_TRACES if path.is_relative_to(SHARED_TRACES) else ROOT)),
            marks=[pytest.mark.shared] if path.is_relative_to(SHARED_TRACES) else [],
        )
        for path in [*fixture_trace_paths(), *gpu_fixture_paths(), *shared]
    ]


@native
@pytest.mark.parametrize("path", _trace_params())
def test_every_trace_reads_the_same(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real traces: the same frames, and the C pass read every batch of them (none of
    these traces holds what it hands back)."""
    calls: list[bool] = []
    frame_of = decode._native_frame

    def counted(read: Any) -> pl.DataFrame | None:
        frame = frame_of(read)
        calls.append(frame is not None)
        return frame

    monkeypatch.setattr(decode, "_native_frame", counted)
    assert_same(path, monkeypatch)
    assert calls and all(calls)


def trace(*lines: str) -> bytes:
    return ('{"traceEvents":[' + ",".join(lines) + "]}").encode()


# Events the C pass hands back, each for its own reason; the Python path reads or rejects them.
HANDED_BACK = {
    "an escape in a string": '{"ph":"X","name":"a\\"b","ts":1,"dur":1}',
    "a non-ASCII name": '{"ph":"X","name":"é","ts":1,"dur":1}',
    "an exponent": '{"ph":"X","name":"a","ts":1e3,"dur":1}',
    "an exponent in args": '{"ph":"i","name":"a","ts":1,"args":{"x":2.5E-3}}',
    "four decimals": '{"ph":"X","name":"a","ts":1.0005,"dur":1}',
    "a pid past int64": '{"ph":"i","name":"a","ts":1,"pid":12345678901234567890}',
    "an integer past 128 bits in args": '{"ph":"i","ts":1,"args":{"n":' + "9" * 40 + "}}",
    "a float pid": '{"ph":"i","name":"a","ts":1,"pid":1.5}',
    "a negative zero tid": '{"ph":"i","name":"a","ts":1,"tid":-0}',
    "a number for a name": '{"ph":"i","name":7,"ts":1}',
    "a boolean for a cat": '{"ph":"i","cat":true,"ts":1}',
    "a string for ts": '{"ph":"i","name":"a","ts":"1"}',
    "an object for ph": '{"ph":{},"name":"a","ts":1}',
    "a key twice": '{"ph":"i","name":"a","name":"b","ts":1}',
    "a rare key": '{"ph":"i","name":"a","ts":1,"tts":4}',
    "a rare key, nested object": '{"ph":"i","name":"a","ts":1,"stack":[1,2]}',
    "an escaped key": '{"ph":"i","n\\u0061me":"a","ts":1}',
    "not an object": "[1,2]",
    "a number": "3",
    "deep args": '{"ph":"i","ts":1,"args":' + "[" * 70 + "]" * 70 + "}",
}


@native
@pytest.mark.parametrize("line", HANDED_BACK.values(), ids=HANDED_BACK.keys())
def test_what_it_hands_back(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted = msgspec.json.format(line.encode(), indent=-1)
    assert decode._events.parse(compacted, 1) is None
    plain = '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":5,"dur":2}'
    assert_same(trace(plain, line, plain), monkeypatch)


@native
def test_what_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each column from its usual types: integers' digits for ids, null for null or
    missing, `args` as its exact (compacted) text, unknown keys skipped whatever they hold."""
    lines = [
        '{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":-1,"tid":"7","ts":1.5,"dur":2,'
        '"args":{"a":[1,{"b":null}],"s":"x,y}"},"junk":{"y":["z",true,-0.25]}}',
        '{"ph":"f","id":123,"bp":"e","s":"t","cat":"ac2g","name":"ac2g","ts":3,"args":null}',
        '{"ph":"M","name":null,"pid":"Spans","cat":"","args":{"k\\"":"\\n\\u00e9"}}',
    ]
    decoded = assert_same(trace(*lines), monkeypatch)
    events = decoded.events.with_columns(pl.col(decode.CATEGORICAL).cast(pl.String))
    assert events.select("ph", "cat", "pid", "tid", "id", "bp", "s", "ts_ns", "dur_ns").rows() == [
        ("X", "cpu_op", "-1", "7", None, None, None, 1500, 2000),
        ("f", "ac2g", None, None, "123", "e", "t", 3000, None),
        ("M", "", "Spans", None, None, None, None, None, None),
    ]
    args = ['{"a":[1,{"b":null}],"s":"x,y}"}', None, '{"k\\"":"\\n\\u00e9"}']  # escapes kept
    assert events["args"].to_list() == args
    assert events["name"].to_list() == ["aten::mm", "ac2g", None]


@native
def test_line_count_must_match() -> None:
    assert decode._events.parse(b"{}\n{}", 1) is None
    assert decode._events.parse(b"{}", 2) is None
    assert decode._events.parse(b"", 0) is not None


@native
def test_each_column_owns_its_memory() -> None:
    """Polars imports the columns without copying: a column kept (here `name`) must keep
    only its own buffers, and nothing may outlive the frames."""
    gc.collect()
    before = decode._events.live()
    lines = b"\n".join(
        b'{"ph":"X","name":"a name longer than twelve %d","pid":1,"args":{"a":%d}}' % (i, i)
        for i in range(1000)
    )
    columns, _ = decode._events.parse(lines, 1000)
    frame = pl.DataFrame([pl.Series(decode._Capsules(*column)) for column in columns])
    del columns
    assert decode._events.live() - before == len(frame.columns)
    name = frame["name"]
    del frame
    gc.collect()
    assert decode._events.live() - before == 1
    assert name[999] == "a name longer than twelve 999"
    del name
    gc.collect()
    assert decode._events.live() == before


# Generated events: every key the C pass knows, each with its usual type most of the time
# and any other JSON type sometimes, plus unknown keys, duplicates and rare keys.
ascii_texts = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20)
texts = (
    ascii_texts
    | st.sampled_from(["X", "kernel", "aten::mm", "", "0", "null"])
    | st.text(max_size=4)  # any code point, escapes included
)
integers = st.integers(min_value=-(2**70), max_value=2**70) | st.integers(-5, 10**6)
numbers = integers | st.floats(allow_nan=False, allow_infinity=False)
times = numbers | st.decimals(min_value=-(10**17), max_value=10**17, places=3)
scalars = st.none() | st.booleans() | texts | numbers
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args", "x", "tts"]
USUAL = {
    "ph": texts,
    "cat": texts,
    "name": texts,
    "pid": integers | texts,
    "tid": integers | texts,
    "ts": times,
    "dur": st.integers(0, 10**9) | st.decimals(0, 10**6, places=3),
    "id": integers | texts,
    "bp": texts,
    "s": texts,
    "args": st.dictionaries(texts, values, max_size=4),
}


def _json(value: Any) -> str:
    if isinstance(value, float) or type(value).__name__ == "Decimal":
        return str(value)
    return json.dumps(value, ensure_ascii=False)


# Plain Kineto-like events, which the C pass reads: ASCII text without escapes, integers
# and 3-decimal times, no rare or repeated key.
plain_texts = st.text(
    st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"\\'), max_size=20
)
plain_integers = st.integers(min_value=-(10**17), max_value=10**17)
plain_values = st.recursive(
    st.none() | st.booleans() | plain_texts | plain_integers,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plain_texts, inner, max_size=3),
    max_leaves=8,
)
PLAIN = {
    "ph": plain_texts,
    "cat": plain_texts,
    "name": plain_texts,
    "pid": plain_integers | plain_texts,
    "tid": plain_integers | plain_texts,
    "ts": plain_integers | st.decimals(0, 10**15, places=3),
    "dur": st.integers(0, 10**9) | st.decimals(0, 10**6, places=3),
    "id": plain_integers | plain_texts,
    "bp": plain_texts,
    "s": plain_texts,
    "args": st.dictionaries(plain_texts, plain_values, max_size=4),
    "x": plain_values,
}


@st.composite
def events(draw: st.DrawFn, wild: bool) -> str:
    """One event's JSON text: plain, or (`wild`) with any JSON anywhere now and then."""
    if wild and draw(st.integers(0, 30)) == 0:
        return _json(draw(values))  # not an object at all
    keys = draw(st.lists(st.sampled_from(KEYS if wild else list(PLAIN)), max_size=10, unique=True))
    if draw(st.booleans()):
        keys = [
            "ph",
            "name",
            "ts",
            "dur",
            *(k for k in keys if k not in ("ph", "name", "ts", "dur")),
        ]
    if wild and keys and draw(st.integers(0, 10)) == 0:
        keys.append(draw(st.sampled_from(keys)))  # a key twice
    members = []
    for key in keys:
        if not wild:
            value = draw(PLAIN[key])
        elif key in USUAL and draw(st.integers(0, 5)):
            value = draw(USUAL[key])
        else:
            value = draw(values)
        members.append(f"{json.dumps(key)}: {_json(value)}")
    return "{" + ", ".join(members) + "}"


@native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans().flatmap(lambda wild: st.lists(events(wild), min_size=1, max_size=6)))
def test_generated_events_read_the_same(lines: list[str]) -> None:
    data = trace(*lines)
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert_same(data, monkeypatch)
    compacted = msgspec.json.format(("[" + ",".join(lines) + "]").encode(), indent=-1)
    slices = msgspec.json.Decoder(list[msgspec.Raw]).decode(compacted)
    read = decode._events.parse(b"\n".join(slices), len(slices)) is not None
    event("the C pass read the batch" if read else "the C pass handed it back")


def test_loads_without_the_c_pass(tmp_path: Path) -> None:
    """An install without a C compiler has no `_events`: `import traceq` and a load still
    work, every batch read the Python way (a fresh interpreter, the module blocked)."""
    script = (
        "import sys; sys.modules['traceq.loader._events'] = None\n"
        "import traceq; from traceq.loader import decode\n"
        "assert decode._events is None\n"
        f"trace = traceq.load({str(gpu_fixture_paths()[0])!r}, cache=False)\n"
        "print(trace.events.height, trace.kernels.height)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = traceq.load(gpu_fixture_paths()[0], cache=False)
    assert done.stdout.split() == [str(expected.events.height), str(expected.kernels.height)]
