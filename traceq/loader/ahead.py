"""Runs an iterator one item ahead of its consumer, in a thread, so that two cores work.

The loader's two halves hold the GIL differently: msgspec (cutting the stream, and
reading `args` where the C pass is not built) holds it, the C pass and Polars' parse
release it. Each half alone keeps one core busy, so the msgspec half runs here, a batch
ahead, while the caller's thread parses the batch before.
At most `depth` items are made or being made ahead of the one the caller works on, so
memory grows by that many batches at most.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_POLL_S = 0.05  # how often a producer waiting for room checks that it may go on


class _Raised:
    """What the producer raised, carried to the consumer to be raised there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


def ahead(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Yield what `items` yields, in order, computed in a thread up to `depth` items ahead.

    An exception from `items` is raised here when its turn comes (after every item yielded
    before it). Closing this generator early (the consumer raised, or stopped) stops the
    thread after its current item and waits for it, so no thread outlives a load."""
    waiting: queue.Queue[object] = queue.Queue()
    room = threading.Semaphore(depth)  # items made or being made, not yet taken
    stop = threading.Event()

    def wait_for_room() -> bool:
        while not stop.is_set():
            if room.acquire(timeout=_POLL_S):
                return True
        return False

    def produce() -> None:
        try:
            iterator = iter(items)
            while wait_for_room():  # the next item is started only when there is room
                try:
                    item = next(iterator)
                except StopIteration:
                    waiting.put(_DONE)
                    return
                waiting.put(item)
        except BaseException as exc:  # handed to the consumer, raised there
            waiting.put(_Raised(exc))

    thread = threading.Thread(target=produce, name="traceq-ahead", daemon=True)
    thread.start()
    try:
        while True:
            value = waiting.get()
            room.release()
            if value is _DONE:
                return
            if isinstance(value, _Raised):
                raise value.error
            yield value  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()
