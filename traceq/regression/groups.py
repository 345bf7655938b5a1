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


class _Tree:
    """The op tree as arrays over `ops` sorted by event: `parent` position (-1: a root),
    `levels` (positions per depth, roots first), and a pre-order numbering (`pre`, with
    `size` ops in each subtree) in which every subtree is the contiguous range
    `[pre, pre + size)`.

    Every pass walks the tree a level at a time and touches each op once per pass, so time
    and memory are linear in the number of ops (plus a numpy call per level), however deep
    the ops nest: a chain of 20,000 nested ops is as cheap as 20,000 siblings."""

    def __init__(self, ops: pl.DataFrame) -> None:
        events = ops["event"].cast(pl.Int64).to_numpy()
        parent_event = ops["parent"].cast(pl.Int64).fill_null(-1).to_numpy()
        n = len(events)
        at = np.minimum(np.searchsorted(events, parent_event), max(n - 1, 0))
        found = (parent_event >= 0) & (events[at] == parent_event) if n else at.astype(bool)
        self.parent = np.where(found, at, -1)
        # Children grouped by parent (roots under -1), each group in event order.
        kids = np.argsort(self.parent, kind="stable")
        first = np.searchsorted(self.parent[kids], np.arange(-1, n), side="left")
        last = np.searchsorted(self.parent[kids], np.arange(-1, n), side="right")
        self.levels: list[np.ndarray] = []
        level = kids[first[0] : last[0]]
        while level.size:  # an op in a parent cycle (never made by `nesting`) is left out
            self.levels.append(level)
            lo, hi = first[level + 1], last[level + 1]
            counts = hi - lo
            starts = np.repeat(lo - np.cumsum(counts) + counts, counts)
            level = kids[starts + np.arange(int(counts.sum()))]
        self.size = np.ones(n, dtype=np.int64)
        for level in reversed(self.levels[1:]):
            np.add.at(self.size, self.parent[level], self.size[level])
        # Offset of each op among its siblings: the sizes of the siblings before it.
        sizes = self.size[kids]
        before = np.cumsum(sizes) - sizes  # running total over every group, exclusive
        offset = np.empty(n, dtype=np.int64)
        base = np.zeros(n + 1, dtype=np.int64)
        nonempty = first < last
        base[nonempty] = before[first[nonempty]]
        offset[kids] = before - base[self.parent[kids] + 1]
        self.pre = np.zeros(n, dtype=np.int64)
        for depth, level in enumerate(self.levels):
            if depth == 0:
                self.pre[level] = offset[level]
            else:
                self.pre[level] = self.pre[self.parent[level]] + 1 + offset[level]


def outermost_instances(ops: pl.DataFrame) -> pl.DataFrame:
    """(`event`, `instance`): for each op, the outermost op of its name on its
    ancestor-or-self chain, the instance its time counts towards (itself when no op of its
    name encloses it).

    Ops of one name never partly overlap in the tree, so in pre-order an op lies inside an
    earlier one of its name exactly when it starts before the furthest end among them: a
    sort and two running maxima, linear in memory whatever the nesting depth."""
    ops = ops.sort("event")
    tree = _Tree(ops)
    n = ops.height
    events = ops["event"].cast(pl.Int64)
    if n == 0:
        return pl.DataFrame({"event": events, "instance": events})
    name = ops["name"].fill_null("").cast(pl.Categorical).to_physical().to_numpy()
    order = np.lexsort((tree.pre, name))
    group = np.concatenate(([0], np.cumsum(name[order][1:] != name[order][:-1])))
    # Shift each name's pre-order range past the previous name's so one running maximum
    # serves every name at once.
    shift = group.astype(np.int64) * (n + 1)
    start = tree.pre[order] + shift
    end = start + tree.size[order]
    reach = np.maximum.accumulate(end)
    inside = np.zeros(n, dtype=bool)
    inside[1:] = start[1:] < reach[:-1]
    outer = np.maximum.accumulate(np.where(inside, 0, np.arange(n)))
    instance = np.empty(n, dtype=np.int64)
    instance[order] = order[outer]
    return pl.DataFrame({"event": events, "instance": events.gather(pl.Series(instance))})


