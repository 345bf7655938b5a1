"""`load`: the pipeline's first two stages for one file, behind the columnar cache.

bytes -> decoded events (`loader`) -> typed, linked frames (`relations.link`) -> `Trace`;
or all of that from `loader.cache` when the same file was loaded before. It lives above
both stages so that neither imports the other's later work.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, BinaryIO

import polars as pl

from traceq.errors import TraceError
from traceq.loader import cache as C
from traceq.loader.load import Progress, read_events
from traceq.loader.source import describe
from traceq.trace import Trace


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

    def cold() -> tuple[dict[str, Any], pl.DataFrame, dict[str, pl.DataFrame]]:
        from traceq.relations.link import link_frames  # numpy with it: not for a cache hit

        try:
            decoded = read_events(src, max_bytes, report)
            report(Progress("linking", events=decoded.events.height))
            frames = link_frames(decoded.events)
        except TraceError as exc:
            if exc.source is None:
                raise type(exc)(str(exc), source=name) from None
            raise
        if entry is not None:
            report(Progress("writing cache", events=decoded.events.height))
            C.write(entry, decoded.metadata, decoded.events, frames)
        return decoded.metadata, decoded.events, frames

    if entry is not None:
        report(Progress("reading cache"))
        stored = C.read(entry, rebuild=lambda: cold()[1:])
        if stored is not None:  # frames are decoded when first used
            return Trace(source=name, metadata=stored.metadata, events=stored.events, frames=stored)
    metadata, events, frames = cold()
    return Trace(source=name, metadata=metadata, events=events, frames=frames)
