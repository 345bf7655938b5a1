"""A bounded fuzz of the C pass (`traceq.loader._events`), the Python path its oracle.

Generated traces (test_load_native's generators) must read as the Python path reads them,
cut into pieces of any size; the same batches, their bytes mutated (quotes, backslashes,
brackets, newlines, non-ASCII bytes, long digits spliced in, bytes dropped or repeated),
must come back as columns or None, never a crash, and as the Python path's frame where
they are still compacted JSON; `scan` must agree with `split.scan` on any bytes cut
anywhere. CI runs this file against an extension built with AddressSanitizer and UBSan
(`.ci/run`): `TRACEQ_FUZZ_EXTENSION` names that build and `TRACEQ_FUZZ_EXAMPLES` how many
inputs each test draws (the suite's default is a few dozen; `scan`'s test draws three
times as many).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import msgspec
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from test_load_native import assert_same, events, trace

from traceq.loader import decode, split
from traceq.loader.decode import decode_stream

EXAMPLES = int(os.environ.get("TRACEQ_FUZZ_EXAMPLES", "40"))
fuzz = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _extension() -> object:
    """The C pass under test: the build that `TRACEQ_FUZZ_EXTENSION` names, or the one
    installed."""
    path = os.environ.get("TRACEQ_FUZZ_EXTENSION")
    if not path:
        return decode._events
    spec = importlib.util.spec_from_file_location("traceq.loader._events", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


C_PASS = _extension()
pytestmark = pytest.mark.skipif(C_PASS is None, reason="traceq.loader._events is not built")


@pytest.fixture(autouse=True, scope="module")
def c_pass_under_test() -> Iterator[None]:
    """The loader and the cutter use the extension under test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "_events", C_PASS)
        patch.setattr(split, "_events", C_PASS)
        yield


def compacted_lines(lines: list[str]) -> list[bytes]:
    raw = msgspec.json.format(("[" + ",".join(lines) + "]").encode(), indent=-1)
    return [bytes(event) for event in msgspec.json.Decoder(list[msgspec.Raw]).decode(raw)]


batches = st.booleans().flatmap(lambda wild: st.lists(events(wild), min_size=1, max_size=6))


@fuzz
@given(lines=batches, piece=st.integers(1, 300))
def test_generated_traces_read_as_the_python_path_reads_them(lines: list[str], piece: int) -> None:
    data = trace(*lines)
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert_same(data, monkeypatch)
    try:
        whole = decode.decode(data)
    except Exception as exc:  # the error is the one the stream must raise
        with pytest.raises(type(exc)):
            decode_stream(data[at : at + piece] for at in range(0, len(data), piece))
        return
    streamed = decode_stream(data[at : at + piece] for at in range(0, len(data), piece))
    assert_frame_equal(streamed.events, whole.events)


# Bytes that move the C pass onto its other branches, spliced into a valid batch.
SPLICES = [
    b'"', b"\\", b"\\u00e9", b"{", b"}", b"[", b"]", b",", b":", b"\n", b"\xc3\xa9", b"\xff",
    b"-", b".", b"e5", b"0", b"9" * 25, b"-0", b"null", b"true", b"nul", b"", b"[" * 70,
    b'"tts":1,', b'"name":"x",', b"1.0005",
]  # fmt: skip
mutations = st.lists(
    st.tuples(
        st.sampled_from(["insert", "replace", "delete", "repeat"]),
        st.floats(0, 1),
        st.sampled_from(SPLICES) | st.binary(max_size=4),
        st.integers(1, 8),
    ),
    min_size=1,
    max_size=4,
)


def mutated(data: bytes, changes: list[tuple[str, float, bytes, int]]) -> bytes:
    for kind, where, splice, length in changes:
        at = int(where * len(data))
        if kind == "insert":
            data = data[:at] + splice + data[at:]
        elif kind == "replace":
            data = data[:at] + splice + data[at + len(splice) :]
        elif kind == "delete":
            data = data[:at] + data[at + length :]
        else:
            data = data[:at] + data[at : at + length] * 3 + data[at + length :]
    return data


def frame_of(parsed: tuple[tuple[tuple[object, object], ...], bool]) -> pl.DataFrame:
    """The columns as Polars imports them, every value read (under ASan, every view)."""
    columns, _ = parsed
    frame = pl.DataFrame([pl.Series(decode._Capsules(*column)) for column in columns])
    frame.select(pl.col(pl.String).str.len_bytes().sum()).row(0)
    frame.to_dicts()
    return frame


@fuzz
@given(lines=batches, changes=mutations, extra=st.integers(-1, 1), view_max=st.integers(0, 64))
def test_mutated_batches_come_back_or_are_handed_back(
    lines: list[str], changes: list[tuple[str, float, bytes, int]], extra: int, view_max: int
) -> None:
    data = mutated(b"\n".join(compacted_lines(lines)), changes)
    n = data.count(b"\n") + 1 + extra
    parsed = C_PASS.parse(data, max(n, 0))
    bounded = C_PASS.parse(data, max(n, 0), view_max)
    if parsed is None:
        assert bounded is None  # a lower bound only hands more back
        return
    frame = frame_of(parsed)  # (a capsule is imported once: Polars takes its buffers)
    if bounded is not None:
        assert_frame_equal(frame_of(bounded), frame)
    assert frame.height == n
    compact = [line for line in data.split(b"\n") if _is_compact_json(line)]
    if len(compact) == n and n:  # still what msgspec's cut hands over: as Python reads it
        with pytest.MonkeyPatch.context() as monkeypatch:
            assert_same(trace(*(line.decode() for line in compact)), monkeypatch)


def _is_compact_json(line: bytes) -> bool:
    try:
        return msgspec.json.format(line, indent=-1) == line
    except msgspec.DecodeError:
        return False


@settings(fuzz, max_examples=3 * EXAMPLES)  # cheap: three times the inputs
@given(
    data=st.binary(max_size=80) | st.lists(st.sampled_from(SPLICES)).map(b"".join),
    cuts=st.lists(st.floats(0, 1), max_size=4),
)
def test_scan_agrees_with_the_python_tokenizer(data: bytes, cuts: list[float]) -> None:
    ends = [*sorted(int(cut * len(data)) for cut in cuts), len(data)]
    answers = []
    for scan in (C_PASS.scan, split.scan):
        state, start, commas = 0, 0, []
        for end in ends:
            comma, state = scan(data[:end], start, state)
            commas.append(comma)
            start = end
        answers.append((commas, state))
    assert answers[0] == answers[1]
