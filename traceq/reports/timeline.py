"""Where the time goes, as numbers for the HTML report: per-step breakdown, per-stream
utilization over time, top kernels and ops, GPU (or CPU) time by module.

Everything is measured on unions of intervals, so overlapping kernels on several streams
are counted once. `Coverage` holds one merged set of intervals and answers "how much of
[a, b) is covered" for many windows at once (a prefix sum and a binary search): per-step
windows and the fixed-width bins of a timeline use the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceq.kernel_names import decode_frame
from traceq.relations.critical_path import COMMUNICATION

if TYPE_CHECKING:
    from traceq.trace import Trace

CATEGORIES = ("compute", "communication", "memcpy", "cpu_bound", "idle")
"""Per-step time by what the GPU does, each instant counted once, in this priority: a
compute kernel runs; else a collective runs (exposed communication); else a memcpy or
memset runs; else the GPU is idle while a host op runs (CPU-bound: the GPU waits for
work); else nothing traced runs (idle)."""
STREAMS = 16
"""Streams drawn one by one in the utilization timeline; the rest are merged."""


@dataclass(frozen=True)
class Coverage:
    """A union of half-open intervals [start, end), merged, sorted and disjoint."""

    starts: np.ndarray
    ends: np.ndarray
    before: np.ndarray  # covered length before each interval

    @classmethod
    def of(cls, starts: np.ndarray, ends: np.ndarray) -> Coverage:
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        if starts.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty)
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], np.maximum(ends[order], starts[order])
        reach = np.maximum.accumulate(ends)
        new = np.ones(starts.size, dtype=bool)
        new[1:] = starts[1:] > reach[:-1]
        group = np.cumsum(new) - 1
        merged_starts = starts[new]
        merged_ends = np.zeros(merged_starts.size, dtype=np.int64)
        np.maximum.at(merged_ends, group, reach)
        lengths = merged_ends - merged_starts
        before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return cls(merged_starts, merged_ends, before)

    @classmethod
    def union(cls, *parts: Coverage) -> Coverage:
        return cls.of(
            np.concatenate([p.starts for p in parts]), np.concatenate([p.ends for p in parts])
        )

    def upto(self, at: np.ndarray) -> np.ndarray:
        """Covered length in (-inf, at) for each point."""
        at = np.asarray(at, dtype=np.int64)
        if self.starts.size == 0:
            return np.zeros(at.shape, dtype=np.int64)
        k = np.searchsorted(self.starts, at, side="right") - 1
        safe = np.clip(k, 0, None)
        inside = np.clip(at - self.starts[safe], 0, self.ends[safe] - self.starts[safe])
        return np.where(k < 0, 0, self.before[safe] + inside)

    def within(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Covered length of each window [a, b)."""
        return self.upto(b) - self.upto(a)


def _cover(frame: pl.DataFrame) -> Coverage:
    return Coverage.of(frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy())


def gpu_classes(trace: Trace) -> dict[str, Coverage]:
    """GPU activity split into compute, communication and memcpy (union over devices)."""
    kernels = trace.kernels.select("kind", "name", "ts_ns", "end_ns")
    copy = pl.col("kind").is_in(["memcpy", "memset"])
    comm = ~copy & pl.col("name").str.contains(COMMUNICATION)
    return {
        "compute": _cover(kernels.filter(~copy & ~comm)),
        "communication": _cover(kernels.filter(comm)),
        "memcpy": _cover(kernels.filter(copy)),
    }


