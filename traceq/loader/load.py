"""Reading a trace: bytes -> decoded metadata and raw events, streamed in pieces, with
progress. `traceq.pipeline.load` turns them into linked frames and a `Trace`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from traceq.errors import TraceFormatError, TraceSchemaError
from traceq.loader.decode import Decoded, decode, decode_stream
from traceq.loader.source import Stream, read_bytes
from traceq.loader.split import Unsplittable


@dataclass
class Progress:
    """Where a load stands, for a progress display: `read` of `total` bytes of the file
    (compressed bytes for gzip; `total` None for a file object), events parsed, and phase."""

    phase: str
    read: int = 0
    total: int | None = None
    events: int = 0


def read_events(
    src: str | os.PathLike[str] | BinaryIO,
    max_bytes: int | None,
    report: Callable[[Progress], None],
) -> Decoded:
    """The trace's metadata and raw events. Streams the file through `decode_stream`; on
    bad input reads it again, whole, so that `decode` explains it (its messages count over
    the whole trace). A file object that cannot seek back is read whole from the start (it
    can be read only once)."""
    start = _position(src)
    if start is None:
        return decode(read_bytes(src, max_bytes=max_bytes))
    stream = Stream(src, max_bytes=max_bytes)
    state = Progress("parsing", total=stream.total)

    def parsed(events: int) -> None:
        state.read, state.events = stream.read, events
        report(state)

    try:
        return decode_stream(stream, parsed)
    except (Unsplittable, TraceFormatError, TraceSchemaError):
        if not isinstance(src, (str, os.PathLike)):
            src.seek(start)
        return decode(read_bytes(src, max_bytes=max_bytes))


def _position(src: str | os.PathLike[str] | BinaryIO) -> int | None:
    """0 for a path; a file object's position when it can seek back there, else None."""
    if isinstance(src, (str, os.PathLike)):
        return 0
    try:
        return src.tell() if src.seekable() else None
    except (AttributeError, OSError):
        return None
