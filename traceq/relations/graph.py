"""The dependency graph: what has to happen before what, between CPU events and GPU work.

Edges come from the trace's own records, each with a `kind`:
- `stream`: consecutive activities on one GPU stream (a stream runs in order);
- `launch`: the runtime call -> the kernel/memcpy/memset it enqueued (by correlation);
- `cpu_order`: consecutive CPU events on one thread, in program (start) order;
- `cross_stream_sync`: a kernel -> the kernel another stream made wait for it
  (`cudaEventRecord` then `cudaStreamWaitEvent`, from `cuda_sync` events);
- `host_sync`: a GPU activity -> the runtime call that blocked the CPU until it finished
  (`cudaDeviceSynchronize`, `cudaStreamSynchronize`, `cudaEventSynchronize`, a
  synchronous memcpy);
- `fwdbwd`: a forward op -> its backward op (the profiler's `fwdbwd` flows).

Every edge list is a Polars frame (`src`, `dst`, `kind`) built by joins; `build_graph`
turns them into a networkx `DiGraph` whose node ids are event ids. The `kernel` level
holds only GPU activities and the runtime calls that launch or wait for them, which is
what the critical path and the launch/sync analyzers need; `full` adds every op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import networkx as nx
import polars as pl

from traceq.relations.link import LAUNCH_API

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

Level = Literal["kernel", "full"]
EDGE_KINDS = ("stream", "launch", "cpu_order", "cross_stream_sync", "host_sync", "fwdbwd")
DEVICE_SYNC = r"(?i)^(cuda|hip)DeviceSynchronize$|^cuCtxSynchronize$"
STREAM_SYNC = r"(?i)^(cuda|hip)StreamSynchronize$|^cuStreamSynchronize$"
SYNC_MEMCPY = r"(?i)^(cuda|hip)Memcpy(\w*)$|^cuMemcpy\w*$"
GRAPH_LAUNCH = r"(?i)^(cuda|hip)GraphLaunch|^cuGraphLaunch"
_EDGE_SCHEMA = {"src": pl.Int64, "dst": pl.Int64, "kind": pl.String}
_WAIT_SCHEMA = {"src": pl.Int64, "dst": pl.Int64, "sync": pl.Int64, "call": pl.Int64}


# -- GPU side -------------------------------------------------------------------------------


def launched(trace: LoadedTrace) -> pl.DataFrame:
    """GPU activities with their launch: event, device, stream, ts_ns, end_ns, name, kind,
    runtime_event, launch_ts_ns, launch_pid, launch_tid (launch columns null if none)."""
    return trace.kernels.select(
        pl.col("event").cast(pl.Int64),
        "kind",
        "name",
        "device",
        "stream",
        "ts_ns",
        "end_ns",
        "correlation",
        pl.col("runtime_event").cast(pl.Int64),
        "launch_ts_ns",
        "launch_pid",
        "launch_tid",
    )


def stream_edges(activities: pl.DataFrame) -> pl.DataFrame:
    """Each GPU activity -> the next one on its (device, stream)."""
    ordered = activities.sort("device", "stream", "ts_ns", "event").with_columns(
        pl.col("event").shift(-1).over("device", "stream").alias("dst")
    )
    return ordered.filter(pl.col("dst").is_not_null()).select(
        pl.col("event").alias("src"), "dst", pl.lit("stream").alias("kind")
    )


def launch_edges(activities: pl.DataFrame) -> pl.DataFrame:
    """Runtime call -> the activity it enqueued (a graph launch -> each replayed kernel)."""
    return activities.filter(pl.col("runtime_event").is_not_null()).select(
        pl.col("runtime_event").alias("src"),
        pl.col("event").alias("dst"),
        pl.lit("launch").alias("kind"),
    )


def _runtime_by_correlation(trace: LoadedTrace) -> pl.DataFrame:
    return (
        trace.runtime.filter(pl.col("correlation").is_not_null())
        .unique("correlation", keep="first")
        .select(
            "correlation",
            pl.col("event").cast(pl.Int64).alias("call"),
            pl.col("name").alias("call_name"),
            pl.col("pid").alias("call_pid"),
            pl.col("tid").alias("call_tid"),
            pl.col("ts_ns").alias("call_ts"),
            pl.col("end_ns").alias("call_end"),
        )
    )


def _last_launched_before(
    probes: pl.DataFrame, activities: pl.DataFrame, at: str, stream: str
) -> pl.Series:
    """Event of the last activity launched onto (`device`, `stream`) before `at`, or null.

    This is what a `cudaEventRecord` at `at` on that stream captures.
    """
    launches = (
        activities.filter(pl.col("launch_ts_ns").is_not_null())
        .select("device", pl.col("stream").alias("_stream"), "launch_ts_ns", "event")
        .sort("launch_ts_ns")
    )
    probe = probes.with_row_index("_row").select(
        "_row", "device", pl.col(stream).alias("_stream"), pl.col(at).alias("_at")
    )
    found = (
        probe.drop_nulls()
        .sort("_at")
        .join_asof(
            launches,
            left_on="_at",
            right_on="launch_ts_ns",
            by=["device", "_stream"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
    )
    return probe.join(found.select("_row", "event"), on="_row", how="left").sort("_row")["event"]


def stream_waits(trace: LoadedTrace, activities: pl.DataFrame | None = None) -> pl.DataFrame:
    """Cross-stream syncs: src = the activity a `cudaEventRecord` captured, dst = the first
    activity launched onto the waiting stream after the `cudaStreamWaitEvent`.

    Needs the `cuda_sync` events ("Stream Wait Event") that newer PyTorch versions record;
    columns src, dst, sync (the cuda_sync event), call (the cudaStreamWaitEvent event).
    """
    candidates = trace.syncs.filter(pl.col("name") == "Stream Wait Event")
    if candidates.height == 0:
        return pl.DataFrame(schema=_WAIT_SCHEMA)
    activities = launched(trace) if activities is None else activities
    calls = _runtime_by_correlation(trace)
    waits = (
        candidates.filter(
            (pl.col("wait_on_record_correlation") >= 0) & (pl.col("wait_on_stream") >= 0)
        )
        .join(calls, on="correlation", how="inner")
        .join(
            calls.select(
                pl.col("correlation").alias("wait_on_record_correlation"),
                pl.col("call_ts").alias("record_ts"),
            ),
            on="wait_on_record_correlation",
            how="inner",
        )
    )
    if waits.height == 0:
        return pl.DataFrame(schema=_WAIT_SCHEMA)
    src = _last_launched_before(waits, activities, "record_ts", "wait_on_stream")
    later = (
        activities.filter(pl.col("launch_ts_ns").is_not_null())
        .select(
            pl.col("launch_pid").alias("call_pid"),
            pl.col("launch_tid").alias("call_tid"),
            "device",
            "stream",
            "launch_ts_ns",
            pl.col("event").alias("dst"),
        )
        .sort("launch_ts_ns")
    )
    dst = (
        waits.with_columns(src.alias("src"))
        .sort("call_ts")
        .join_asof(
            later,
            left_on="call_ts",
            right_on="launch_ts_ns",
            by=["call_pid", "call_tid", "device", "stream"],
            strategy="forward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
    )
    return (
        dst.filter(pl.col("src").is_not_null() & pl.col("dst").is_not_null())
        .select(
            "src",
            "dst",
            pl.col("event").cast(pl.Int64).alias("sync"),
            "call",
        )
        .unique("dst", keep="last", maintain_order=True)
    )


def host_waits(trace: LoadedTrace, activities: pl.DataFrame | None = None) -> pl.DataFrame:
    """GPU activity -> the runtime call that blocked the CPU until it was done.

    From `cuda_sync` events when the trace has them (Context Sync: the last activity on
    every stream of the device; Stream Sync: on that stream; Event Sync: the activity the
    event captured). Otherwise from the call names: device syncs wait for every stream the
    process launched to, stream syncs for their stream (or all, when the trace does not
    say which), and a memcpy call that returns after its copy finished waited for it.
    Columns: src (activity), dst (runtime call), how.
    """
    activities = launched(trace) if activities is None else activities
    if trace.syncs.height:
        waits = _host_waits_from_syncs(trace, activities)
    else:
        waits = _host_waits_from_names(trace, activities)
    # Joins leave rows in no set order: sort, so the same trace gives the same frame.
    return waits.unique(["src", "dst"], keep="first", maintain_order=True).sort("dst", "src")


def _last_started_before(
    probes: pl.DataFrame, activities: pl.DataFrame, by: list[str], at: str
) -> pl.DataFrame:
    """For each probe row (a runtime call `dst`) and each matching stream: the last activity
    started before `at`."""
    started = activities.select(*by, "stream", "ts_ns", pl.col("event").alias("src")).sort(
        "ts_ns", "src"
    )  # ties broken by event id, here and below: the same answer every run
    streams = activities.select(*by, "stream").unique(maintain_order=True)
    expanded = (
        probes.join(streams, on=by, how="inner") if "stream" not in probes.columns else probes
    )
    return (
        expanded.sort(at, "dst", "stream")
        .join_asof(
            started,
            left_on=at,
            right_on="ts_ns",
            by=[*by, "stream"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .filter(pl.col("src").is_not_null())
    )


def _host_waits_from_syncs(trace: LoadedTrace, activities: pl.DataFrame) -> pl.DataFrame:
    calls = _runtime_by_correlation(trace)
    syncs = trace.syncs.join(calls, on="correlation", how="inner").with_columns(
        pl.col("call").alias("dst")
    )
    context = syncs.filter(pl.col("name") == "Context Sync").select("device", "dst", "end_ns")
    stream = syncs.filter((pl.col("name") == "Stream Sync") & (pl.col("stream") >= 0)).select(
        "device", "stream", "dst", "end_ns"
    )
    parts = [
        _last_started_before(context, activities, ["device"], "end_ns").select(
            "src", "dst", pl.lit("context-sync").alias("how")
        ),
        _last_started_before(stream, activities, ["device"], "end_ns").select(
            "src", "dst", pl.lit("stream-sync").alias("how")
        ),
    ]
    event = syncs.filter(
        (pl.col("name") == "Event Sync")
        & (pl.col("wait_on_record_correlation") >= 0)
        & (pl.col("wait_on_stream") >= 0)
    ).join(
        calls.select(
            pl.col("correlation").alias("wait_on_record_correlation"),
            pl.col("call_ts").alias("record_ts"),
        ),
        on="wait_on_record_correlation",
        how="inner",
    )
    if event.height:
        src = _last_launched_before(event, activities, "record_ts", "wait_on_stream")
        parts.append(
            event.with_columns(src.alias("src"))
            .filter(pl.col("src").is_not_null())
            .select("src", "dst", pl.lit("event-sync").alias("how"))
        )
    return pl.concat(parts).cast({"src": pl.Int64, "dst": pl.Int64})


def _host_waits_from_names(trace: LoadedTrace, activities: pl.DataFrame) -> pl.DataFrame:
    calls = trace.runtime.filter(
        pl.col("name").str.contains(DEVICE_SYNC) | pl.col("name").str.contains(STREAM_SYNC)
    ).select(
        pl.col("event").cast(pl.Int64).alias("dst"),
        "name",
        pl.col("pid").alias("launch_pid"),
        "end_ns",
        "correlation",
        pl.col("stream_arg").str.extract(r"(-?\d+)$").cast(pl.Int64).alias("_stream"),
    )
    targets = activities.filter(pl.col("launch_pid").is_not_null())
    device = calls.filter(pl.col("name").str.contains(DEVICE_SYNC))
    stream = calls.filter(pl.col("name").str.contains(STREAM_SYNC))
    parts = [
        _last_started_before(device, targets, ["launch_pid"], "end_ns").select(
            "src", "dst", pl.lit("device-sync").alias("how")
        ),
        _last_started_before(
            stream.filter(pl.col("_stream").is_null()), targets, ["launch_pid"], "end_ns"
        ).select("src", "dst", pl.lit("stream-sync").alias("how")),
        _last_started_before(
            stream.filter(pl.col("_stream").is_not_null()).rename({"_stream": "stream"}),
            targets,
            ["launch_pid"],
            "end_ns",
        ).select("src", "dst", pl.lit("stream-sync").alias("how")),
    ]
    copies = activities.filter(
        (pl.col("kind") == "memcpy") & pl.col("runtime_event").is_not_null()
    ).join(
        trace.runtime.filter(pl.col("name").str.contains(SYNC_MEMCPY)).select(
            pl.col("event").cast(pl.Int64).alias("runtime_event"),
            pl.col("ts_ns").alias("call_ts"),
            pl.col("end_ns").alias("call_end"),
        ),
        on="runtime_event",
    )
    parts.append(
        copies.filter(
            (pl.col("end_ns") <= pl.col("call_end")) & (pl.col("end_ns") > pl.col("call_ts"))
        ).select(
            pl.col("event").alias("src"),
            pl.col("runtime_event").alias("dst"),
            pl.lit("sync-memcpy").alias("how"),
        )
    )
    return pl.concat(parts).cast({"src": pl.Int64, "dst": pl.Int64})


# -- CPU side -------------------------------------------------------------------------------


def _cpu_nodes(frame: pl.DataFrame, kind: str) -> pl.DataFrame:
    return frame.select(
        pl.col("event").cast(pl.Int64),
        pl.lit(kind).alias("kind"),
        "name",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        "end_ns",
    )


def cpu_events(
    trace: LoadedTrace,
    level: Level,
    *,
    host: pl.DataFrame | None = None,
    waits: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """CPU nodes: ops and runtime calls (`full`), or only the runtime calls that launch GPU
    work or wait for it (`kernel`). Columns event, kind, name, pid, tid, ts_ns, dur_ns,
    end_ns. `host`/`waits`: `host_waits`/`stream_waits` when the caller has them already."""
    runtime = _cpu_nodes(trace.runtime, "runtime")
    if level == "kernel":
        host = host_waits(trace) if host is None else host
        waits = stream_waits(trace) if waits is None else waits
        waiting = host.select(pl.col("dst").alias("event"))
        stream_calls = waits.select(pl.col("call").alias("event"))
        launching = trace.runtime.filter(
            pl.col("name").str.contains(LAUNCH_API) | pl.col("name").str.contains(GRAPH_LAUNCH)
        ).select(pl.col("event").cast(pl.Int64))
        keep = pl.concat([launching, waiting, stream_calls]).unique()
        return runtime.join(keep, on="event", how="semi")
    return pl.concat([_cpu_nodes(trace.ops, "op"), runtime])


def cpu_order_edges(events: pl.DataFrame) -> pl.DataFrame:
    """Each CPU event -> the next one to start on its thread (outer before inner on ties)."""
    ordered = events.sort(
        "pid",
        "tid",
        "ts_ns",
        pl.col("end_ns"),
        "event",
        descending=[False, False, False, True, False],
    ).with_columns(pl.col("event").shift(-1).over("pid", "tid").alias("dst"))
    return ordered.filter(pl.col("dst").is_not_null()).select(
        pl.col("event").alias("src"), "dst", pl.lit("cpu_order").alias("kind")
    )


def fwdbwd_edges(trace: LoadedTrace) -> pl.DataFrame:
    """Forward op -> backward op, from the profiler's `fwdbwd` flow events."""
    flows = trace.flows.filter(
        (pl.col("cat") == "fwdbwd")
        & pl.col("start_event").is_not_null()
        & pl.col("end_event").is_not_null()
    )
    points = trace.frames["flow_points"].select("event", "pid", "tid", "ts_ns")
    # A flow point sits at the start of the op it belongs to: find that op on its thread.
    ops = trace.ops.select(pl.col("event").cast(pl.Int64).alias("op"), "pid", "tid", "ts_ns").sort(
        "ts_ns"
    )

    def op_at(column: str) -> pl.DataFrame:
        at = flows.select(pl.col(column).alias("event")).join(points, on="event")
        return (
            at.sort("ts_ns")
            .join_asof(
                ops, on="ts_ns", by=["pid", "tid"], strategy="backward", check_sortedness=False
            )
            .select("event", "op")
        )

    start = op_at("start_event").rename({"event": "start_event", "op": "src"})
    end = op_at("end_event").rename({"event": "end_event", "op": "dst"})
    return (
        flows.join(start, on="start_event")
        .join(end, on="end_event")
        .filter(pl.col("src").is_not_null() & pl.col("dst").is_not_null())
        .select("src", "dst", pl.lit("fwdbwd").alias("kind"))
    )


