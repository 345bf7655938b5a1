"""Where the time of a trace goes, per group and per step: the samples diffs and checks compare.

A regression check compares distributions, not single numbers, so every group (a kernel
name, an op, a module) gets one time sample per `ProfilerStep`. Time is device time when
the trace has GPU activity (what a kernel, or the kernels an op launched, ran for) and CPU
self time otherwise (an op's duration minus its children's), so the groups of one
dimension never count the same nanosecond twice and add up to the trace's total.

Ops are grouped by the op the user called, not the one that happened to launch a kernel:
the outermost semantic op above it, as data flow defines it (`aten::linear`, not the
`aten::addmm` beneath it; `aten::to`, not `aten::copy_`; an Inductor kernel as itself).
That name survives changes of device, vendor and PyTorch version, where kernel names and
inner dispatch do not.

People also name ops the way `torch.profiler`'s `key_averages()` lists them: every op at any
depth. `op_totals` measures each op name that way (dimension `op_total`): the total time of
its instances wherever they run, an instance nested inside another of the same name counted
once, through the outer one. Those groups overlap (`aten::linear` holds `aten::addmm`), so
they are what a metric `op:NAME` measures, while the `op` groups above, which add up, stay
the default set a check looks at.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from traceq.relations.dataflow import semantic_root
from traceq.trace import Trace

DIMENSIONS = ("kernel", "op", "module")
OP_TOTAL = "op_total"
NO_OP = "(no op)"
NO_MODULE = "(no module)"

# torch.compile wraps a model in `OptimizedModule`; drop it so compiled and eager paths match.
COMPILE_WRAPPER = r"^(?:OptimizedModule_\d+\.)+"
GROUP_SCHEMA = {
    "dim": pl.String,
    "group": pl.String,
    "step": pl.Int64,
    "count": pl.Int64,
    "time_ns": pl.Int64,
}


def time_basis(trace: Trace) -> str:
    """'gpu' when the trace recorded device activity, else 'cpu'."""
    return "gpu" if trace.kernels.height else "cpu"


def semantic_ops(ops: pl.DataFrame) -> pl.DataFrame:
    """`event` -> `semantic`: the event id of the op's outermost semantic ancestor-or-self
    (`dataflow.semantic_root`: dispatcher ops and Inductor kernels), or of the op itself
    when none encloses it (an autograd node, a `record_function` range)."""
    ordered = ops.sort("event")
    root = semantic_root(ordered)
    events = ordered["event"].cast(pl.Int64)
    own = np.arange(ordered.height)
    return pl.DataFrame(
        {"event": events, "semantic": events.gather(pl.Series(np.where(root >= 0, root, own)))}
    )


def self_time(ops: pl.DataFrame) -> pl.Series:
    """Each op's duration minus the durations of its direct children (never below zero)."""
    children = (
        ops.filter(pl.col("parent").is_not_null())
        .group_by(pl.col("parent").cast(pl.Int64))
        .agg(pl.col("dur_ns").sum().alias("_children"))
    )
    return (
        ops.select(pl.col("event").cast(pl.Int64).alias("parent"), "dur_ns")
        .join(children, on="parent", how="left", maintain_order="left")
        .select(
            (pl.col("dur_ns").fill_null(0) - pl.col("_children").fill_null(0))
            .clip(lower_bound=0)
            .alias("self_ns")
        )["self_ns"]
    )


def strip_compile_wrapper(path: str | None) -> str | None:
    """`OptimizedModule_0.GegluMlp_0.Linear_0` -> `GegluMlp_0.Linear_0`."""
    return None if path is None else re.sub(COMPILE_WRAPPER, "", path)


def module_group(column: str = "module") -> pl.Expr:
    return pl.col(column).str.replace(COMPILE_WRAPPER, "").fill_null(NO_MODULE).alias("module")


