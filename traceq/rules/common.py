"""Small relations several rules share: the operator a call ran under, a region's module,
step windows, optimizer ranges and GPU time in them. Kept apart so each rule module stays
about its own pattern."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from traceq.trace import Trace

US = 1000.0  # ns per µs


def outermost_operator(
    rows: pl.DataFrame, ops: pl.DataFrame, op_col: str = "op_event"
) -> pl.DataFrame:
    """`rows` plus `op_name` (the innermost op, from `op_col`) and `top_event`, `top_name`,
    `top_module`: the outermost enclosing *operator* — a `ns::name` op such as `aten::to`,
    not a `ProfilerStep#N` or `record_function` range above it. That is the op a user wrote.

    Walks up the op tree one level per join (depth is small), only for the given rows.
    """
    info = ops.select("event", "name", "parent", "module")
    chain = []
    current = rows.select(pl.col("event").alias("_row"), pl.col(op_col).alias("_op")).filter(
        pl.col("_op").is_not_null()
    )
    level = 0
    while current.height:
        current = current.join(info.rename({"event": "_op"}), on="_op", how="inner")
        chain.append(current.select("_row", "_op", "name", "module", pl.lit(level).alias("_level")))
        current = current.select("_row", pl.col("parent").alias("_op")).filter(
            pl.col("_op").is_not_null()
        )
        level += 1
    inner = info.select(pl.col("event").alias(op_col), pl.col("name").alias("op_name"))
    rows = rows.join(inner, on=op_col, how="left", maintain_order="left")
    schema = {"top_event": pl.Int64, "top_name": pl.String, "top_module": pl.String}
    if chain:
        operators = (
            pl.concat(chain)
            .filter(pl.col("name").str.contains("::"))
            .sort("_level")
            .group_by("_row")
            .agg(
                pl.col("_op").last().cast(pl.Int64).alias("top_event"),
                pl.col("name").last().alias("top_name"),
                pl.col("module").last().alias("top_module"),
            )
        )
    else:
        operators = pl.DataFrame(schema={"_row": rows["event"].dtype, **schema})
    return rows.join(
        operators.rename({"_row": "event"}).cast({"event": rows["event"].dtype}),
        on="event",
        how="left",
        maintain_order="left",
    )


def common_module(modules: list[str | None]) -> str | None:
    """The deepest module path enclosing all of `modules` (dotted prefix), or None."""
    paths = [m.split(".") for m in modules if m]
    if not paths:
        return None
    prefix: list[str] = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    return ".".join(prefix) or None


def step_text(step: int | None) -> str:
    """ "step 3", or "the trace" for a trace without steps (step null)."""
    return f"step {step}" if step is not None else "the trace"


def step_windows(trace: Trace) -> pl.DataFrame:
    """`step`, `window_ns`: each profiler step's CPU window; a trace without steps is one
    window (step null) from its first op to its last."""
    if trace.steps.height:
        return trace.steps.select("step", pl.col("dur_ns").alias("window_ns"))
    ops = trace.ops
    span = ops.select((pl.col("end_ns").max() - pl.col("ts_ns").min()).alias("window_ns"))
    return span.select(pl.lit(None, pl.Int64).alias("step"), "window_ns")


def optimizer_ranges(trace: Trace, method: str) -> pl.DataFrame:
    """The ranges `torch.optim` records around `Optimizer.<method>` (`step`, `zero_grad`):
    `region` (event id), `optimizer` (class name), `tid`, `ts_ns`, `end_ns`, `step`. Old
    traces record them as ops, newer ones as CPU user annotations."""
    pattern = rf"^Optimizer\.{method}#(\w+)\.{method}$"
    columns = ["event", "name", "tid", "ts_ns", "end_ns", "step"]
    as_ops = trace.ops.select(columns).cast({"event": pl.Int64})
    as_annotations = (
        trace.annotations.filter(pl.col("kind") == "cpu").select(columns).cast({"event": pl.Int64})
    )
    return (
        pl.concat([as_ops, as_annotations])
        .filter(pl.col("name").str.contains(pattern))
        .select(
            pl.col("event").alias("region"),
            pl.col("name").str.extract(pattern).alias("optimizer"),
            "tid",
            "ts_ns",
            "end_ns",
            "step",
        )
    )


def in_ranges(rows: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """`rows` (with `tid`, `ts_ns`) that start inside one of `ranges` on their thread, with
    that range's `region`. A thread is in one such range at a time, so the last range to
    start before a row is the only one that can hold it."""
    windows = ranges.select(
        "region", "tid", pl.col("ts_ns").alias("_start"), pl.col("end_ns").alias("_end")
    ).sort("_start")
    return (
        rows.sort("ts_ns")
        .join_asof(
            windows,
            left_on="ts_ns",
            right_on="_start",
            by="tid",
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("ts_ns") < pl.col("_end"))
        .drop("_start", "_end")
    )


def gpu_busy_in(kernels: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """`region`, `busy_ns`: GPU activity inside each range's window, clipped to it (any
    stream; kernels overlapping on several streams count once each, an upper bound)."""
    windows = ranges.select("region", pl.col("ts_ns").alias("_s"), pl.col("end_ns").alias("_e"))
    return (
        kernels.select("ts_ns", "end_ns")
        .join_where(windows, pl.col("ts_ns") < pl.col("_e"), pl.col("end_ns") > pl.col("_s"))
        .group_by("region")
        .agg(
            (pl.min_horizontal("end_ns", "_e") - pl.max_horizontal("ts_ns", "_s"))
            .sum()
            .alias("busy_ns")
        )
    )
