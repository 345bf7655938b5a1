"""Replayed ops: the ops a graph replay ran, as rows of the replay's `ops` frame.

A replayed kernel paired with its captured launch (`relations.graph_replay`) knows the
capture's op by name and shapes, but an op of another trace is no op of this one: data
flow, the fusion rules, the roofline, `diff` and the breakdowns read `trace.ops`. So each
graph launch gets a copy of the ops its captured graph ran: every op the capture trace
records on the capturing thread between `cudaStreamBeginCapture` and
`cudaStreamEndCapture` (views and the ops that launched nothing included, as data flow
reads them; their nesting kept), with what the capture recorded (`name`, `input_dims`,
`shapes`, `input_types`, `input_strides`, `concrete_inputs`, `module`), and the replayed
kernels' `op_event` points at their copy. The copies are marked `replayed = True`; every
op the trace recorded has `replayed = False` (the column exists only on a trace whose
graph replays were attributed).

- **Event ids**: above every event id of the replay (`max(events.event) + 1` up), in
  launch order, then in the capture's order (preorder: an op before its children): they
  cannot collide with a recorded event, and an op's parent comes before it, as in a
  recorded trace (`loader.cache.tree_fault`'s rule).
- **Time**: the CPU ran none of these ops during the replay; it ran the graph launch
  call. The copies sit on the launching thread, inside the launch call's window, one
  instant each in the capture's order (`ts_ns` = launch start + (k + 1) x launch duration
  / (n + 1), at least 1 ns apart) and last 0 ns (`dur_ns` = 0, `end_ns` = `ts_ns`). Data
  flow's thread order is then the capture's order, right where the launch was made (the
  inputs copied into the graph's static buffers before it, the outputs read after it);
  the critical path, which models only CPU events that last, keeps the launch call as
  the CPU's work and reaches the replayed kernels through it, as before; CPU time per op
  (`cpu_ns`) is 0, as it was.
- **Parent, step**: a top-level op of the capture gets, as its parent, the op enclosing
  the graph launch in the replay (null when none); the others their copied parent.
  `step` is the launch's step; `pid`/`tid` the launch's. `external_id`,
  `sequence_number`, `fwd_thread_id` and `record_function_id` are null: they are the
  capture's keys, meaningless here.

- **Module calls**: the capture's `nn.Module` call events around at least one copied op
  are copied into `modules` the same way (`with_replayed_modules`), each from its first
  copied op's instant to its last one's, so data flow scopes the copies by module call as
  it scoped the capture's ops.

Limits: a kernel the launch replayed but no captured launch paired with keeps its op (the one
around the launch, often none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceq.relations.graph_replay import _capture_windows, replayed_kernels

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace
    from traceq.relations.graph_replay import Capture

COPIED = ("name", "input_dims", "shapes", "input_types", "input_strides", "concrete_inputs")
"""What a replayed op takes from the captured one as it is; `module` too."""
NULLED = ("external_id", "sequence_number", "fwd_thread_id", "record_function_id")
"""The capture's keys: null on a copy."""
GRAPH_OFFSET = 1_000_000
"""`capture_graph` = graph index in its capture trace + capture index x this
(`graph_replay.attribute`'s numbering)."""


def captured_ops(captures: list[Capture]) -> pl.DataFrame:
    """Per captured graph, the ops its capture ran, in preorder: `capture_graph`, `rank`,
    `capture_event`, `_local_parent` (rank of its parent in the graph; null: a top-level
    op of the graph), `_local_depth`, and the columns copied (`COPIED`, `module`)."""
    frames = []
    for offset, capture in enumerate(captures):
        trace = capture.trace
        runtime = trace.select(
            "runtime", "event", "name", "pid", "tid", "ts_ns", "end_ns", "correlation", "op_event"
        )
        windows = _capture_windows(trace, runtime)
        if windows.height == 0:
            continue
        ops = trace.select(
            "ops", "event", "pid", "tid", "ts_ns", "end_ns", "parent", "depth", "module", *COPIED
        )
        for window in windows.iter_rows(named=True):
            inside = ops.filter(
                (pl.col("pid") == window["pid"])
                & (pl.col("tid") == window["tid"])
                & (pl.col("ts_ns") >= window["_start"])
                & (pl.col("ts_ns") < window["_end"])
            ).sort(
                "ts_ns", pl.col("end_ns"), "depth", "event", descending=[False, True, False, False]
            )
            frames.append(_ranked(inside, window["graph"] + offset * GRAPH_OFFSET))
    if not frames:
        return pl.DataFrame(schema=_CAPTURED)
    return pl.concat(frames)


_CAPTURED = {
    "capture_graph": pl.Int64,
    "rank": pl.Int64,
    "capture_event": pl.Int64,
    "_local_parent": pl.Int64,
    "_local_depth": pl.Int32,
    "_capture_ts": pl.Int64,
}


