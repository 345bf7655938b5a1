"""Where one rank's time goes, per step: compute, communication, memcpy, idle, and the
communication nothing else overlapped (exposed).

Times are unions of intervals, never sums, so two streams busy at once count once. GPU
ranks are measured on the device: a step's window runs from its first to its last GPU
activity, and each activity is COMM (an NCCL/RCCL kernel), MEM (memcpy, memset) or COMP
(any other kernel) — Holistic Trace Analysis' kernel types. CPU ranks (gloo) are measured
on the host: communication is the outermost comm ops on any thread, compute the outermost
other CPU ops, and the window is the `ProfilerStep` range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations import autograd, overlap
from traceq.relations.collectives import COMM_KERNEL, host_ranges, outermost, rank_collectives
from traceq.relations.intervals import union_ns

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

BREAKDOWN = {
    "step": pl.Int64,
    "on": pl.String,
    "span_ns": pl.Int64,
    "compute_ns": pl.Int64,
    "comm_ns": pl.Int64,
    "memcpy_ns": pl.Int64,
    "busy_ns": pl.Int64,
    "idle_ns": pl.Int64,
    "exposed_comm_ns": pl.Int64,
    "hideable_comm_ns": pl.Int64,
}
# Backward ops (autograd's engine names each node it runs): where a step's backward begins.
BACKWARD_OP = autograd.ENGINE_FRAME


def kernel_type(kind: pl.Expr, name: pl.Expr) -> pl.Expr:
    """HTA's kernel types: COMM (NCCL/RCCL), MEM (memcpy/memset), COMP (everything else)."""
    return (
        pl.when(name.str.contains(COMM_KERNEL))
        .then(pl.lit("COMM"))
        .when(kind.is_in(["memcpy", "memset"]))
        .then(pl.lit("MEM"))
        .otherwise(pl.lit("COMP"))
    )


def kernel_breakdown(trace: LoadedTrace) -> pl.DataFrame:
    """Per kernel type: count, summed time and share of all GPU activity time."""
    kernels = trace.kernels.with_columns(kernel_type(pl.col("kind"), pl.col("name")).alias("type"))
    total = kernels["dur_ns"].sum() or 1
    return (
        kernels.group_by("type")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("dur_ns"))
        .with_columns((pl.col("dur_ns") / total).alias("share"))
        .sort("type")
    )


def typed_intervals(trace: LoadedTrace) -> pl.DataFrame:
    """The rank's timed work as `step, type, ts_ns, end_ns` (type COMM / COMP / MEM), on
    the GPU when it has GPU activity, else on the host (outermost ranges per thread)."""
    kernels = trace.kernels
    if kernels.height:
        return kernels.select(
            "step", kernel_type(pl.col("kind"), pl.col("name")).alias("type"), "ts_ns", "end_ns"
        )
    comm = rank_collectives(trace)
    ranges = outermost(host_ranges(trace).join(comm.select("event"), on="event", how="anti"))
    work = pl.concat(
        [
            ranges.select("step", pl.lit("COMP").alias("type"), "ts_ns", "end_ns"),
            comm.select("step", pl.lit("COMM").alias("type"), "ts_ns", "end_ns"),
        ]
    )
    return work.filter(pl.col("step").is_not_null() | (trace.steps.height == 0))


def step_breakdown(trace: LoadedTrace) -> pl.DataFrame:
    """One row per step (`BREAKDOWN`); a trace without steps gets one row, `step` null, for
    all of it. Exposed communication is |COMM ∪ COMP| − |COMP|: the COMM time no compute
    ran beside; `hideable_comm_ns` is the part of it that compute independent of the
    collective could hide (`overlap.hideable_comm`)."""
    on = "gpu" if trace.kernels.height else "cpu"
    work = typed_intervals(trace)
    if work.height == 0:
        return pl.DataFrame(schema=BREAKDOWN)
    if on == "cpu" and trace.steps.height:
        spans = trace.steps.select("step", pl.col("dur_ns").alias("span_ns"))
    else:
        spans = work.group_by("step").agg(
            (pl.col("end_ns").max() - pl.col("ts_ns").min()).alias("span_ns")
        )
    by_type = union_ns(work, ["step", "type"]).pivot(on="type", index="step", values="union_ns")
    busy = union_ns(work, ["step"]).rename({"union_ns": "busy_ns"})
    compute_or_comm = union_ns(work.filter(pl.col("type") != "MEM"), ["step"])
    hideable = overlap.hideable_comm(trace, work, on)  # independent compute only
    frame = (
        spans.join(busy, on="step", how="left", nulls_equal=True)
        .join(by_type, on="step", how="left", nulls_equal=True)
        .join(compute_or_comm, on="step", how="left", nulls_equal=True)
        .join(hideable, on="step", how="left", nulls_equal=True)
    )
    for column in ("COMP", "COMM", "MEM"):
        if column not in frame.columns:
            frame = frame.with_columns(pl.lit(0, pl.Int64).alias(column))
    frame = frame.with_columns(
        pl.col("COMP", "COMM", "MEM", "busy_ns", "union_ns", "hideable_comm_ns").fill_null(0)
    )
    return (
        frame.with_columns(
            pl.lit(on).alias("on"),
            pl.col("COMP").alias("compute_ns"),
            pl.col("COMM").alias("comm_ns"),
            pl.col("MEM").alias("memcpy_ns"),
            (pl.col("span_ns") - pl.col("busy_ns")).clip(lower_bound=0).alias("idle_ns"),
            (pl.col("union_ns") - pl.col("COMP")).alias("exposed_comm_ns"),
        )
        .select(pl.col(c).cast(t) for c, t in BREAKDOWN.items())
        .sort("step")
    )


