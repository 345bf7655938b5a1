"""`load`: bytes -> decoded events -> typed, linked frames -> `Trace` (or all that from the
columnar cache, `traceq.loader.cache`, when the same file was loaded before)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import polars as pl

from traceq.errors import TraceError, TraceFormatError, TraceSchemaError
from traceq.loader import cache as C
from traceq.loader import frames as F
from traceq.loader.decode import Decoded, decode, decode_stream, without_null_storage
from traceq.loader.source import Stream, describe, read_bytes
from traceq.loader.split import Unsplittable
from traceq.relations import link
from traceq.trace import Trace


@dataclass
class Progress:
    """Where a load stands, for a progress display: `read` of `total` bytes of the file
    (compressed bytes for gzip; `total` None for a file object), events parsed, and phase."""

    phase: str
    read: int = 0
    total: int | None = None
    events: int = 0


def load(
    src: str | os.PathLike[str] | BinaryIO,
    *,
    max_bytes: int | None = None,
    cache: bool | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> Trace:
    """Load a Kineto/Chrome trace (`.json`, `.json.gz`, path or binary file) into a `Trace`.

    `max_bytes` caps the (decompressed) size, against gzip bombs; by default
    `TRACEQ_MAX_BYTES` or 32 GiB. `cache` (default: on unless `TRACEQ_CACHE=0`) reads and
    writes the frames of a file given by path in the columnar cache. `progress` is called
    as the load advances. Raises a `TraceError` subclass, with the file name in its message,
    on bad input.
    """
    name = describe(src)
    report = progress or (lambda _: None)
    entry = C.entry_for(src) if isinstance(src, (str, os.PathLike)) and C.enabled(cache) else None
    if entry is not None:
        report(Progress("reading cache"))
        cached = C.read(entry)
        if cached is not None:
            return Trace(
                source=name, metadata=cached.metadata, events=cached.events, frames=cached.frames
            )
    try:
        decoded = _decode(src, max_bytes, report)
        report(Progress("linking", events=decoded.events.height))
        frames = build_frames(decoded.events)
    except TraceError as exc:
        if exc.source is None:
            raise type(exc)(str(exc), source=name) from None
        raise
    if entry is not None:
        report(Progress("writing cache", events=decoded.events.height))
        C.write(entry, decoded.metadata, decoded.events, frames)
    return Trace(source=name, metadata=decoded.metadata, events=decoded.events, frames=frames)


def _decode(
    src: str | os.PathLike[str] | BinaryIO,
    max_bytes: int | None,
    report: Callable[[Progress], None],
) -> Decoded:
    """Stream the file through `decode_stream`; on bad input read it again, whole, so that
    `decode` explains it (its messages count over the whole trace). A file object that
    cannot seek back is read whole from the start (it can be read only once)."""
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


def build_frames(events: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """All typed frames of one trace, linked to each other."""
    events = F.with_category_key(events)
    ops = link.nest_ops(F.ops(events))
    runtime = link.link_runtime(F.runtime(events), ops)
    kernels = link.link_kernels(F.kernels(events), runtime, ops)
    python = F.python(events)
    modules = link.modules(python)
    points = F.flow_points(events)
    frames = {
        "ops": ops,
        "kernels": kernels,
        "runtime": runtime,
        "annotations": F.annotations(events),
        "steps": F.steps(events),
        "python": python,
        "modules": modules,
        "flows": F.flows(points),
        "flow_points": points,
        "syncs": F.syncs(events),
        "counters": F.counters(events),
        "instants": F.instants(events),
        "threads": F.threads(events),
        "other": F.other(events),
    }
    link.attribute_steps(frames)
    frames["ops"] = frames["ops"].with_columns(link.attribute_modules(frames["ops"], modules))
    op_modules = frames["ops"].select(pl.col("event").alias("op_event"), pl.col("module"))
    frames["kernels"] = frames["kernels"].join(
        op_modules, on="op_event", how="left", maintain_order="left"
    )
    return {name: without_null_storage(frame) for name, frame in frames.items()}
