"""Runs an iterator one item ahead of its consumer, in a thread, so that two cores work.

The loader's two halves hold the GIL differently: msgspec (cutting the stream, reading
`args`) holds it, Polars' parse releases it. Each half alone keeps one core busy, so the
msgspec half runs here, a batch ahead, while the caller's thread parses the batch before.
At most `depth` items wait between the two, so memory grows by that many batches at most.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
_POLL_S = 0.05  # how often a producer blocked on a full queue checks that it may go on


class _Raised(Generic[T]):
    """What the producer raised, carried to the consumer to be raised there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


def ahead(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Yield what `items` yields, in order, computed in a thread up to `depth` items ahead.

    An exception from `items` is raised here when its turn comes (after every item yielded
    before it). Closing this generator early (the consumer raised, or stopped) stops the
    thread after its current item and waits for it, so no thread outlives a load."""
    waiting: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(value: object) -> bool:
        while not stop.is_set():
            try:
                waiting.put(value, timeout=_POLL_S)
            except queue.Full:
                continue
            return True
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(_Raised(exc))
        else:
            put(_DONE)

    thread = threading.Thread(target=produce, name="traceq-ahead", daemon=True)
    thread.start()
    try:
        while True:
            value = waiting.get()
            if value is _DONE:
                return
            if isinstance(value, _Raised):
                raise value.error
            yield value  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()