def timed_rows(trace: Trace, semantic: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per unit of time (a GPU activity, or an op's self time on CPU-only traces):
    its kernel / op / module group, its step, the op call it counts towards, and `time_ns`.
    `semantic` is `semantic_ops(trace.ops)` when the caller already has it."""
    ops = trace.ops
    if semantic is None:
        semantic = semantic_ops(ops)
    semantic = semantic.join(
        ops.select(pl.col("event").cast(pl.Int64).alias("semantic"), pl.col("name").alias("op")),
        on="semantic",
        how="left",
    )
    if time_basis(trace) == "gpu":
        rows = trace.kernels.select(
            pl.col("event").cast(pl.Int64).alias("unit"),
            pl.col("name").alias("kernel"),
            pl.col("op_event").cast(pl.Int64).alias("event"),
            "step",
            module_group(),
            pl.col("dur_ns").fill_null(0).alias("time_ns"),
        )
        rows = rows.join(semantic, on="event", how="left", maintain_order="left")
        # A kernel no op launched counts as its own call in the NO_OP group.
        call = pl.coalesce("semantic", -pl.col("unit") - 1)
        return rows.select(
            "kernel",
            pl.col("op").fill_null(NO_OP),
            "module",
            "step",
            call.alias("call"),
            "time_ns",
        )
    rows = ops.select(
        pl.col("event").cast(pl.Int64),
        "step",
        module_group(),
        self_time(ops).alias("time_ns"),
    ).join(semantic, on="event", how="left", maintain_order="left")
    return rows.select(
        pl.lit(None, dtype=pl.String).alias("kernel"),
        "op",
        "module",
        "step",
        pl.col("semantic").alias("call"),
        "time_ns",
    )


def op_instances(ops: pl.DataFrame) -> pl.DataFrame:
    """(`event`, `name`, `instance`): for each op, every name on its ancestor-or-self chain,
    with the outermost op of that name on the chain (the instance its time counts towards).

    Built level by level with joins on `parent` (as deep as the deepest op), not per row."""
    chain = ops.select(
        pl.col("event").cast(pl.Int64),
        pl.col("event").cast(pl.Int64).alias("ancestor"),
        pl.col("parent").cast(pl.Int64).alias("_next"),
    )
    parent_of = ops.select(
        pl.col("event").cast(pl.Int64).alias("_next"), pl.col("parent").cast(pl.Int64)
    )
    links = [chain.select("event", "ancestor")]
    frontier = chain.filter(pl.col("_next").is_not_null())
    while frontier.height:
        step = frontier.select("event", pl.col("_next").alias("ancestor"), "_next")
        links.append(step.select("event", "ancestor"))
        frontier = (
            step.join(parent_of, on="_next", how="inner")
            .select("event", "ancestor", pl.col("parent").alias("_next"))
            .filter(pl.col("_next").is_not_null())
        )
    names = ops.select(
        pl.col("event").cast(pl.Int64).alias("ancestor"), "name", pl.col("depth").alias("_depth")
    )
    return (
        pl.concat(links)
        .join(names, on="ancestor", how="inner")
        .sort("_depth")
        .group_by("event", "name", maintain_order=True)
        .agg(pl.col("ancestor").first().alias("instance"))
    )


def op_totals(trace: Trace) -> pl.DataFrame:
    """`op_total` groups (see the module docstring): per op name and step, how many instances
    and their time. Time: the GPU activities launched under an instance (each counted once),
    or, on CPU-only traces, the instances' own durations (children included)."""
    ops = trace.ops
    if ops.height == 0:
        return pl.DataFrame(schema=GROUP_SCHEMA)
    instances = op_instances(ops)
    if time_basis(trace) == "gpu":
        rows = trace.kernels.select(
            pl.col("op_event").cast(pl.Int64).alias("event"),
            "step",
            pl.col("dur_ns").fill_null(0).alias("time_ns"),
        ).join(instances, on="event", how="inner")
    else:
        rows = (
            instances.filter(pl.col("event") == pl.col("instance"))
            .join(
                ops.select(pl.col("event").cast(pl.Int64), "step", "dur_ns"),
                on="event",
                how="left",
            )
            .select("name", "instance", "step", pl.col("dur_ns").fill_null(0).alias("time_ns"))
        )
    return (
        rows.group_by(pl.col("name").alias("group"), "step")
        .agg(
            pl.col("instance").n_unique().cast(pl.Int64).alias("count"),
            pl.col("time_ns").sum().cast(pl.Int64),
        )
        .select(pl.lit(OP_TOTAL).alias("dim"), "group", "step", "count", "time_ns")
        .cast(GROUP_SCHEMA)
        .sort("group", "step", nulls_last=True)
    )


def group_times(rows: pl.DataFrame) -> pl.DataFrame:
    """Long frame (dim, group, step, count, time_ns) from `timed_rows`: per dimension, group
    and step (null: outside every step), how many launches (kernel) or op calls (op, module)
    and their time."""
    parts = []
    for dim in DIMENSIONS:
        count = pl.len() if dim == "kernel" else pl.col("call").n_unique()
        part = (
            rows.filter(pl.col(dim).is_not_null())
            .group_by(pl.col(dim).alias("group"), "step")
            .agg(count.cast(pl.Int64).alias("count"), pl.col("time_ns").sum().cast(pl.Int64))
            .select(pl.lit(dim).alias("dim"), "group", "step", "count", "time_ns")
        )
        parts.append(part)
    return pl.concat(parts).cast(GROUP_SCHEMA).sort("dim", "group", "step", nulls_last=True)


def step_table(steps: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """Per step: wall time of the `ProfilerStep` and the basis time (GPU or CPU op) inside it."""
    inside = rows.group_by("step").agg(pl.col("time_ns").sum())
    return (
        steps.select("step", pl.col("dur_ns").alias("wall_ns"))
        .join(inside, on="step", how="left")
        .with_columns(pl.col("time_ns").fill_null(0).cast(pl.Int64))
        .sort("step")
    )


def dominant_dtype(trace: Trace) -> str | None:
    """The floating-point type most op inputs carry (what 'the model runs in')."""
    types = trace.ops.select(pl.col("input_types").explode().alias("t")).filter(
        pl.col("t").str.contains(r"(?i)float|half|bfloat|double|float8")
    )
    if types.height == 0:
        return None
    return str(types["t"].value_counts(sort=True)["t"][0])


def device_names(trace: Trace) -> list[str]:
    """Names of the devices that ran activities (from `deviceProperties`), sorted."""
    used = trace.kernels["device"].drop_nulls().unique().sort().to_list()
    names = {trace.device_name(int(d)) or f"device {d}" for d in used}
    return sorted(names)


def vendor(trace: Trace) -> str:
    """'cuda', 'rocm', 'cpu' or 'other': who ran the kernels, from the runtime's API names."""
    if trace.kernels.height == 0:
        return "cpu"
    names = trace.runtime["name"].unique().to_list()
    if any(re.match(r"(?i)^hip", n) for n in names):
        return "rocm"
    if any(re.match(r"(?i)^cu", n) for n in names):
        return "cuda"
    props = " ".join(str(p.get("name", "")) for p in trace.device_properties)
    if re.search(r"(?i)AMD|Instinct|MI\d{3}", props):
        return "rocm"
    if re.search(r"(?i)NVIDIA|Tesla|GeForce|RTX", props):
        return "cuda"
    return "other"