def _ranked(ops: pl.DataFrame, graph: int) -> pl.DataFrame:
    """One graph's ops (in preorder) with their rank, parent rank and depth in the graph."""
    events = ops["event"].cast(pl.Int64)
    rank = pl.DataFrame({"parent": events, "_local_parent": pl.int_range(ops.height, eager=True)})
    parent = (
        ops.select(pl.col("parent").cast(pl.Int64))
        .join(rank, on="parent", how="left", maintain_order="left")["_local_parent"]
        .cast(pl.Int64)
    )
    depth = np.zeros(ops.height, dtype=np.int32)
    for i, p in enumerate(parent.to_list()):  # preorder: a parent comes before its children
        if p is not None:
            depth[i] = depth[p] + 1
    return ops.select(
        pl.lit(graph, dtype=pl.Int64).alias("capture_graph"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("rank"),
        events.alias("capture_event"),
        parent.alias("_local_parent"),
        pl.Series("_local_depth", depth, dtype=pl.Int32),
        "module",
        *COPIED,
        pl.col("ts_ns").alias("_capture_ts"),
    )


def _launches(
    trace: LoadedTrace, template: pl.DataFrame, attribution: pl.DataFrame
) -> pl.DataFrame:
    """Each graph launch with a paired captured graph: `graph_launch`, `capture_graph`,
    `_n` (ops copied), `_first` (the first copy's event id), `_spacing`, and the launch
    call's `pid`, `tid`, `ts_ns`, `dur_ns`, `op_event`, `step`."""
    chosen = (
        attribution.select(pl.col("event").cast(pl.Int64), "capture_graph")
        .drop_nulls()
        .join(
            replayed_kernels(trace).select(pl.col("event").cast(pl.Int64), "graph_launch"),
            on="event",
        )
        .group_by("graph_launch")
        .agg(pl.col("capture_graph").mode().sort(nulls_last=True).first())
    )
    sizes = template.group_by("capture_graph").agg(pl.len().alias("_n"))
    calls = trace.select("runtime", "event", "pid", "tid", "ts_ns", "dur_ns", "op_event", "step")
    launches = (
        chosen.join(sizes, on="capture_graph")
        .join(
            calls.with_columns(pl.col("event").cast(pl.Int64)).rename({"event": "graph_launch"}),
            on="graph_launch",
        )
        .sort("ts_ns", "graph_launch")
    )
    base = int(trace.select("events", "event")["event"].max() or 0) + 1
    return launches.with_columns(
        (base + pl.col("_n").cum_sum() - pl.col("_n")).alias("_first"),
        (pl.col("dur_ns") // (pl.col("_n") + 1)).clip(lower_bound=1).alias("_spacing"),
    )


def _captured_calls(captures: list[Capture], template: pl.DataFrame) -> pl.DataFrame:
    """Per captured graph, the module calls around at least one of its ops: the capture's
    `modules` rows with `capture_graph`, `_from`/`_to` (ranks of the first and last op
    inside), `_mrank` (order in the graph) and `_prank` (the parent call's `_mrank`)."""
    calls = []
    for offset, capture in enumerate(captures):
        mods = capture.trace.modules
        ops = template.filter((pl.col("capture_graph") // GRAPH_OFFSET) == offset)
        if mods.height == 0 or ops.height == 0:
            continue
        for graph in ops["capture_graph"].unique().sort().to_list():
            ts = ops.filter(pl.col("capture_graph") == graph).sort("rank")["_capture_ts"]
            ts = ts.to_numpy()
            inside = mods.filter((pl.col("end_ns") >= ts.min()) & (pl.col("ts_ns") <= ts.max()))
            first = np.searchsorted(ts, inside["ts_ns"].to_numpy(), side="left")
            last = np.searchsorted(ts, inside["end_ns"].to_numpy(), side="right") - 1
            calls.append(
                inside.with_columns(
                    pl.lit(graph, dtype=pl.Int64).alias("capture_graph"),
                    pl.Series("_from", first, dtype=pl.Int64),
                    pl.Series("_to", last, dtype=pl.Int64),
                ).filter(pl.col("_from") <= pl.col("_to"))
            )
    if not calls:
        return pl.DataFrame()
    captured = (
        pl.concat(calls)
        .sort("capture_graph", "event")
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over("capture_graph").alias("_mrank"))
    )
    ranks = captured.select(
        "capture_graph",
        pl.col("event").cast(pl.Int64).alias("parent"),
        pl.col("_mrank").alias("_prank"),
    )
    return captured.with_columns(pl.col("parent").cast(pl.Int64)).join(
        ranks, on=["capture_graph", "parent"], how="left", maintain_order="left"
    )


def with_replayed_modules(
    trace: LoadedTrace, captures: list[Capture], attribution: pl.DataFrame
) -> pl.DataFrame:
    """`trace.modules` with each graph launch's copies of the module calls around its
    captured graph's ops (see the module's docstring): event ids above the ops' copies,
    parent the copied parent call (null for the outermost), on the launching thread."""
    modules = trace.modules
    template = captured_ops(captures)
    launches = _launches(trace, template, attribution)
    captured = _captured_calls(captures, template) if launches.height else pl.DataFrame()
    if captured.height == 0:
        return modules
    above = int(launches.select((pl.col("_first") + pl.col("_n")).max()).item())
    sizes = captured.group_by("capture_graph").agg(pl.len().cast(pl.Int64).alias("_m"))
    copies = (
        launches.join(sizes, on="capture_graph")
        .sort("ts_ns", "graph_launch")
        .select(
            "capture_graph",
            "_spacing",
            (above + pl.col("_m").cum_sum() - pl.col("_m")).alias("_mfirst"),
            pl.col("ts_ns").alias("_launch_ts"),
            pl.col("pid").alias("_pid"),
            pl.col("tid").alias("_tid"),
        )
        .join(captured, on="capture_graph")
    )
    at = pl.col("_launch_ts") + (pl.col("_from") + 1) * pl.col("_spacing")
    until = pl.col("_launch_ts") + (pl.col("_to") + 1) * pl.col("_spacing")
    added = copies.select(
        (pl.col("_mfirst") + pl.col("_mrank")).alias("event"),
        pl.col("_pid").alias("pid"),
        pl.col("_tid").alias("tid"),
        at.alias("ts_ns"),
        (until - at).alias("dur_ns"),
        until.alias("end_ns"),
        "python_id",
        "module",
        "path",
        (pl.col("_mfirst") + pl.col("_prank")).alias("parent"),
        "depth",
    )
    return pl.concat([modules, added.select(modules.columns).cast(dict(modules.schema))])


def with_replayed_ops(
    trace: LoadedTrace,
    captures: list[Capture],
    attribution: pl.DataFrame,
    kernels: pl.DataFrame,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`trace.ops` with each graph launch's copies of its captured graph's ops added (and
    the column `replayed`), and `kernels` (already `with_attribution`) with each paired
    replayed kernel's `op_event` pointing at its copy. See the module's docstring."""
    ops = trace.ops
    template = captured_ops(captures)
    launches = _launches(trace, template, attribution)
    flagged = ops.with_columns(pl.lit(False).alias("replayed"))
    if launches.height == 0:
        return flagged, kernels
    depths = ops.select(pl.col("event").cast(pl.Int64).alias("op_event"), "depth")
    launches = launches.join(depths, on="op_event", how="left")
    copies = launches.join(template, on="capture_graph")
    at = pl.col("ts_ns") + (pl.col("rank") + 1) * pl.col("_spacing")
    depth_base = (pl.col("depth").cast(pl.Int32) + 1).fill_null(0)
    added = copies.select(
        (pl.col("_first") + pl.col("rank")).cast(ops.schema["event"]).alias("event"),
        "name",
        pl.col("pid").cast(ops.schema["pid"]),
        pl.col("tid").cast(ops.schema["tid"]),
        at.alias("ts_ns"),
        pl.lit(0, dtype=pl.Int64).alias("dur_ns"),
        at.alias("end_ns"),
        "input_dims",
        *[pl.lit(None, dtype=ops.schema[c]).alias(c) for c in NULLED],
        "shapes",
        "input_types",
        "input_strides",
        "concrete_inputs",
        pl.coalesce(pl.col("_first") + pl.col("_local_parent"), pl.col("op_event")).alias("parent"),
        (depth_base + pl.col("_local_depth")).alias("depth"),
        "step",
        "module",
    )
    added = (
        added.select(ops.columns)
        .cast(dict(ops.schema))
        .with_columns(pl.lit(True).alias("replayed"))
    )
    # each paired replayed kernel -> its launch's copy of its captured op
    copy_of = copies.select(
        "graph_launch",
        "capture_graph",
        "capture_event",
        (pl.col("_first") + pl.col("rank")).alias("_copy"),
    )
    paired = (
        attribution.select(
            pl.col("event").cast(pl.Int64),
            "capture_graph",
            pl.col("capture_op_event").alias("capture_event"),
        )
        .drop_nulls()
        .join(
            replayed_kernels(trace).select(pl.col("event").cast(pl.Int64), "graph_launch"),
            on="event",
        )
        .join(copy_of, on=["graph_launch", "capture_graph", "capture_event"])
        .select(pl.col("event").cast(kernels.schema["event"]), "_copy")
    )
    relinked = kernels.join(paired, on="event", how="left", maintain_order="left").with_columns(
        pl.coalesce("_copy", "op_event").cast(kernels.schema["op_event"]).alias("op_event")
    )
    return pl.concat([flagged, added]), relinked.drop("_copy")