# -- the graph ------------------------------------------------------------------------------


def graph_edges(trace: LoadedTrace, level: Level = "kernel") -> pl.DataFrame:
    """Every dependency edge of the `level` graph: src, dst (event ids), kind."""
    activities = launched(trace)
    waits = stream_waits(trace, activities)
    host = host_waits(trace, activities)
    cpu = cpu_events(trace, level, host=host, waits=waits)
    parts = [
        stream_edges(activities),
        launch_edges(activities).join(
            cpu.select(pl.col("event").alias("src")), on="src", how="semi"
        ),
        cpu_order_edges(cpu),
        waits.select("src", "dst", pl.lit("cross_stream_sync").alias("kind")),
        host.select("src", "dst", pl.lit("host_sync").alias("kind")),
    ]
    if level == "full":
        parts.append(fwdbwd_edges(trace))
    edges = pl.concat([p.cast(_EDGE_SCHEMA) for p in parts])
    return edges.unique(["src", "dst", "kind"], maintain_order=True)


def graph_nodes(trace: LoadedTrace, level: Level = "kernel") -> pl.DataFrame:
    """Every node of the `level` graph: event, kind, name, ts_ns, dur_ns."""
    gpu = trace.kernels.select(pl.col("event").cast(pl.Int64), "kind", "name", "ts_ns", "dur_ns")
    cpu = cpu_events(trace, level).select("event", "kind", "name", "ts_ns", "dur_ns")
    return pl.concat([cpu, gpu]).sort("event")


