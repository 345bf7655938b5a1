"""A rank loaded for the job's map: only the frames its summary reads, the rest on demand.

A job's per-rank map reads five frames (ops, runtime, kernels, annotations, steps) and of
those few columns: times, names, nesting, launches, steps — never tensor shapes, launch
grids, occupancy, Python frames, modules, flows or syncs. `load_rank` reads from the file
only the events and fields those need (`traceq.job.rankread`), then links just those five
frames with the loader's own link functions (so each column it builds is the one
`traceq.load` builds). Anything else asked for later — another
frame, the raw `events`, another event's `args` — loads the file with `traceq.load`, so a
rule that needs it still sees the whole trace. A file the reader cannot read exactly is
decoded by the loader and linked the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import polars as pl

from traceq.errors import TraceError
from traceq.job.rankread import RankEvents, Unread, read_frame, read_rank
from traceq.loader import frames as F
from traceq.loader.decode import without_null_storage
from traceq.loader.load import read_events
from traceq.loader.source import describe
from traceq.trace import Trace


class RankFrames(dict[str, pl.DataFrame]):
    """The light frames; the first frame asked for that is not among them — or any look
    at the whole mapping (iteration, `in`, `get`, `len`) — builds every frame of the trace
    (`full`: the loader's), and from then on every frame is the full one."""

    def __init__(
        self, light: dict[str, pl.DataFrame], full: Callable[[], Mapping[str, pl.DataFrame]]
    ) -> None:
        super().__init__(light)
        self._full: Callable[[], Mapping[str, pl.DataFrame]] | None = full

    @property
    def complete(self) -> bool:
        return self._full is None

    def _complete(self) -> None:
        if self._full is not None:
            full, self._full = self._full, None
            self.update(full())

    def __missing__(self, name: str) -> pl.DataFrame:
        if self._full is None:
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


class FullLoad:
    """`traceq.load(path, cache=False)` on the first call, kept for the next ones."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        self.trace: Trace | None = None

    def __call__(self) -> Trace:
        if self.trace is None:
            from traceq.pipeline import load

            self.trace = load(self.path, cache=False)
        return self.trace


class RankTrace(Trace):
    """A rank as `rankread` read it: the light frames, `ph` and `cat` of every event, and
    the `args` of the events read. The first look at anything else (`events`, another
    frame, the `args` of an event not read) loads the file with `traceq.load`, once."""

    def __init__(self, source: str, path: str | os.PathLike[str], read: RankEvents) -> None:
        self._read = read
        # The callables hold the load, not this trace: a cycle through the trace would keep
        # each rank's frames alive until a full garbage collection (+3.5 MB a rank mapped).
        self.full = full = FullLoad(path)
        frames = RankFrames(light_frames(read.read), lambda: full().frames)
        super().__init__(source, read.metadata, lambda: full().events, frames)

    @property
    def unread(self) -> pl.DataFrame:
        """Events the map did not read, counted by `ph` and `cat` (`RankEvents.unread`)."""
        return self._read.unread

    def select(self, name: str, *columns: str) -> pl.DataFrame:
        if name == "events" and set(columns) <= set(self._read.phases.columns):
            return self._read.phases.select(columns)
        return super().select(name, *columns)

    def with_args(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The `args` of collectives from what was read, any other event's from the file."""
        args = self._read.collective_args
        if frame.join(args, on="event", how="anti").height == 0:
            return frame.join(args, on="event", how="left")
        return super().with_args(frame)


def load_rank(path: str | os.PathLike[str]) -> Trace:
    """One rank's `Trace` with the frames the job's map reads (never from the cache: the
    map of a job is one pass over each file): a `RankTrace`, or, for a file `rankread`
    leaves to the loader, the loader's events linked into the same light frames."""
    name = describe(path)
    try:
        try:
            return RankTrace(name, path, read_rank(path))
        except Unread:
            pass
        decoded = read_events(path, None, lambda _: None)
        frames = light_frames(read_frame(decoded.events))
    except TraceError as exc:
        if exc.source is None:
            raise type(exc)(str(exc), source=name) from None
        raise
    events = decoded.events
    return Trace(
        source=name,
        metadata=decoded.metadata,
        events=events,
        frames=RankFrames(frames, lambda: _link(events)),
    )


def _link(events: pl.DataFrame) -> dict[str, pl.DataFrame]:
    from traceq.relations.link import link_frames

    return link_frames(events)


def light_frames(read: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """ops, runtime, kernels, annotations and steps from the events the map reads
    (`rankread.read_frame`'s columns), linked as `link_frames` links them, with only the
    columns the job's map reads."""
    # numpy comes with the links: imported for a cold load, not for a map served by the cache
    from traceq.relations.link import link_kernels, link_runtime, nest_ops, step_of

    ops = nest_ops(_frame(read, F.OP_CATS, "external_id"))
    runtime_kind = _kind(F.RUNTIME_CATS, "runtime")
    runtime = _frame(read, F.RUNTIME_CATS, runtime_kind, "correlation", "external_id")
    runtime = link_runtime(runtime, ops)
    device = pl.coalesce("_device", "pid").alias("device")
    kernel_kind = _kind(F.GPU_CATS, "kernel")
    kernels = _frame(read, F.GPU_CATS, kernel_kind, device, "correlation", "external_id")
    kernels = link_kernels(kernels.drop("pid", "tid"), runtime, ops)  # device, not pid
    annotation_kind = pl.col(F.CATEGORY_KEY).replace_strict(F.ANNOTATION_CATS).alias("kind")
    annotations = _frame(read, F.ANNOTATION_CATS, annotation_kind)
    steps = F.steps(read)
    frames = {"ops": ops, "runtime": runtime, "annotations": annotations, "steps": steps}
    for name in ("ops", "runtime", "annotations"):
        frames[name] = frames[name].with_columns(step_of(frames[name], steps).alias("step"))
    by_launch = step_of(kernels, steps, ts="launch_ts_ns")
    frames["kernels"] = kernels.with_columns(
        pl.coalesce(by_launch, step_of(kernels, steps)).alias("step")
    )
    return {name: without_null_storage(frame) for name, frame in frames.items()}


def _frame(read: pl.DataFrame, cats: Any, *columns: str | pl.Expr) -> pl.DataFrame:
    """The complete events of `cats`: `event, name, pid, tid, ts_ns, dur_ns, end_ns` and
    `columns` (each named as `loader.frames` names it)."""
    rows = read.filter((pl.col("ph") == "X") & pl.col(F.CATEGORY_KEY).is_in(list(cats)))
    return rows.select(
        "event",
        "name",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns"),
        *columns,
    )


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
