"""The critical path: the chain of CPU and GPU work that sets how long a region takes.

The model is Holistic Trace Analysis's (HTA, `critical_path_analysis`), rebuilt on Polars
frames so it runs in a fraction of the time. Every CPU event (op, runtime call) and GPU
activity becomes two points in time, its start and its end, and edges join the points:

- `operator`: along each thread's call stack, from each point to the next (a nested op's
  time goes to the innermost event open then); a GPU activity's start to its end;
- `dependency` (weight 0): one top-level CPU op's end to the next one's start;
- `launch_delay`: a runtime call's start to its kernel's start, when the stream sat idle
  waiting for that launch (no earlier work queued or running on it);
- `kernel_kernel_delay`: otherwise, the previous activity on the stream to this one;
- `sync` (weight 0): a kernel to the kernel another stream waited for
  (`cudaStreamWaitEvent`), and a kernel to the end of the runtime call that blocked the
  CPU for it (`cudaDeviceSynchronize`, ...). A blocking call's own exit edge weighs 0:
  its wait is the GPU's time, not the CPU's.

The critical path is the path of greatest weight. Weights never exceed the wall time
between an edge's ends, so `(wall - weight)` is a non-negative cost and the heaviest path
is a shortest path (scipy's Dijkstra, in C). Its wall time is then split by cause: the
weighted edges give CPU-bound, GPU compute, GPU communication, launch and kernel-to-kernel
overhead; the weightless edges on the path give sync wait (a blocked CPU, a waiting
stream) and idle (gaps between top-level CPU ops, where nothing traced ran).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from scipy.sparse import csr_array
from scipy.sparse.csgraph import dijkstra

from traceq.errors import TraceError
from traceq.relations.causes import CAUSE_LABELS, CAUSES
from traceq.relations.graph import host_waits, launched, stream_waits
from traceq.relations.link import LAUNCH_API
from traceq.relations.nesting import NONE, depths, parents

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

Region = int | str | tuple[str, int] | tuple[int, int] | None
"""A step number, an annotation name (first instance), (name, instance), (start_ns, end_ns),
or None for the whole trace."""

BLOCKING = (
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventQuery|EventSynchronize|Memcpy|"
    r"MemcpyAsync)$"
)
"""Calls during which the CPU waits for the GPU (HTA's list, and their HIP twins)."""
COMMUNICATION = r"(?i)^(nccl|rccl).*kernel|^ncclDevKernel"
_NODE_SCHEMA = {"event": pl.Int64, "start": pl.Boolean, "ts_ns": pl.Int64}


@dataclass
class CriticalPath:
    """The critical path of one region, its length and what it is made of."""

    region: tuple[int, int]
    nodes: pl.DataFrame = field(repr=False)
    """Points on the path in order: event, start (True: the event's start), ts_ns."""
    edges: pl.DataFrame = field(repr=False)
    """Edges on the path in order: src_event, src_start, dst_event, dst_start, type,
    cause, event (what the time is attributed to, null for gaps), weight_ns, wall_ns."""
    events: pl.DataFrame = field(repr=False)
    """The events of the region's graph (event, name, kind, device, stream, tid)."""
    graph_size: dict[str, int] = field(default_factory=dict)
    label: str = ""
    """The region as asked for: "step 3", "annotation 'forward' #0", "the trace"."""

    def __repr__(self) -> str:
        """One line: "<CriticalPath step 3: 1,234.5 µs, 57 events, 62% GPU compute>"."""
        head = f"CriticalPath {self.label}: " if self.label else "CriticalPath "
        return (
            f"<{head}{self.length_us:,.1f} µs, {len(self.critical_events):,} events{self._most()}>"
        )

    def _most(self) -> str:
        """ ", 62% GPU compute": the cause with most of the path's time ("" when empty)."""
        if not self.edges.height:
            return ""
        cause, pct = max(self.breakdown_pct.items(), key=lambda kv: kv[1])
        return f", {pct:.0f}% {CAUSE_LABELS[cause]}"

    def _repr_html_(self) -> str:
        """A notebook's view: length, region, the causes and the heaviest events (names
        from the trace escaped)."""
        esc = html.escape
        start, end = self.region
        head = (
            f"<b>Critical path</b> {esc(self.label)}: {self.length_us:,.1f} µs of a "
            f"{(end - start) / 1e3:,.1f} µs region, {len(self.critical_events):,} events"
        )
        causes = "".join(
            f"<tr><td style='text-align:left'>{esc(CAUSE_LABELS[c])}</td>"
            f"<td>{self.breakdown_ns[c] / 1e3:,.1f}</td><td>{pct:.1f}</td></tr>"
            for c, pct in sorted(self.breakdown_pct.items(), key=lambda kv: -kv[1])
            if pct > 0
        )
        heaviest = "".join(
            f"<tr><td style='text-align:left'>{esc(str(r['name']))}</td>"
            f"<td style='text-align:left'>{esc(str(r['kind']))}</td>"
            f"<td>{r['time_ns'] / 1e3:,.1f}</td><td>{r['pct']:.1f}</td></tr>"
            for r in self.top(10).iter_rows(named=True)
        )
        return (
            f"<div><p>{head}</p><table><tr><th>cause</th><th>µs</th><th>%</th></tr>{causes}"
            f"</table><table><tr><th>heaviest on the path</th><th>kind</th><th>µs</th>"
            f"<th>%</th></tr>{heaviest}</table></div>"
        )

    def __len__(self) -> int:
        """Points on the path."""
        return self.nodes.height

    @property
    def length_ns(self) -> int:
        """Wall time from the path's first point to its last."""
        return int(self.edges["wall_ns"].sum()) if self.edges.height else 0

    @property
    def length_us(self) -> float:
        return self.length_ns / 1000

    @property
    def weight_ns(self) -> int:
        """Sum of edge weights: HTA's length (the path's wall time less sync waits and idle)."""
        return int(self.edges["weight_ns"].sum()) if self.edges.height else 0

    @property
    def breakdown_ns(self) -> dict[str, int]:
        sums = dict(self.edges.group_by("cause").agg(pl.col("wall_ns").sum()).iter_rows())
        return {cause: int(sums.get(cause, 0)) for cause in CAUSES}

    @property
    def breakdown_pct(self) -> dict[str, float]:
        total = self.length_ns or 1
        return {cause: 100 * ns / total for cause, ns in self.breakdown_ns.items()}

    def gpu_ns(self) -> int:
        """GPU activity time on the path."""
        gpu = self.edges.filter(pl.col("cause").is_in(["gpu_compute", "gpu_communication"]))
        return int(gpu["wall_ns"].sum())

    def top(self, n: int = 10) -> pl.DataFrame:
        """The events with the most time on the path: event, name, kind, time_ns, pct."""
        total = self.length_ns or 1
        return (
            self.edges.filter(pl.col("event").is_not_null())
            .group_by("event")
            .agg(pl.col("weight_ns").sum().alias("time_ns"))
            .join(self.events.select("event", "name", "kind"), on="event", how="left")
            .with_columns((100 * pl.col("time_ns") / total).alias("pct"))
            .sort("time_ns", "event", descending=[True, False])
            .head(n)
            .select("event", "name", "kind", "time_ns", "pct")
        )

    def top_names(self, n: int = 10) -> pl.DataFrame:
        """The names with the most time on the path, their events summed (24 layers' GELU is
        one row): name, kind, events, time_ns, pct."""
        total = self.length_ns or 1
        return (
            self.edges.filter(pl.col("event").is_not_null())
            .join(self.events.select("event", "name", "kind"), on="event", how="left")
            .group_by("name", "kind")
            .agg(
                pl.col("event").n_unique().alias("events"),
                pl.col("weight_ns").sum().alias("time_ns"),
            )
            .with_columns((100 * pl.col("time_ns") / total).alias("pct"))
            .sort("time_ns", "name", descending=[True, False], nulls_last=True)
            .head(n)
            .select("name", "kind", "events", "time_ns", "pct")
        )

    @property
    def critical_events(self) -> list[int]:
        """Events with a point on the path, in path order."""
        return self.nodes["event"].unique(maintain_order=True).to_list()

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        return {
            "region": {"start_ns": self.region[0], "end_ns": self.region[1]},
            "length_us": self.length_us,
            "weight_us": self.weight_ns / 1000,
            "breakdown_pct": self.breakdown_pct,
            "breakdown_us": {k: v / 1000 for k, v in self.breakdown_ns.items()},
            "top": [
                {
                    "event": r["event"],
                    "name": r["name"],
                    "kind": r["kind"],
                    "time_us": r["time_ns"] / 1000,
                    "pct": r["pct"],
                }
                for r in self.top(top).iter_rows(named=True)
            ],
            "top_names": [
                {
                    "name": r["name"],
                    "kind": r["kind"],
                    "events": r["events"],
                    "time_us": r["time_ns"] / 1000,
                    "pct": r["pct"],
                }
                for r in self.top_names(top).iter_rows(named=True)
            ],
            "nodes": self.nodes.height,
            "events": len(self.critical_events),
            "graph": self.graph_size,
        }


# -- region ---------------------------------------------------------------------------------


def window(trace: LoadedTrace, region: Region) -> tuple[int, int]:
    """(start_ns, end_ns) of a region; raises `TraceError` when it is not in the trace."""
    if region is None:
        timed = pl.concat(
            [
                trace.ops.select("ts_ns", "end_ns"),
                trace.runtime.select("ts_ns", "end_ns"),
                trace.kernels.select("ts_ns", "end_ns"),
            ]
        )
        if timed.height == 0:
            raise TraceError("the trace has no CPU ops, runtime calls or GPU activities")
        return int(timed["ts_ns"].min()), int(timed["end_ns"].max())
    if isinstance(region, bool):
        raise TraceError(f"not a region: {region!r}")
    if isinstance(region, int):
        step = trace.steps.filter(pl.col("step") == region)
        if step.height == 0:
            have = ", ".join(map(str, trace.steps["step"].to_list())) or "none"
            raise TraceError(f"no ProfilerStep#{region} in the trace (steps: {have})")
        return int(step["ts_ns"][0]), int(step["end_ns"][0])
    if isinstance(region, str):
        return _annotation(trace, region, 0)
    if len(region) == 2 and isinstance(region[0], str):
        return _annotation(trace, region[0], int(region[1]))
    start, end = int(region[0]), int(region[1])
    if end <= start:
        raise TraceError(f"empty window: {start} .. {end} ns")
    return start, end


def _annotation(trace: LoadedTrace, name: str, instance: int) -> tuple[int, int]:
    """The `instance`-th (0-based, by start time) CPU annotation or op named `name`; when
    none has exactly that name, those whose name contains it (as HTA matches)."""
    spans = pl.concat(
        [
            trace.annotations.filter(pl.col("kind") == "cpu").select("name", "ts_ns", "end_ns"),
            trace.ops.select("name", "ts_ns", "end_ns"),
        ]
    ).sort("ts_ns")
    found = spans.filter(pl.col("name") == name)
    if found.height == 0:
        found = spans.filter(pl.col("name").str.contains(name, literal=True))
    if found.height == 0:
        raise TraceError(f"no annotation or op named {name!r} in the trace")
    if not 0 <= instance < found.height:
        raise TraceError(f"{name!r} has instances 0..{found.height - 1}, not {instance}")
    row = found.row(instance, named=True)
    return int(row["ts_ns"]), int(row["end_ns"])


# -- graph ----------------------------------------------------------------------------------


def critical_path(trace: LoadedTrace, region: Region = None) -> CriticalPath:
    """The critical path of `region` (see `Region`); the whole trace by default."""
    start, end = window(trace, region)
    cpu = _cpu_events(trace, start, end)
    if cpu.height == 0:
        raise TraceError(f"no CPU op or runtime call starts in {start} .. {end} ns")
    gpu = _gpu_activities(trace, cpu)
    nodes = _nodes(cpu, gpu)
    parts = [p for p in (_stack_edges(cpu), *_gpu_edges(trace, cpu, gpu)) if p.height]
    edges = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()
    path_nodes, path_edges = _heaviest_path(nodes, edges)
    events = pl.concat(
        [
            cpu.select("event", "name", "kind"),
            gpu.select("event", "name", "kind"),
        ]
    )
    size = {"nodes": nodes.height, "edges": edges.height, "events": events.height}
    return CriticalPath((start, end), path_nodes, path_edges, events, size, _label(region))


def _label(region: Region) -> str:
    """The region in words, for a path's repr."""
    if region is None:
        return "the trace"
    if isinstance(region, int) and not isinstance(region, bool):
        return f"step {region}"
    if isinstance(region, str):
        return f"annotation {region!r}"
    if isinstance(region[0], str):
        return f"annotation {region[0]!r} #{int(region[1])}"
    return f"window {int(region[0]):,} .. {int(region[1]):,} ns"


def _cpu_events(trace: LoadedTrace, start: int, end: int) -> pl.DataFrame:
    """Ops and runtime calls that start in the window and last (HTA's selection)."""
    columns = ["event", "name", "pid", "tid", "ts_ns", "end_ns"]
    frame = pl.concat(
        [
            trace.ops.select(*columns, pl.lit("op").alias("kind")),
            trace.runtime.select(*columns, pl.lit("runtime").alias("kind")),
        ]
    )
    return (
        frame.filter(pl.col("ts_ns").is_between(start, end) & (pl.col("end_ns") > pl.col("ts_ns")))
        .with_columns(
            pl.col("event").cast(pl.Int64), pl.col("name").str.contains(BLOCKING).alias("blocking")
        )
        .sort("event")
    )


def _gpu_activities(trace: LoadedTrace, cpu: pl.DataFrame) -> pl.DataFrame:
    """GPU activities launched by a runtime call of the window."""
    return (
        launched(trace)
        .join(cpu.select(pl.col("event").alias("runtime_event")), on="runtime_event", how="semi")
        .filter(pl.col("end_ns") > pl.col("ts_ns"))
        .with_columns(
            pl.when(pl.col("name").str.contains(COMMUNICATION))
            .then(pl.lit("gpu_communication"))
            .otherwise(pl.lit("gpu_compute"))
            .alias("cause")
        )
    )


def _nodes(cpu: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Start and end point of every event: node id = row; the starts first, by event."""
    spans = pl.concat(
        [cpu.select("event", "ts_ns", "end_ns"), gpu.select("event", "ts_ns", "end_ns")]
    ).sort("event")
    starts = spans.select("event", pl.lit(True).alias("start"), "ts_ns")
    ends = spans.select("event", pl.lit(False).alias("start"), pl.col("end_ns").alias("ts_ns"))
    return pl.concat([starts, ends]).with_row_index("node").cast({"node": pl.Int64})


def _stack_edges(cpu: pl.DataFrame) -> pl.DataFrame:
    """Operator edges along each thread's call stack, dependency edges between stacks."""
    if cpu.height == 0:
        return pl.DataFrame()
    threads = cpu.select("pid", "tid").unique().with_row_index("_thread")
    cpu = cpu.join(threads, on=["pid", "tid"], how="left", maintain_order="left")
    group = cpu["_thread"].cast(pl.Int64).to_numpy()
    ts, end = cpu["ts_ns"].to_numpy(), cpu["end_ns"].to_numpy()
    parent = parents(group, ts, end)
    depth = depths(parent)
    root = np.arange(cpu.height)
    ancestor = parent.copy()
    live = np.flatnonzero(ancestor != NONE)
    while live.size:
        root[live] = ancestor[live]
        ancestor[live] = parent[ancestor[live]]
        live = live[ancestor[live] != NONE]
    events = cpu["event"].to_numpy()
    info = cpu.select("event", "_thread", "ts_ns", "end_ns", "blocking").with_columns(
        pl.Series("_depth", depth.astype(np.int64)),
        pl.Series("_root", events[root]),
        pl.Series("_parent", np.where(parent != NONE, events[np.maximum(parent, 0)], -1)),
    )
    # Call-stack order: at one instant ends come before starts; among starts the outer op
    # first, among ends the inner one first.
    starts = info.select(
        "event", "_thread", "_root", "_parent", "blocking",
        pl.lit(True).alias("start"), pl.col("ts_ns").alias("t"), pl.lit(1).alias("_phase"),
        (-pl.col("end_ns")).alias("_a"), pl.col("_depth").alias("_b"),
    )  # fmt: skip
    ends = info.select(
        "event", "_thread", "_root", "_parent", "blocking",
        pl.lit(False).alias("start"), pl.col("end_ns").alias("t"), pl.lit(0).alias("_phase"),
        (-pl.col("ts_ns")).alias("_a"), (-pl.col("_depth")).alias("_b"),
    )  # fmt: skip
    points = pl.concat([starts, ends]).sort("_thread", "t", "_phase", "_a", "_b", "event")
    nxt = [pl.col(c).shift(-1).over("_thread").alias(f"dst_{c}") for c in (
        "event", "start", "t", "_root", "blocking"
    )]  # fmt: skip
    pairs = points.with_columns(nxt).filter(pl.col("dst_event").is_not_null())
    same_stack = pl.col("_root") == pl.col("dst__root")
    attributed = (
        pl.when(pl.col("start"))
        .then(pl.col("event"))
        .when(~pl.col("dst_start"))
        .then(pl.col("dst_event"))
        .otherwise(pl.col("_parent"))
    )
    exit_of_blocking = ~pl.col("dst_start") & pl.col("dst_blocking")
    wall = pl.col("dst_t") - pl.col("t")
    return pairs.select(
        pl.col("event").alias("src_event"),
        pl.col("start").alias("src_start"),
        "dst_event",
        pl.col("dst_start"),
        pl.when(same_stack).then(pl.lit("operator")).otherwise(pl.lit("dependency")).alias("type"),
        pl.when(~same_stack)
        .then(pl.lit("idle"))
        .when(exit_of_blocking)
        .then(pl.lit("sync_wait"))
        .otherwise(pl.lit("cpu_bound"))
        .alias("cause"),
        pl.when(same_stack).then(attributed).alias("event"),
        pl.when(same_stack & ~exit_of_blocking).then(wall).otherwise(0).alias("weight_ns"),
    )


NO_EVENT = pl.lit(None, dtype=pl.Int64)
SYNC = pl.lit("sync_wait")


def _edge(
    src: tuple[pl.Expr, bool],
    dst: tuple[pl.Expr, bool],
    kind: str,
    cause: pl.Expr,
    event: pl.Expr,
    weight: pl.Expr,
) -> list[pl.Expr]:
    """The columns every edge frame shares: from (event, at its start?) to (event, at its
    start?), the edge type, its cause, the event its weight is charged to, the weight."""
    return [
        src[0].alias("src_event"),
        pl.lit(src[1]).alias("src_start"),
        dst[0].alias("dst_event"),
        pl.lit(dst[1]).alias("dst_start"),
        pl.lit(kind).alias("type"),
        cause.alias("cause"),
        event.alias("event"),
        weight.alias("weight_ns"),
    ]


def _gpu_edges(trace: LoadedTrace, cpu: pl.DataFrame, gpu: pl.DataFrame) -> list[pl.DataFrame]:
    """Span, launch-delay / kernel-kernel-delay and sync edges of the GPU activities."""
    if gpu.height == 0:
        return []
    span = gpu.select(
        _edge(
            (pl.col("event"), True),
            (pl.col("event"), False),
            "operator",
            pl.col("cause"),
            pl.col("event"),
            pl.col("end_ns") - pl.col("ts_ns"),
        )
    )
    queue = _queue_lengths(trace, gpu)
    waits = stream_waits(trace).join(
        gpu.select(pl.col("event").alias("src"), pl.col("end_ns").alias("_sync_end")),
        on="src",
        how="inner",
    )
    ordered = (
        gpu.sort("device", "stream", "ts_ns", "event")
        .with_columns(
            pl.col("event").shift(1).over("device", "stream").alias("_prev"),
            pl.col("end_ns").shift(1).over("device", "stream").alias("_prev_end"),
        )
        .join(queue, on="event", how="left")
        .join(
            waits.select(pl.col("dst").alias("event"), "src", "_sync_end"), on="event", how="left"
        )
    )
    before_launch = (pl.col("_prev").is_null() | (pl.col("_prev_end") < pl.col("launch_ts_ns"))) & (
        pl.col("src").is_null() | (pl.col("_sync_end") < pl.col("launch_ts_ns"))
    )
    launch_wait = (
        (pl.col("_queue_at_launch") == 1) & (pl.col("_queue_at_start") == 0) & before_launch
    ).fill_null(False)
    after_prev = pl.col("_prev").is_not_null() & (
        pl.col("src").is_null() | (pl.col("_sync_end") < pl.col("_prev_end"))
    )
    launch = ordered.filter(launch_wait).select(
        _edge(
            (pl.col("runtime_event"), True),
            (pl.col("event"), True),
            "launch_delay",
            pl.lit("launch_overhead"),
            NO_EVENT,
            (pl.col("ts_ns") - pl.col("launch_ts_ns")).clip(0),
        )
    )
    gap = ordered.filter(~launch_wait & after_prev).select(
        _edge(
            (pl.col("_prev"), False),
            (pl.col("event"), True),
            "kernel_kernel_delay",
            pl.lit("kernel_to_kernel_overhead"),
            pl.col("_prev"),
            (pl.col("ts_ns") - pl.col("_prev_end")).clip(0),
        )
    )
    gpu_wait = ordered.filter(pl.col("src").is_not_null()).select(
        _edge((pl.col("src"), False), (pl.col("event"), True), "sync", SYNC, NO_EVENT, pl.lit(0))
    )
    host = (
        host_waits(trace)
        .join(gpu.select(pl.col("event").alias("src")), on="src", how="semi")
        .join(cpu.select(pl.col("event").alias("dst")), on="dst", how="semi")
        .select(
            _edge((pl.col("src"), False), (pl.col("dst"), False), "sync", SYNC, NO_EVENT, pl.lit(0))
        )
    )
    return [span, launch, gap, gpu_wait, host]


def _queue_lengths(trace: LoadedTrace, gpu: pl.DataFrame) -> pl.DataFrame:
    """Work queued on each activity's stream right after its launch and right after it
    started (HTA's queue length: +1 per launch call, -1 per activity start), counted over
    the whole trace with one binary search per activity of the window."""
    calls = trace.runtime.filter(pl.col("name").str.contains(LAUNCH_API)).select(
        pl.col("event").cast(pl.Int64).alias("runtime_event")
    )
    every = (
        launched(trace)
        .filter(pl.col("launch_ts_ns").is_not_null())
        .join(calls, on="runtime_event", how="semi")
    )
    wanted = gpu.join(calls, on="runtime_event", how="semi")
    parts = []
    for (device, stream), queued in every.group_by("device", "stream"):
        mine = wanted.filter((pl.col("device") == device) & (pl.col("stream") == stream))
        if mine.height == 0:
            continue
        launches = np.sort(queued["launch_ts_ns"].to_numpy())
        starts = np.sort(queued["ts_ns"].to_numpy())

        def depth(at: np.ndarray, launches: np.ndarray = launches, starts: np.ndarray = starts):
            return np.searchsorted(launches, at, "right") - np.searchsorted(starts, at, "right")

        parts.append(
            mine.select(
                "event",
                pl.Series("_queue_at_launch", depth(mine["launch_ts_ns"].to_numpy())),
                pl.Series("_queue_at_start", depth(mine["ts_ns"].to_numpy())),
            )
        )
    if not parts:
        return pl.DataFrame(
            schema={"event": pl.Int64, "_queue_at_launch": pl.Int64, "_queue_at_start": pl.Int64}
        )
    return pl.concat(parts).cast({"_queue_at_launch": pl.Int64, "_queue_at_start": pl.Int64})


# -- heaviest path --------------------------------------------------------------------------


def _heaviest_path(nodes: pl.DataFrame, edges: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The path of greatest weight, by Dijkstra on cost = wall time - weight >= 0."""
    if nodes.height == 0 or edges.height == 0:
        empty_edges = pl.DataFrame(
            schema={
                "src_event": pl.Int64, "src_start": pl.Boolean, "dst_event": pl.Int64,
                "dst_start": pl.Boolean, "type": pl.String, "cause": pl.String,
                "event": pl.Int64, "weight_ns": pl.Int64, "wall_ns": pl.Int64,
            }
        )  # fmt: skip
        return pl.DataFrame(schema=_NODE_SCHEMA), empty_edges
    ids = nodes.select("node", "event", "start", "ts_ns")
    events = nodes["event"].to_numpy()
    half = nodes.height // 2
    ts = nodes["ts_ns"].to_numpy()

    def node_of(event: str, start: str) -> np.ndarray:
        at = np.searchsorted(events[:half], edges[event].to_numpy())
        return at + np.where(edges[start].to_numpy(), 0, half)

    u_of, v_of = node_of("src_event", "src_start"), node_of("dst_event", "dst_start")
    keyed = (
        edges.with_columns(
            pl.Series("_u", u_of, dtype=pl.Int64),
            pl.Series("_v", v_of, dtype=pl.Int64),
            pl.Series("wall_ns", ts[v_of] - ts[u_of], dtype=pl.Int64),
        )
        .with_columns((pl.col("wall_ns") - pl.col("weight_ns")).clip(0).alias("_cost"))
        .sort("_u", "_v", "_cost", "weight_ns", descending=[False, False, False, True])
        .unique(["_u", "_v"], keep="first", maintain_order=True)
    )
    n = nodes.height
    source = n  # a virtual start before every point: starting at v skips ts(v) - t0
    t0 = int(ts.min())
    u = np.concatenate([keyed["_u"].to_numpy(), np.full(n, source)])
    v = np.concatenate([keyed["_v"].to_numpy(), np.arange(n)])
    cost = np.concatenate([keyed["_cost"].to_numpy(), ts - t0]).astype(np.float64)
    graph = csr_array((cost, (u, v)), shape=(n + 1, n + 1))
    dist, pred = dijkstra(graph, indices=source, return_predecessors=True)
    longest = (ts - t0) - dist[:n]
    finite = np.isfinite(longest)
    best = np.flatnonzero(finite & (longest == longest[finite].max()))
    last = int(best[np.argmax(ts[best])])
    back = pred.tolist()
    chain = [last]
    while back[chain[-1]] != source and back[chain[-1]] >= 0:
        chain.append(back[chain[-1]])
    chain.reverse()
    order = pl.DataFrame({"node": np.array(chain, dtype=np.int64)}).with_row_index("_k")
    path_nodes = order.join(ids, on="node").sort("_k").select("event", "start", "ts_ns")
    steps = pl.DataFrame(
        {"_u": np.array(chain[:-1], dtype=np.int64), "_v": np.array(chain[1:], dtype=np.int64)}
    ).with_row_index("_k")
    path_edges = (
        steps.join(keyed, on=["_u", "_v"], how="left")
        .sort("_k")
        .select(
            "src_event", "src_start", "dst_event", "dst_start", "type", "cause", "event",
            pl.col("weight_ns").cast(pl.Int64), pl.col("wall_ns").cast(pl.Int64),
        )
    )  # fmt: skip
    return path_nodes, path_edges