def unlinked(trace: LoadedTrace) -> dict[str, int]:
    """What the graph could not link, as counts (graph replays, missing launches, waits)."""
    activities = launched(trace)
    graph_calls = trace.runtime.filter(pl.col("name").str.contains(GRAPH_LAUNCH))
    replayed = activities.join(
        graph_calls.select(pl.col("event").cast(pl.Int64).alias("runtime_event")),
        on="runtime_event",
        how="semi",
    )
    waits = trace.runtime.filter(pl.col("name").str.contains(r"(?i)StreamWaitEvent$"))
    resolved = stream_waits(trace, activities)
    counts = {
        "graph_launches": graph_calls.height,
        "graph_kernels_linked": replayed.height,
        "graph_launches_without_kernels": graph_calls.join(
            trace.kernels.select("correlation").unique(), on="correlation", how="anti"
        ).height,
        "activities_without_launch": activities.filter(pl.col("runtime_event").is_null()).height,
        "stream_waits_unresolved": waits.height - resolved["call"].n_unique(),
    }
    return {k: v for k, v in counts.items() if v}


def build_graph(trace: LoadedTrace, *, level: Level = "kernel") -> nx.DiGraph:
    """The dependency graph as a networkx `DiGraph` (node ids = event ids).

    Node attributes: kind (op, runtime, kernel, memcpy, memset), name, ts_ns, dur_ns;
    edge attribute: kind. `G.graph["unlinked"]` counts what could not be linked. Names are
    shared string objects, so a node costs its dict and four references.
    """
    nodes = graph_nodes(trace, level)
    edges = graph_edges(trace, level)
    names: dict[str, str] = {}
    graph = nx.DiGraph(level=level, unlinked=unlinked(trace), source=trace.source)
    graph.add_nodes_from(
        (
            event,
            {
                "kind": names.setdefault(kind, kind),
                "name": names.setdefault(name, name),
                "ts_ns": ts,
                "dur_ns": dur,
            },
        )
        for event, kind, name, ts, dur in nodes.iter_rows()
    )
    kinds = {k: k for k in EDGE_KINDS}
    graph.add_edges_from((src, dst, {"kind": kinds[kind]}) for src, dst, kind in edges.iter_rows())
    return graph
