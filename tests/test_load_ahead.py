"""The loader's two threads (`loader.ahead`): msgspec's half of each batch runs one batch
ahead in a thread while Polars parses the batch before. Order, errors and early stops must
behave as if there were one thread, and no thread may outlive a load."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from polars.testing import assert_frame_equal

from traceq.errors import TraceSchemaError
from traceq.loader import decode as decode_module
from traceq.loader.ahead import ahead
from traceq.loader.decode import decode, decode_stream


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name == "traceq-ahead"}


def test_items_come_in_order_and_the_thread_ends() -> None:
    assert list(ahead(iter(range(1000)))) == list(range(1000))
    assert not _threads()


def test_an_error_is_raised_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("third")

    seen = []
    with pytest.raises(ValueError, match="third"):
        for item in ahead(items()):
            seen.append(item)
    assert seen == [1, 2]
    assert not _threads()


def test_the_producer_runs_at_most_depth_items_ahead() -> None:
    made: list[int] = []

    def items() -> Iterator[int]:
        for i in range(10):
            made.append(i)
            yield i

    stream = ahead(items(), depth=1)
    assert next(stream) == 0
    time.sleep(0.3)  # time enough to run away if it could
    # item 0 taken, item 1 made; item 2 is not started until item 1 is taken
    assert made == [0, 1]
    assert next(stream) == 1
    time.sleep(0.3)
    assert made == [0, 1, 2]
    stream.close()
    assert not _threads()


def test_closing_early_stops_the_thread() -> None:
    def endless() -> Iterator[int]:
        i = 0
        while True:
            yield i
            i += 1

    stream = ahead(endless())
    assert [next(stream) for _ in range(5)] == [0, 1, 2, 3, 4]
    stream.close()
    assert not _threads()


def _trace(n: int) -> bytes:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 2, "ts": i, "dur": 1,
         "args": {"External id": i}}
        for i in range(n)
    ]  # fmt: skip
    return json.dumps({"traceEvents": events}, indent=1).encode()


def test_msgspec_reads_args_in_another_thread_and_frames_are_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of the two threads on the Python path (without the C pass, which reads
    the batch in the caller's thread): `args` are read off the caller's thread, while the
    frame is the one the one-thread `decode` builds (batches of 7 events: many batches)."""
    monkeypatch.setenv("TRACEQ_NATIVE", "0")
    data = _trace(100)
    expected = decode(data).events
    monkeypatch.setattr(decode_module, "BATCH", 7)
    callers: set[str] = set()
    real = decode_module._read_args

    def recording(*args: object) -> object:
        callers.add(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(decode_module, "_read_args", recording)
    pieces = [data[i : i + 500] for i in range(0, len(data), 500)]
    streamed = decode_stream(pieces).events
    assert callers == {"traceq-ahead"}
    assert_frame_equal(streamed, expected)
    assert not _threads()


def test_a_bad_batch_stops_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event that is not an object, in the second batch: the error reaches the caller
    and the reading thread is gone."""
    monkeypatch.setattr(decode_module, "BATCH", 7)
    good = json.loads(_trace(20))["traceEvents"]
    data = json.dumps({"traceEvents": [*good[:10], 5, *good[10:]]}).encode()
    with pytest.raises(TraceSchemaError, match="event 10 is a number, not a JSON object"):
        decode_stream([data[i : i + 300] for i in range(0, len(data), 300)])
    assert not _threads()
