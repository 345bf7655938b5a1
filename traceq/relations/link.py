"""Relations between frames: op nesting, launches, steps and modules.

Every link is a join on the profiler's own keys (`correlation`, `External id`) or an
interval containment on one thread (`nesting`); nothing here loops over rows in Python.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

from traceq.loader import frames as F
from traceq.loader.decode import without_null_storage
from traceq.loader.frames import MODULE_PREFIX
from traceq.relations.launches import LAUNCH_API as LAUNCH_API
from traceq.relations.nesting import NONE, depths, enclosing, parents


def _groups(*frames: pl.DataFrame) -> list[np.ndarray]:
    """Dense integer ids for (pid, tid), shared by all the given frames."""
    keys = pl.concat([f.select("pid", "tid") for f in frames]).unique()
    keys = keys.with_row_index("_group")
    return [
        f.select("pid", "tid")
        .join(keys, on=["pid", "tid"], how="left", nulls_equal=True, maintain_order="left")[
            "_group"
        ]
        .cast(pl.Int64)
        .to_numpy()
        for f in frames
    ]


def _intervals(frame: pl.DataFrame, group: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return group, frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy()


def _events_at(frame: pl.DataFrame, index: np.ndarray) -> pl.Series:
    """`event` ids of `frame` at positions `index` (-1 -> null)."""
    return frame["event"].cast(pl.Int64).gather(_positions(index))


def _positions(index: np.ndarray) -> pl.Series:
    return pl.Series(index, dtype=pl.Int64).replace(NONE, None)


def nest_ops(ops: pl.DataFrame) -> pl.DataFrame:
    """Add `parent` (event id of the enclosing op on the same thread) and `depth`."""
    (group,) = _groups(ops)
    parent = parents(*_intervals(ops, group))
    return ops.with_columns(
        _events_at(ops, parent).alias("parent"),
        pl.Series("depth", depths(parent)),
    )


def _parent_positions(nested: pl.DataFrame) -> np.ndarray:
    """The `parent` event ids `nest_ops` wrote, as row positions (-1: none): the nesting
    is already known, so it is not computed again."""
    positions = nested.select(pl.col("event").cast(pl.Int64).alias("parent")).with_row_index()
    return (
        nested.select("parent")
        .join(positions, on="parent", how="left", maintain_order="left")["index"]
        .cast(pl.Int64)
        .fill_null(NONE)
        .to_numpy()
    )


def enclosing_op(rows: pl.DataFrame, ops: pl.DataFrame) -> pl.Series:
    """Event id of the innermost op enclosing each row on its thread (runtime calls, ...).

    `ops` is the output of `nest_ops`."""
    if rows.height == 0:
        return pl.Series([], dtype=pl.Int64)
    row_group, op_group = _groups(rows, ops)
    op_parent = _parent_positions(ops)
    found = enclosing(_intervals(rows, row_group), _intervals(ops, op_group), op_parent)
    return _events_at(ops, found)


def link_runtime(runtime: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Add `op_event`: the CPU op a runtime call was made from."""
    return runtime.with_columns(enclosing_op(runtime, ops).alias("op_event"))