def backward_starts(trace: LoadedTrace, on: str) -> pl.DataFrame:
    """Per step, where its backward begins (`step, backward_ns`): the first autograd node
    (`autograd::engine::evaluate_function: ...`) on the host; on a GPU rank, the first GPU
    activity launched from then on. Steps without one (inference, no autograd ops) have no
    row."""
    nodes = trace.ops.filter(autograd.is_frame())
    host = nodes.group_by("step").agg(pl.col("ts_ns").min().alias("backward_ns"))
    host = host.filter(pl.col("step").is_not_null())
    if on == "cpu" or host.height == 0:
        return host
    launched = trace.kernels.filter(pl.col("launch_ts_ns").is_not_null()).join(
        host, on="step", how="inner"
    )
    return (
        launched.filter(pl.col("launch_ts_ns") >= pl.col("backward_ns"))
        .group_by("step")
        .agg(pl.col("ts_ns").min().alias("backward_ns"))
    )


def hideable_comm(work: pl.DataFrame, backward: pl.DataFrame) -> pl.DataFrame:
    """Per step, the exposed communication that compute free at the time could hide
    (`step, hideable_comm_ns`): the overlap achievable by issuing collectives earlier.

    A step is cut into forward (before `backward_ns`, from `backward_starts`) and backward.
    Within a phase, each stretch of exposed COMM (no COMP beside it) may be hidden by COMP
    that ran earlier in the same phase with no COMM beside it, each nanosecond of compute
    hiding at most one of communication, earliest first. Compute after a collective is taken
    to depend on it (the optimizer consumes reduced gradients), and forward compute cannot
    hide gradient collectives (no gradient exists yet), nor backward compute the forward's
    collectives. Greedy in time order, the hidden total after the k-th stretch is
    A_k = min(A_{k−1} + e_k, C_k) (e: exposed length, C: free compute before it), so
    A = E + min(0, min_k(C_k − E_k)) with E the running exposed sum: one pass per phase."""
    schema = {"step": pl.Int64, "hideable_comm_ns": pl.Int64}
    work = work.filter(pl.col("type").is_in(["COMM", "COMP"]))
    if work.height == 0:
        return pl.DataFrame(schema=schema)
    comm = (pl.col("type") == "COMM").cast(pl.Int64)
    comp = (pl.col("type") == "COMP").cast(pl.Int64)
    edges = pl.concat(
        [
            work.select(
                "step", pl.col("ts_ns").alias("t"), comm.alias("d_comm"), comp.alias("d_comp")
            ),
            work.select(
                "step", pl.col("end_ns").alias("t"), -comm.alias("d_comm"), -comp.alias("d_comp")
            ),
            backward.select(
                pl.col("step").cast(pl.Int64),
                pl.col("backward_ns").alias("t"),
                pl.lit(0, pl.Int64).alias("d_comm"),
                pl.lit(0, pl.Int64).alias("d_comp"),
            ),
        ],
        how="vertical_relaxed",
    )
    segments = (
        edges.group_by("step", "t")
        .agg(pl.col("d_comm", "d_comp").sum())
        .sort("step", "t")
        .with_columns(
            pl.col("d_comm").cum_sum().over("step").alias("comm"),
            pl.col("d_comp").cum_sum().over("step").alias("comp"),
            (pl.col("t").shift(-1).over("step") - pl.col("t")).fill_null(0).alias("len"),
        )
        .join(
            backward.select(pl.col("step").cast(pl.Int64), "backward_ns"),
            on="step",
            how="left",
            nulls_equal=True,
        )
        .with_columns(
            (pl.col("t") >= pl.col("backward_ns")).fill_null(False).alias("backward"),
            pl.when((pl.col("comm") > 0) & (pl.col("comp") == 0))
            .then("len")
            .otherwise(0)
            .alias("e"),
            pl.when((pl.col("comp") > 0) & (pl.col("comm") == 0))
            .then("len")
            .otherwise(0)
            .alias("f"),
        )
    )
    phase = ["step", "backward"]
    phases = (
        segments.with_columns(
            pl.col("e").cum_sum().over(phase).alias("E"),
            pl.col("f").cum_sum().over(phase).alias("C"),
        )
        .group_by(phase)
        .agg(
            (
                pl.col("E").max() + pl.min_horizontal(pl.lit(0), (pl.col("C") - pl.col("E")).min())
            ).alias("hidden")
        )
    )
    return (
        phases.group_by("step").agg(pl.col("hidden").sum().alias("hideable_comm_ns")).cast(schema)
    )


def step_ranges(trace: LoadedTrace) -> pl.DataFrame:
    """Per step, the host time in each range name on the step's own thread (ops and
    `record_function` ranges, at any depth, so a range nested in `forward` shows by its own
    name), and `(untraced)`: step time in no range at all (Python, sleeps, data loading
    outside any op). What a slow rank's extra time is spent on."""
    steps = trace.steps
    schema = {"step": pl.Int64, "name": pl.String, "dur_ns": pl.Int64}
    if steps.height == 0:
        return pl.DataFrame(schema=schema)
    main = steps.select("pid", "tid").unique()
    ranges = host_ranges(trace).filter(pl.col("step").is_not_null())
    ranges = ranges.join(main, on=["pid", "tid"], how="semi")
    named = ranges.group_by("step", "name").agg(pl.col("dur_ns").sum())
    untraced = (
        steps.select("step", "dur_ns")
        .join(union_ns(outermost(ranges), ["step"]), on="step", how="left")
        .select(
            "step",
            pl.lit("(untraced)").alias("name"),
            (pl.col("dur_ns") - pl.col("union_ns").fill_null(0)).clip(lower_bound=0),
        )
    )
    return pl.concat([named, untraced], how="vertical_relaxed").cast(schema).sort("step", "name")