def _instance_kernel_times(ops: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """(`name`, `step`, `instance`, `time_ns`): per outermost instance and kernel step, the
    time of the kernels launched anywhere beneath it. Each kernel's (instance, step) pair is
    passed up from one outermost instance to the next enclosing one, deepest first, merged
    with its siblings' at every stop: memory and time grow with the pairs that exist, never
    with the number of ancestors times the number of ops."""
    ops = ops.sort("event")
    tree = _Tree(ops)
    instances = outermost_instances(ops)
    positions = np.arange(ops.height)
    outer = instances["instance"].to_numpy() == instances["event"].to_numpy()
    depth = np.zeros(ops.height, dtype=np.int64)
    nearest = np.where(outer, positions, -1)  # nearest outer ancestor-or-self
    for d, level in enumerate(tree.levels):
        depth[level] = d
        if d:
            nearest[level] = np.where(outer[level], level, nearest[tree.parent[level]])
    up = np.where(tree.parent >= 0, nearest[np.maximum(tree.parent, 0)], -1)
    events = ops["event"].cast(pl.Int64).to_numpy()
    launched = kernels.select(
        pl.col("op_event").cast(pl.Int64), "step", pl.col("dur_ns").fill_null(0).cast(pl.Int64)
    ).filter(pl.col("op_event").is_not_null())
    op_event = launched["op_event"].to_numpy()
    at = np.minimum(np.searchsorted(events, op_event), max(ops.height - 1, 0))
    known = (events[at] == op_event) if ops.height else np.zeros(len(op_event), dtype=bool)
    steps = launched["step"].fill_null(-1).to_numpy()[known]  # step numbers are never < 0
    step_values, step_code = np.unique(steps, return_inverse=True)
    width = max(len(step_values), 1)
    pending: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}

    def send(owner: np.ndarray, code: np.ndarray, time: np.ndarray) -> None:
        for d in np.unique(depth[owner]):
            mine = depth[owner] == d
            pending.setdefault(int(d), []).append((owner[mine] * width + code[mine], time[mine]))

    owner = nearest[at[known]]
    reached = owner >= 0  # an op outside the tree (a parent cycle) counts towards no instance
    durations = launched["dur_ns"].to_numpy()[known]
    send(owner[reached], step_code.astype(np.int64)[reached], durations[reached])
    keys: list[np.ndarray] = []
    times: list[np.ndarray] = []
    while pending:  # deepest first: each stop sends only to shallower ones
        arrived = pending.pop(max(pending))
        key = np.concatenate([k for k, _ in arrived])
        time = np.concatenate([t for _, t in arrived])
        key, inverse = np.unique(key, return_inverse=True)
        total = np.zeros(len(key), dtype=np.int64)
        np.add.at(total, inverse, time)
        keys.append(key)
        times.append(total)
        owner, code = key // width, key % width
        onward = up[owner] >= 0
        if onward.any():
            send(up[owner[onward]], code[onward], total[onward])
    key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    owner = key // width
    step = step_values[key % width] if len(step_values) else np.zeros(0, dtype=np.int64)
    return pl.DataFrame(
        {
            "name": ops["name"].gather(pl.Series(owner)),
            "step": pl.Series(step, dtype=pl.Int64).set(pl.Series(step < 0), None),
            "instance": pl.Series(events[owner], dtype=pl.Int64),
            "time_ns": pl.Series(np.concatenate(times) if times else [], dtype=pl.Int64),
        }
    )


def op_totals(trace: Trace) -> pl.DataFrame:
    """`op_total` groups (see the module docstring): per op name and step, how many instances
    and their time. Time: the GPU activities launched under an instance (each counted once),
    or, on CPU-only traces, the instances' own durations (children included)."""
    ops = trace.ops
    if ops.height == 0:
        return pl.DataFrame(schema=GROUP_SCHEMA)
    if time_basis(trace) == "gpu":
        rows = _instance_kernel_times(ops, trace.kernels)
    else:
        rows = (
            outermost_instances(ops)
            .filter(pl.col("event") == pl.col("instance"))
            .join(
                ops.select(pl.col("event").cast(pl.Int64), "name", "step", "dur_ns"),
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