def link_kernels(kernels: pl.DataFrame, runtime: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Add `runtime_event`, `launch_ts_ns`, `launch_tid` and `op_event` to each GPU activity.

    Launch by correlation id; the op from the launch, else by `External id`.
    """
    # The first row of each key, as `unique(keep="first")` keeps it but 1.3-2x faster; the
    # columns chosen before, as the filter would otherwise copy every column of the frame.
    launches = (
        runtime.select(
            "correlation",
            pl.col("event").alias("runtime_event"),
            pl.col("ts_ns").alias("launch_ts_ns"),
            pl.col("pid").alias("launch_pid"),
            pl.col("tid").alias("launch_tid"),
            pl.col("op_event").alias("_launch_op"),
        )
        .filter(pl.col("correlation").is_not_null())
        .filter(pl.col("correlation").is_first_distinct())
    )
    by_external = (
        ops.select("external_id", pl.col("event").alias("_external_op"))
        .filter(pl.col("external_id").is_not_null())
        .filter(pl.col("external_id").is_first_distinct())
    )
    # Joined on the two keys alone, the looked-up columns then added to the kernels: a join
    # of the whole frame copied every kernel column twice.
    found = (
        kernels.select("correlation", "external_id")
        .join(launches, on="correlation", how="left", maintain_order="left")
        .join(by_external, on="external_id", how="left", maintain_order="left")
        .select(
            "runtime_event",
            "launch_ts_ns",
            "launch_pid",
            "launch_tid",
            pl.coalesce("_launch_op", "_external_op").alias("op_event"),
        )
    )
    return kernels.hstack(found)


def step_of(frame: pl.DataFrame, steps: pl.DataFrame, ts: str = "ts_ns") -> pl.Series:
    """The `ProfilerStep#N` whose CPU window holds each row's `ts` (null outside steps): the
    last window starting at or before it, if it has not ended. A binary search over the
    sorted starts (numpy), not an as-of join: a job's map asks this five times per rank,
    and the join's sort, row index and join back cost more than the search."""
    if steps.height == 0 or frame.height == 0:
        return pl.Series("step", [None] * frame.height, dtype=pl.Int64)
    windows = steps.filter(pl.col("ts_ns").is_not_null()).sort("ts_ns", maintain_order=True)
    times = frame[ts]
    at = np.searchsorted(windows["ts_ns"].to_numpy(), times.fill_null(0).to_numpy(), "right")
    found = pl.DataFrame({"_t": times, "_at": pl.Series(at, dtype=pl.Int64) - 1}).select(
        pl.when(pl.col("_t").is_not_null() & (pl.col("_at") >= 0)).then("_at")
    )
    index = found.to_series()
    inside = (times < windows["end_ns"].gather(index)).fill_null(False)
    return windows["step"].gather(index).set(~inside, None).alias("step")


def attribute_steps(frames: dict[str, pl.DataFrame]) -> None:
    """Give ops, runtime, annotations, python frames and kernels their step, in place."""
    steps = frames["steps"]
    for name in ("ops", "runtime", "annotations", "python"):
        frames[name] = frames[name].with_columns(step_of(frames[name], steps).alias("step"))
    kernels = frames["kernels"]
    by_launch = step_of(kernels, steps, ts="launch_ts_ns")
    by_time = step_of(kernels, steps)
    frames["kernels"] = kernels.with_columns(pl.coalesce(by_launch, by_time).alias("step"))


def modules(python: pl.DataFrame) -> pl.DataFrame:
    """`nn.Module` calls as a tree: `module` (class_index), `path` (dotted, root first)."""
    rows = python.filter(pl.col("is_module"))
    (group,) = _groups(rows)
    parent = parents(*_intervals(rows, group))
    names = rows["name"].str.strip_prefix(MODULE_PREFIX)
    paths = names.to_numpy().astype(object)
    # Paths are strings built root-first; depth is small, so this walks levels, not rows.
    depth = depths(parent)
    for level in range(1, int(depth.max(initial=0)) + 1):
        at = np.flatnonzero(depth == level)
        paths[at] = paths[parent[at]] + "." + paths[at]
    return rows.select(
        "event", "pid", "tid", "ts_ns", "dur_ns", "end_ns", "python_id"
    ).with_columns(
        names.alias("module"),
        pl.Series("path", paths.tolist(), dtype=pl.String),
        _events_at(rows, parent).alias("parent"),
        pl.Series("depth", depth),
    )


def attribute_modules(frame: pl.DataFrame, mods: pl.DataFrame) -> pl.Series:
    """The dotted path of the innermost module call enclosing each row, or null.

    Module frames are matched on the same thread when the trace gives Python frames real
    thread ids; some profiler versions record them on tid 0, then time alone decides.
    """
    if mods.height == 0 or frame.height == 0:
        return pl.Series("module", [None] * frame.height, dtype=pl.String)
    shared = set(frame["tid"].unique().to_list()) & set(mods["tid"].unique().to_list())
    if shared:
        row_group, mod_group = _groups(frame, mods)
    else:
        row_group = np.zeros(frame.height, dtype=np.int64)
        mod_group = np.zeros(mods.height, dtype=np.int64)
    mod_parent = parents(*_intervals(mods, mod_group))
    found = enclosing(_intervals(frame, row_group), _intervals(mods, mod_group), mod_parent)
    return mods["path"].gather(_positions(found)).alias("module")


def link_frames(events: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """All typed frames of one trace (`loader.frames`), linked to each other: ops nested,
    launches joined to their kernels and ops, everything placed in its step and module.

    The kernels (their `args` parse, the longest frame to build), then the instants, are
    built in a second thread while this one pairs the flows, nests the ops and links the
    runtime calls: each is a chain of Polars queries that leaves a core idle between its
    parallel parts (the instants there: the link 2.33 -> 2.17 s on 2.16M events, median of
    5 alternated runs; the runtime calls there as well: no faster). The flows come first:
    pairing them by id is the largest transient of the link (~100 MiB on 2.16M events), and
    it costs least while little else is held.
    """
    events = F.with_category_key(events)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="traceq-link") as pool:
        gpu = pool.submit(F.kernels, events)
        marks = pool.submit(F.instants, events)
        points = F.flow_points(events)
        flows = F.flows(points)
        ops = nest_ops(F.ops(events))
        runtime = link_runtime(F.runtime(events), ops)
        kernels = link_kernels(gpu.result(), runtime, ops)
        instants = marks.result()
    python = F.python(events)
    module_calls = modules(python)
    frames = {
        "ops": ops,
        "kernels": kernels,
        "runtime": runtime,
        "annotations": F.annotations(events),
        "steps": F.steps(events),
        "python": python,
        "modules": module_calls,
        "flows": flows,
        "flow_points": points,
        "syncs": F.syncs(events),
        "counters": F.counters(events),
        "instants": instants,
        "threads": F.threads(events),
        "other": F.other(events),
    }
    attribute_steps(frames)
    frames["ops"] = frames["ops"].with_columns(attribute_modules(frames["ops"], module_calls))
    op_modules = frames["ops"].select(pl.col("event").alias("op_event"), pl.col("module"))
    kernel_modules = (
        frames["kernels"]
        .select("op_event")
        .join(op_modules, on="op_event", how="left", maintain_order="left")
    )
    frames["kernels"] = frames["kernels"].hstack([kernel_modules["module"]])
    return {name: without_null_storage(frame) for name, frame in frames.items()}
