"""`load`: the pipeline's first two stages for one file, behind the columnar cache.

bytes -> decoded events (`loader`) -> typed, linked frames (`relations.link`) -> `Trace`;
or all of that from `loader.cache` when the same file was loaded before. It lives above
both stages so that neither imports the other's later work.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from traceq.errors import TraceError, TraceFileError
from traceq.loader import cache as C
from traceq.loader.companions import execution_trace_beside
from traceq.loader.load import Progress, read_events
from traceq.loader.source import describe
from traceq.trace import Trace


def load(
    src: str | os.PathLike[str] | BinaryIO,
    *,
    max_bytes: int | None = None,
    cache: bool | None = None,
    progress: Callable[[Progress], None] | None = None,
    capture: str | os.PathLike[str] | bool | None = None,
    execution_trace: str | os.PathLike[str] | bool | None = None,
) -> Trace:
    """Load a Kineto/Chrome trace (`.json`, `.json.gz`, path or binary file) into a `Trace`.

    `max_bytes` caps the (decompressed) size, against gzip bombs; by default
    `TRACEQ_MAX_BYTES` or 32 GiB. `cache` (default: on unless `TRACEQ_CACHE=0`) reads and
    writes the frames of a file given by path in the columnar cache. `progress` is called
    as the load advances. Raises a `TraceError` subclass, with the file name in its message,
    on bad input.

    `capture`: for a trace that replays CUDA/HIP graphs, the capture trace of its graphs (a
    file, or a folder as vLLM/SGLang write `capture_traces/`, with its
    `execution_details.json`); by default the `capture_traces/` folder beside the trace,
    if any; False: none. Replayed kernels then carry the op, shapes and module that
    launched them during capture (`relations.graph_replay`), and `ops` holds a copy of
    each replayed graph's captured ops (`replayed = True`; `relations.replayed_ops`).

    `execution_trace`: the PyTorch Execution Trace recorded with the trace, for exact data
    flow (`Trace.dataflow`; read only when data flow is first asked for); by default the
    `<stem>.et.json.gz` (or `.et.json`) beside a trace `<stem>.pt.trace.json.gz`, as
    `traceq.profile` writes them; False: none, data flow is inferred.
    """
    name = describe(src)
    et_file = _execution_trace(src, execution_trace)
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
            trace = Trace(
                source=name, metadata=stored.metadata, events=stored.events, frames=stored
            )
            return _with_execution_trace(
                _with_captures(trace, src, capture, max_bytes, cache), et_file
            )
    metadata, events, frames = cold()
    trace = Trace(source=name, metadata=metadata, events=events, frames=frames)
    return _with_execution_trace(_with_captures(trace, src, capture, max_bytes, cache), et_file)


def _execution_trace(
    src: object, execution_trace: str | os.PathLike[str] | bool | None
) -> Path | None:
    """The Execution Trace file `load` is asked for: the one named, else (None, True) the
    one beside a trace given by path, if any; False: none. A named file that is missing is
    an error; whether it is a usable ET is known only when data flow is asked for."""
    if execution_trace is False:
        return None
    if execution_trace is None or execution_trace is True:
        if not isinstance(src, (str, os.PathLike)):
            return None
        return execution_trace_beside(os.fspath(src))
    path = Path(os.fspath(execution_trace))
    if not path.is_file():
        raise TraceFileError(f"no Execution Trace at {path}")
    return path


def _with_execution_trace(trace: Trace, et_file: Path | None) -> Trace:
    """`trace`, reading its data flow from `et_file` when it is first asked for."""
    trace.execution_trace_file = et_file
    return trace


def _with_captures(
    trace: Trace,
    src: object,
    capture: str | os.PathLike[str] | bool | None,
    max_bytes: int | None,
    cache: bool | None,
) -> Trace:
    """`trace` with its graph-replayed kernels attributed (`relations.graph_replay`): from
    the capture traces `capture` names or that lie beside it, else from their launch. A
    trace without graph launches is returned as it is."""
    if capture is False:
        return trace
    from traceq.relations import graph_replay as G
    from traceq.relations.launches import GRAPH_LAUNCH

    launches = trace.select("runtime", "name").filter(pl.col("name").str.contains(GRAPH_LAUNCH))
    if launches.height == 0:
        return trace
    from traceq.loader.overlay import Overlay
    from traceq.relations.inference import inference_steps
    from traceq.relations.replayed_ops import with_replayed_modules, with_replayed_ops

    files = G.capture_files(None if capture is True else capture, src)
    if capture not in (None, True) and not files:
        raise TraceError(f"no capture trace in {os.fspath(capture)}")  # type: ignore[arg-type]
    steps = inference_steps(trace)
    sizes = steps.select(pl.coalesce("tokens", "batch_size")).to_series().drop_nulls().to_list()
    captures = [
        G.Capture(
            load(f.path, max_bytes=max_bytes, cache=cache, capture=False, execution_trace=False),
            f.path.name,
            f.batch_size,
            f.mode,
        )
        for f in G.needed_files(files, sizes)
    ]
    attribution = G.attribute(trace, captures)
    kernels = G.with_attribution(trace.kernels, trace.ops, attribution)
    ops, kernels = with_replayed_ops(trace, captures, attribution, kernels)
    listed = pl.DataFrame(
        [{"source": c.source, "batch_size": c.batch_size, "mode": c.mode} for c in captures],
        schema={"source": pl.String, "batch_size": pl.Int64, "mode": pl.String},
    )
    modules = with_replayed_modules(trace, captures, attribution)
    replaced = {"ops": ops, "kernels": kernels, "modules": modules, "captures": listed}
    frames = Overlay(trace.frames, replaced, lambda: trace.events)
    return Trace(
        source=trace.source, metadata=trace.metadata, events=lambda: trace.events, frames=frames
    )
