"""A rank loaded for the job's map: only the frames its summary reads, the rest on demand.

A job's per-rank map reads five frames (ops, runtime, kernels, annotations, steps) and of
those few columns: times, names, nesting, launches, steps — never tensor shapes, launch
grids, occupancy, Python frames, modules, flows or syncs. `load_rank` decodes the trace as
`traceq.load` does, then links just those five frames with the same link functions (so each
column it builds is the one `traceq.load` builds); any other frame asked for later is built
then, by the full link, so a rule that needs it still sees the whole trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import polars as pl

from traceq.errors import TraceError
from traceq.loader import frames as F
from traceq.loader.decode import without_null_storage
from traceq.loader.load import read_events
from traceq.loader.source import describe
from traceq.trace import Trace

# The `args` keys each light frame reads: what the links and the job's summary use.
OP_ARGS = {"External id": "_external_id", "external id": "_external_id_old"}
RUNTIME_ARGS = {"correlation": "_correlation"}
KERNEL_ARGS = {
    "device": "_device",
    "correlation": "_correlation",
    "External id": "_external_id",
    "external id": "_external_id_old",
}


class RankFrames(dict[str, pl.DataFrame]):
    """The light frames; the first frame asked for that is not among them — or any look
    at the whole mapping (iteration, `in`, `get`, `len`) — links the whole trace
    (`relations.link.link_frames`), and from then on every frame is the full one."""

    def __init__(self, events: pl.DataFrame, light: dict[str, pl.DataFrame]) -> None:
        super().__init__(light)
        self._events: pl.DataFrame | None = events

    @property
    def complete(self) -> bool:
        return self._events is None

    def _complete(self) -> None:
        from traceq.relations.link import link_frames

        if self._events is not None:
            events, self._events = self._events, None
            self.update(link_frames(events))

    def __missing__(self, name: str) -> pl.DataFrame:
        if self._events is None:
            raise KeyError(name)
        self._complete()
        return self[name]

    def __iter__(self) -> Iterator[str]:
        self._complete()
        return super().__iter__()

    def __len__(self) -> int:
        self._complete()
        return super().__len__()

    def __contains__(self, name: object) -> bool:
        self._complete()
        return super().__contains__(name)

    def get(self, name: str, default: Any = None) -> Any:
        self._complete()
        return super().get(name, default)

    def keys(self) -> Any:
        self._complete()
        return super().keys()

    def values(self) -> Any:
        self._complete()
        return super().values()

    def items(self) -> Any:
        self._complete()
        return super().items()


def load_rank(path: str | os.PathLike[str]) -> Trace:
    """One rank's `Trace` with the frames the job's map reads (never from the cache: the
    map of a job is one pass over each file)."""
    name = describe(path)
    try:
        decoded = read_events(path, None, lambda _: None)
        frames = light_frames(decoded.events)
    except TraceError as exc:
        if exc.source is None:
            raise type(exc)(str(exc), source=name) from None
        raise
    return Trace(
        source=name,
        metadata=decoded.metadata,
        events=decoded.events,
        frames=RankFrames(decoded.events, frames),
    )


def light_frames(raw: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """ops, runtime, kernels, annotations and steps, linked as `link_frames` links them,
    with only the columns the job's map reads."""
    # numpy comes with the links: imported for a cold load, not for a map served by the cache
    from traceq.relations.link import link_kernels, link_runtime, nest_ops, step_of

    events = F.with_category_key(raw)
    ops = nest_ops(_frame(events, F.OP_CATS, OP_ARGS))
    runtime = _frame(events, F.RUNTIME_CATS, RUNTIME_ARGS, _kind(F.RUNTIME_CATS, "runtime"))
    runtime = link_runtime(runtime, ops)
    device = pl.coalesce(F.as_int("_device"), "pid").alias("device")
    kernels = _frame(events, F.GPU_CATS, KERNEL_ARGS, _kind(F.GPU_CATS, "kernel"), device)
    kernels = link_kernels(kernels.drop("pid", "tid"), runtime, ops)  # device, not pid
    steps = F.steps(events)
    frames = {
        "ops": ops,
        "runtime": runtime,
        "annotations": F.annotations(events),
        "steps": steps,
    }
    for name in ("ops", "runtime", "annotations"):
        frames[name] = frames[name].with_columns(step_of(frames[name], steps).alias("step"))
    by_launch = step_of(kernels, steps, ts="launch_ts_ns")
    frames["kernels"] = kernels.with_columns(
        pl.coalesce(by_launch, step_of(kernels, steps)).alias("step")
    )
    return {name: without_null_storage(frame) for name, frame in frames.items()}


def _frame(
    events: pl.DataFrame, cats: Any, fields: dict[str, str], *derived: pl.Expr
) -> pl.DataFrame:
    """The complete events of `cats`: `event, name, pid, tid, ts_ns, dur_ns, end_ns`, the
    `external_id` / `correlation` among `fields` read as `loader.frames` reads them, and
    `derived` columns (from the raw `_` fields or `_cat`)."""
    rows = events.filter((pl.col("ph") == "X") & pl.col(F.CATEGORY_KEY).is_in(list(cats)))
    base = rows.select(
        "event",
        "name",
        F.as_int("pid").alias("pid"),
        F.as_int("tid").alias("tid"),
        "ts_ns",
        "dur_ns",
        (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns"),
        F.CATEGORY_KEY,
    )
    frame = pl.concat([base, F.args_frame(rows["args"], fields)], how="horizontal")
    columns = list(derived)
    if "_external_id" in fields.values():
        external = pl.coalesce(F.as_int("_external_id"), F.as_int("_external_id_old"))
        columns.append(external.alias("external_id"))
    if "_correlation" in fields.values():
        columns.append(F.as_int("_correlation").alias("correlation"))
    return frame.with_columns(columns).drop(pl.selectors.starts_with("_"))


def _kind(cats: dict[str, str], default: str) -> pl.Expr:
    return pl.col(F.CATEGORY_KEY).replace_strict(cats, default=default).alias("kind")


def load_for_map(path: str, *, rules: bool, cache: bool | None = None) -> Trace:
    """The trace a job's map works on: the full `traceq.load` when single-trace `rules` will
    run on it or the columnar cache is on (a cached load is faster still, and a cold one
    fills the cache for the next run); else `load_rank`, the light cold load. `cache` as
    `traceq.load`'s."""
    from traceq.loader.cache import enabled
    from traceq.pipeline import load

    return load(path, cache=cache) if rules or enabled(cache) else load_rank(path)
