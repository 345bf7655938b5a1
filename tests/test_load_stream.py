"""The streaming decode: pieces cut at top-level event boundaries only, results equal to the
whole-document decoder's, and the document never held whole.

The reference is `decode` on the whole buffer (itself checked against the stdlib `json`
by the other loader tests); every piece size from 1 byte up must give the same frame.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import random
import zlib
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import traceq
from traceq.loader import load as load_module
from traceq.loader import source, split
from traceq.loader.decode import decode, decode_stream, without_null_storage
from traceq.loader.source import Stream

# Strings that look like event boundaries, nested values that end in `},`, escapes.
TRICKY = [
    {"ph": "X", "cat": "cpu_op", "name": 'a}, {"ph": "X"', "pid": 1, "tid": 1, "ts": 1, "dur": 2},
    {
        "ph": "X",
        "cat": "cpu_op",
        "name": "b",
        "pid": 1,
        "tid": 1,
        "ts": 2.5,
        "dur": 1,
        "args": {"x": {"y": {"z": 1}, "w": [{"a": 1}, {"b": "},"}]}, "s": '\\"},\\\\'},
    },
    {"ph": "i", "cat": "x", "name": "]}, \"traceEvents\": [", "pid": 1, "tid": 1, "ts": 3},
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1712195495519689.047,
     "dur": 3, "args": {"correlation": 5, "note": "}\n,\n{"}},
]  # fmt: skip


def document(events: list[dict], *, indent: int | None = None, **top: object) -> bytes:
    before = {"schemaVersion": 1, "note": '"traceEvents": [1, 2]', "nested": {"traceEvents": []}}
    return json.dumps(
        {**before, "traceEvents": events, **top, "traceName": "t"}, indent=indent
    ).encode()


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


def assert_decodes_alike(data: bytes, size: int) -> None:
    whole = decode(data)
    streamed = decode_stream(pieces(data, size))
    assert streamed.metadata == whole.metadata
    assert list(streamed.metadata) == list(whole.metadata)  # document order
    assert_frame_equal(streamed.events, whole.events)


@pytest.mark.parametrize("indent", [None, 1])
@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 64, 333, 4096, 1 << 20])
def test_every_piece_size_gives_the_whole_document_result(indent: int | None, size: int) -> None:
    data = document(TRICKY * 5, indent=indent, displayTimeUnit="ms")
    assert_decodes_alike(data, size)


def test_the_bare_event_array_form_streams_too() -> None:
    data = json.dumps(TRICKY * 3).encode()
    for size in (1, 7, 100):
        assert_decodes_alike(data, size)


def test_a_byte_order_mark_and_empty_events() -> None:
    assert_decodes_alike(b"\xef\xbb\xbf" + document(TRICKY), 5)
    assert_decodes_alike(b'{"traceEvents": []}', 3)
    assert_decodes_alike(b'{"a": [{"b": 1}, {"c": 2}], "traceEvents": [ ] , "z": {"y": {}}}', 4)


text = st.text(alphabet=st.sampled_from('}{][,": \\\n\tax\u00e9'), max_size=12)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
events = st.lists(
    st.fixed_dictionaries(
        {
            "ph": st.sampled_from(["X", "i", "M"]),
            "name": text,
            "ts": st.integers(0, 10**9),
            "dur": st.integers(0, 10**6),
            "args": st.dictionaries(text, json_value, max_size=3),
        }
    ),
    max_size=12,
)


@given(events=events, size=st.integers(1, 80), indent=st.sampled_from([None, 0, 2]))
def test_cuts_never_fall_inside_strings_or_nested_values(
    events: list[dict], size: int, indent: int | None
) -> None:
    assert_decodes_alike(document(events, indent=indent), size)


def test_events_are_parsed_before_the_document_ends() -> None:
    """Streaming, not buffering: the first events arrive after a few pieces, and the buffer
    never grows past a piece and an event."""
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    data = document([event] * 20_000)
    piece = 64 << 10
    consumed = []

    def counted() -> Iterator[bytes]:
        for i, chunk in enumerate(pieces(data, piece)):
            consumed.append(i)
            yield chunk

    sliced = split.EventSlices(counted())
    batches = iter(sliced)
    first = next(batches)
    assert len(consumed) <= 3 and len(first) > 0
    sizes = [len(first), *(len(b) for b in batches)]
    assert sum(sizes) == 20_000
    assert len(sizes) >= len(data) // piece - 1
    assert max(sizes) * len(json.dumps(event)) < 2 * piece + 4096


def test_invalid_json_mid_stream_stops_reading() -> None:
    event = {"ph": "X", "name": "a", "ts": 1, "dur": 1}
    data = document([event] * 5000).replace(b'"dur": 1}', b'"dur": 1]', 1)
    consumed = []

    def counted() -> Iterator[bytes]:
        for i, chunk in enumerate(pieces(data, 4096)):
            consumed.append(i)
            yield chunk

    with pytest.raises(split.Unsplittable):
        list(split.EventSlices(counted()))
    assert len(consumed) < 5  # not read to the end to find out


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_buf: object) -> None:
        raise AssertionError("the whole-document decoder was used")

    monkeypatch.setattr(load_module, "decode", refuse)


def test_paths_gzip_and_file_objects_all_stream(
    no_fallback: None, fixture_traces: list[Path], tmp_path: Path
) -> None:
    path = fixture_traces[0]
    raw = gzip.decompress(path.read_bytes())
    plain = tmp_path / "t.json"
    plain.write_bytes(raw)
    reference = decode(raw).events
    for src in (path, plain, io.BytesIO(path.read_bytes()), io.BytesIO(raw), plain.open("rb")):
        assert_frame_equal(traceq.load(src, cache=False).events, reference)


def test_multi_member_gzip_with_padding_streams(no_fallback: None) -> None:
    data = document(TRICKY * 50)
    half = len(data) // 2
    packed = gzip.compress(data[:half]) + b"\0" * 10 + gzip.compress(data[half:]) + b"\0\0"
    assert_frame_equal(traceq.load(io.BytesIO(packed)).events, decode(data).events)


def gzip_test_data() -> bytes:
    rng = random.Random(7)  # 1 MB of JSON that gzip shrinks 7.7x
    return document(
        [
            {"ph": "X", "cat": "kernel", "name": f"k{rng.getrandbits(12)}", "pid": 0, "tid": 7,
             "ts": rng.getrandbits(30), "dur": rng.getrandbits(8)}
            for _ in range(9000)
        ]
    )  # fmt: skip


@pytest.mark.parametrize("in_chunk", [4 << 10, 16 << 10])  # inflating to less, more than a piece
def test_gzip_comes_in_the_plain_files_pieces(
    monkeypatch: pytest.MonkeyPatch, in_chunk: int
) -> None:
    # Each call's output was yielded as it came: input that inflates to more than a piece
    # came out as one whole piece and a small rest, over and over (58 pieces instead of 37
    # for 2.16M events, and that many more batches to decode), and input that inflates to
    # less came out in pieces of that size; where the batches fall moves the load's peak
    monkeypatch.setattr(source, "CHUNK", 64 << 10)
    monkeypatch.setattr(source, "IN_CHUNK", in_chunk)
    data = gzip_test_data()
    plain = [len(piece) for piece in Stream(io.BytesIO(data))]
    got = list(Stream(io.BytesIO(gzip.compress(data))))
    assert b"".join(got) == data
    assert [len(piece) for piece in got] == plain


def test_each_gzip_member_ends_a_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "CHUNK", 64 << 10)
    monkeypatch.setattr(source, "IN_CHUNK", 4 << 10)
    data = gzip_test_data()
    cuts = [0, 100_000, 400_000, len(data)]
    packed = b"".join(gzip.compress(data[a:b]) for a, b in itertools.pairwise(cuts))
    got = list(Stream(io.BytesIO(packed)))
    assert b"".join(got) == data
    expected, room = [], source.IN_CHUNK
    for a, b in itertools.pairwise(cuts):  # a member's pieces: whole ones, then its rest
        while a < b:
            expected.append(min(room, b - a))
            a, room = a + expected[-1], source.CHUNK
    assert [len(piece) for piece in got] == expected


def test_a_file_object_that_cannot_seek_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    class Pipe(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def read(self, n: int = -1) -> bytes:
            return self._data.read(n)

    data = document(TRICKY)
    assert traceq.load(Pipe(data)).events.height == len(TRICKY)
    with pytest.raises(traceq.TraceFormatError, match="truncated JSON"):
        traceq.load(Pipe(data[:-5]))


def test_stream_reports_bytes_read_of_the_total(fixture_traces: list[Path]) -> None:
    path = fixture_traces[0]
    stream = Stream(path)
    assert stream.total == path.stat().st_size and stream.read == 0
    out = b"".join(stream)
    assert stream.read == stream.total
    assert out == zlib.decompress(path.read_bytes(), wbits=31)


def test_all_null_columns_keep_their_values_and_dtypes() -> None:
    frame = pl.DataFrame(
        {"a": [1, 2, 3], "s": [None, None, None], "f": [None, 1.5, None]},
        schema={"a": pl.Int64, "s": pl.String, "f": pl.Float64},
    )
    compact = without_null_storage(frame)
    assert_frame_equal(compact, frame)
    assert compact.filter(pl.col("a") > 1)["s"].to_list() == [None, None]
    assert_frame_equal(without_null_storage(frame.clear()), frame.clear())