def windows(trace: Trace) -> pl.DataFrame:
    """The profiled steps (step, ts_ns, end_ns), or the whole trace as one window (step
    null) when it has no `ProfilerStep`."""
    if trace.steps.height:
        return trace.steps.select("step", "ts_ns", "end_ns").sort("ts_ns")
    timed = trace.events.filter(pl.col("ph") != "M")
    if timed.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64})
    start = int(timed["ts_ns"].min())
    return pl.DataFrame(
        {"step": [None], "ts_ns": [start], "end_ns": [start + trace.duration_ns]},
        schema={"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64},
    )


def step_breakdown(trace: Trace) -> pl.DataFrame:
    """Per step (or the whole trace): its wall time split into `CATEGORIES`, in ns; the
    categories of a row add up to its `dur_ns` exactly."""
    win = windows(trace)
    a, b = win["ts_ns"].to_numpy(), win["end_ns"].to_numpy()
    gpu = gpu_classes(trace)
    host = _cover(trace.ops.select("ts_ns", "end_ns"))
    compute = gpu["compute"].within(a, b)
    with_comm = Coverage.union(gpu["compute"], gpu["communication"])
    busy = Coverage.union(with_comm, gpu["memcpy"])
    busy_or_host = Coverage.union(busy, host)
    comm_ns = with_comm.within(a, b) - compute
    busy_ns = busy.within(a, b)
    either = busy_or_host.within(a, b)
    return win.select(
        "step",
        "ts_ns",
        (pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns"),
        pl.Series("compute", compute),
        pl.Series("communication", comm_ns),
        pl.Series("memcpy", busy_ns - compute - comm_ns),
        pl.Series("cpu_bound", either - busy_ns),
        pl.Series("idle", (b - a) - either),
    )


def stream_utilization(trace: Trace, bins: int = 400) -> tuple[np.ndarray, pl.DataFrame]:
    """The GPU's busy share per stream over time, downsampled: the span of GPU activity cut
    into `bins` equal bins (1-ns bins when the span is shorter), each bin's value the
    fraction of it a stream was busy (the union of its intervals, measured exactly, not
    sampled). Returns the bin starts (ns) and one row per (device, stream, bin) with `busy`
    in [0, 1]. The `STREAMS` busiest streams are kept; the others become one row set with
    stream null ("other streams")."""
    kernels = trace.kernels.select("device", "stream", "ts_ns", "end_ns")
    schema = {"device": pl.Int64, "stream": pl.Int64, "bin": pl.Int64, "busy": pl.Float64}
    if kernels.height == 0:
        return np.zeros(0, dtype=np.int64), pl.DataFrame(schema=schema)
    start, end = int(kernels["ts_ns"].min()), int(kernels["end_ns"].max())
    span = max(end - start, 1)
    bins = min(bins, span)  # a span shorter than `bins` ns gets 1-ns bins, none empty
    # Offsets from the start, then added: epoch timestamps (~1.7e18 ns) are beyond float64's
    # exact integers, and a linspace over them gives bins of zero width.
    edges = start + np.linspace(0, span, bins + 1).round().astype(np.int64)
    width = np.diff(edges).astype(np.float64)
    ranked = (
        kernels.group_by("device", "stream")
        .agg(pl.col("end_ns").sub(pl.col("ts_ns")).sum().alias("total"))
        .sort("total", "device", "stream", descending=[True, False, False])
    )
    kept = ranked.head(STREAMS).select("device", "stream")
    lanes = kernels.join(
        kept.with_columns(pl.lit(True).alias("_kept")), on=["device", "stream"], how="left"
    )
    lanes = lanes.with_columns(
        pl.when(pl.col("_kept")).then(pl.col("stream")).otherwise(None).alias("stream")
    )
    rows = []
    for (device, stream), lane in lanes.group_by("device", "stream", maintain_order=True):
        cover = _cover(lane)
        busy = cover.within(edges[:-1], edges[1:]) / width
        rows.append(
            pl.DataFrame(
                {
                    "device": device,
                    "stream": stream,
                    "bin": np.arange(bins),
                    "busy": np.clip(busy, 0.0, 1.0),
                },
                schema=schema,
            )
        )
    return edges[:-1], pl.concat(rows).sort("device", "stream", "bin", nulls_last=True)


def top_kernels(trace: Trace, n: int = 15) -> pl.DataFrame:
    """Kernels by total GPU time, with what their names say (library, category, dtype,
    layout, tile)."""
    kernels = trace.kernels
    total = kernels["dur_ns"].sum() or 1
    grouped = (
        kernels.group_by("name")
        .agg(
            pl.len().alias("count"),
            pl.col("kind").first(),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.col("dur_ns").mean().alias("mean_ns"),
        )
        .with_columns((100 * pl.col("total_ns") / total).alias("pct"))
        .sort("total_ns", "name", descending=[True, False])
        .head(n)
    )
    decoded = decode_frame(grouped.select("name")).select(
        "name", "library", "category", "dtype", "layout", "tile"
    )
    return grouped.join(decoded, on="name", how="left", maintain_order="left")


def op_times(trace: Trace) -> pl.DataFrame:
    """Per op event: self CPU time (its duration less its child ops') and the GPU time of
    the kernels it launched."""
    ops = trace.ops.select("event", "name", "parent", "dur_ns", "module")
    children = ops.group_by("parent").agg(pl.col("dur_ns").sum().alias("_children"))
    gpu = trace.kernels.group_by("op_event").agg(pl.col("dur_ns").sum().alias("gpu_ns"))
    return (
        ops.join(children, left_on="event", right_on="parent", how="left")
        .join(gpu, left_on="event", right_on="op_event", how="left")
        .with_columns(
            (pl.col("dur_ns") - pl.col("_children").fill_null(0)).clip(0).alias("self_ns"),
            pl.col("gpu_ns").fill_null(0),
        )
        .drop("_children")
    )


def top_ops(trace: Trace, n: int = 15) -> pl.DataFrame:
    """Ops by name: calls, self CPU time and launched GPU time; sorted by GPU time when the
    trace has kernels, else by self CPU time."""
    by = "gpu_ns" if trace.kernels.height else "self_ns"
    return (
        op_times(trace)
        .group_by("name")
        .agg(
            pl.len().alias("count"),
            pl.col("self_ns").sum(),
            pl.col("gpu_ns").sum(),
        )
        .sort(by, "name", descending=[True, False])
        .head(n)
    )


def module_tree(trace: Trace, limit: int = 400) -> tuple[str, pl.DataFrame]:
    """GPU time by module (CPU self time when the trace has no kernels) as a tree for a
    treemap: id (dotted path), parent, label, own_ns (time in the module itself, not its
    children). Time outside any module sits under "(no module)". The `limit` modules with
    the most time are kept; the rest of their time goes to their nearest kept ancestor."""
    if trace.kernels.height:
        basis = "GPU time"
        own = trace.kernels.group_by("module").agg(pl.col("dur_ns").sum().alias("own_ns"))
    else:
        basis = "CPU self time"
        own = op_times(trace).group_by("module").agg(pl.col("self_ns").sum().alias("own_ns"))
    own = own.with_columns(pl.col("module").fill_null("(no module)")).filter(pl.col("own_ns") > 0)
    times: dict[str, int] = dict(own.iter_rows())
    totals: dict[str, int] = {}
    for path, ns in times.items():
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            totals[prefix] = totals.get(prefix, 0) + ns
    kept = set(sorted(totals, key=lambda p: (-totals[p], p))[:limit])
    kept |= {".".join(p.split(".")[:i]) for p in kept for i in range(1, p.count(".") + 1)}
    kept |= {p.split(".")[0] for p in totals}
    own_kept: dict[str, int] = {}
    for path, ns in times.items():
        while path not in kept:
            path = path.rsplit(".", 1)[0]
        own_kept[path] = own_kept.get(path, 0) + ns
    ids = sorted(kept)
    return basis, pl.DataFrame(
        {
            "id": ids,
            "parent": [p.rsplit(".", 1)[0] if "." in p else "" for p in ids],
            "label": [p.rsplit(".", 1)[-1] for p in ids],
            "own_ns": [own_kept.get(p, 0) for p in ids],
            "total_ns": [totals[p] for p in ids],
        },
        schema={
            "id": pl.String,
            "parent": pl.String,
            "label": pl.String,
            "own_ns": pl.Int64,
            "total_ns": pl.Int64,
        },
    )


def utilization(trace: Trace) -> float | None:
    """GPU busy time over the span of GPU activity (all devices together), or None."""
    if trace.kernels.height == 0:
        return None
    busy = trace.gpu_busy()
    span = busy["span_ns"].sum()
    return float(busy["busy_ns"].sum() / span) if span else None
