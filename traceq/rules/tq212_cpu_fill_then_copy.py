"""TQ212 cpu-fill-then-copy: a tensor filled on the CPU and copied to the GPU right after.

PyTorch's profiler pattern matcher has this as `ExtraCUDACopyPattern`
(`torch/profiler/_pattern_matcher.py`): from an `aten::to` whose last child is `_to_copy`,
whose last child is a `copy_` between tensors of one dtype (a device move, no
conversion), it steps up to the Python call around `to` and back to the call just before
it, then down that call's last children until it meets an initializing op (`fill_`,
`zero_`, `normal_`, `uniform_`). It needs the live profiler (`with_stack=True`,
`record_shapes=True`) and does not check that the copy goes to the GPU.

From a saved trace traceq matches the same shape on the op tree: the op just before the
copy among its siblings on the thread (the copy's Python caller's previous call is that
op's caller) is, or ends by its last children in, an initializing op; and the copy issued
a `Memcpy HtoD`: the host → device copy is what makes it a finding (a CPU-only trace has
none, so the rule is silent there). Where shapes are recorded it also asks that the filled
tensor has the copied one's shape, which the matcher leaves as a TODO: a `sum` whose
output `fill_` happens to end it does not count.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.common import outermost_operator
from traceq.rules.finding import Finding

#: The matcher's `init_ops`: ops that fill a fresh tensor (`zeros`, `ones`, `full`, `rand*`).
INIT_OPS = ("aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_")

#: Ops that move a tensor to the device: the user's `.to(...)` / `.cuda()`, or `dst.copy_(src)`.
COPY_OPS = ("aten::to", "aten::_to_copy", "aten::copy_")

HOST_TO_DEVICE = r"^Memcpy HtoD"

#: How far down the last-child chain an initializing op is looked for (the matcher: all
#: the way; factory ops nest two or three deep, `zeros` → `zero_` → `fill_`).
MAX_DESCENT = 6

DEFAULTS = {"min_saving_us": 0.0}


def last_children(ops: pl.DataFrame) -> pl.DataFrame:
    """`node` -> `child`: each op's last child (latest start), as the matcher descends."""
    return (
        ops.filter(pl.col("parent").is_not_null())
        .sort("ts_ns", "event")
        .group_by("parent")
        .agg(pl.col("event").last().alias("child"))
        .rename({"parent": "node"})
    )


def _recorded() -> pl.Expr:
    """The op recorded its inputs (`record_shapes=True`): its tensors' shapes are real."""
    types = pl.col("input_types")
    return (types.list.len() > 0).fill_null(False) & (types.list.first() != "").fill_null(False)


def _device_moves(ops: pl.DataFrame, lasts: pl.DataFrame) -> pl.DataFrame:
    """`copy`: copy ops whose `copy_` (the op itself, or `to` → last child `_to_copy` → last
    child `copy_`, as the matcher walks) did not record two different dtypes: a move, not
    a conversion."""
    names = ops.select(pl.col("event").alias("node"), "name", "input_types")
    start = ops.filter(pl.col("name").is_in(COPY_OPS)).select(
        pl.col("event").alias("copy"), pl.col("event").alias("node")
    )
    steps = [start]
    for _ in range(2):
        steps.append(steps[-1].join(lasts, on="node").select("copy", pl.col("child").alias("node")))
    reached = pl.concat(steps).join(names, on="node").filter(pl.col("name") == "aten::copy_")
    dst = pl.col("input_types").list.get(0, null_on_oob=True)
    src = pl.col("input_types").list.get(1, null_on_oob=True)
    differ = ((dst != src) & (dst != "") & (src != "")).fill_null(False)
    return reached.filter(~differ).select("copy").unique()


def fill_then_copy(ops: pl.DataFrame) -> pl.DataFrame:
    """Copy ops whose previous sibling is, or ends in, an initializing op: `copy` (the copy
    op), `fill_op` (its previous sibling), `init` (the initializing op), `shapes_checked`.

    The structure alone, the matcher's part: whether the copy went host → device is the
    caller's question. A copy whose `copy_` converts (two recorded dtypes that differ) is
    no device move; a filled tensor whose recorded shape is not the copied one's is not
    the tensor copied.
    """
    ops = ops.select(
        pl.col("event").cast(pl.Int64),
        "name",
        "pid",
        "tid",
        "parent",
        "ts_ns",
        "shapes",
        "input_types",
    )
    siblings = ops.sort("ts_ns", "event").with_columns(
        pl.col("event").shift(1).over("pid", "tid", "parent").alias("fill_op")
    )
    copies = siblings.filter(pl.col("name").is_in(COPY_OPS)).drop_nulls("fill_op")
    if copies.height == 0:
        return pl.DataFrame(
            schema={
                "copy": pl.Int64,
                "fill_op": pl.Int64,
                "init": pl.Int64,
                "shapes_checked": pl.Boolean,
            }
        )
    # down the previous sibling's last children, stopping at the first initializing op
    lasts = last_children(ops)
    names = ops.select(pl.col("event").alias("node"), "name")
    chain = copies.select(pl.col("event").alias("copy"), "fill_op").with_columns(
        pl.col("fill_op").alias("node")
    )
    found: list[pl.DataFrame] = []
    for _ in range(MAX_DESCENT):
        chain = chain.join(names, on="node")
        hit = chain.filter(pl.col("name").is_in(INIT_OPS))
        found.append(hit.select("copy", "fill_op", pl.col("node").alias("init")))
        chain = (
            chain.join(hit.select("copy"), on="copy", how="anti")
            .drop("name")
            .join(lasts, on="node")
            .select("copy", "fill_op", pl.col("child").alias("node"))
        )
        if chain.height == 0:
            break
    matched = pl.concat(found).join(_device_moves(ops, lasts), on="copy")
    # the copied tensor: `to`'s self, `copy_`'s src; the filled one: the init op's self
    source = ops.select(
        pl.col("event").alias("copy"),
        pl.when(pl.col("name") == "aten::copy_")
        .then(pl.col("shapes").list.get(1, null_on_oob=True))
        .otherwise(pl.col("shapes").list.get(0, null_on_oob=True))
        .alias("_copied"),
        _recorded().alias("_copy_recorded"),
    )
    filled = ops.select(
        pl.col("event").alias("init"),
        pl.col("shapes").list.get(0, null_on_oob=True).alias("_filled"),
        _recorded().alias("_init_recorded"),
    )
    # a 0-dim tensor's shape is [], as is every shape of a trace without record_shapes
    recorded = pl.col("_copy_recorded") & pl.col("_init_recorded")
    return (
        matched.join(source, on="copy", how="left")
        .join(filled, on="init", how="left")
        .with_columns(recorded.fill_null(False).alias("shapes_checked"))
        .filter(~pl.col("shapes_checked") | (pl.col("_copied") == pl.col("_filled")))
        .select("copy", "fill_op", "init", "shapes_checked")
        .sort("copy")
    )


FIX = (
    'Create the tensor on the device: `torch.zeros(..., device="cuda")` (likewise `ones`, '
    "`full`, `empty(...).fill_`, `randn`, `rand`, `*_like`), or build a module under "
    '`with torch.device("cuda"):` so its parameters are initialized there; no host '
    "buffer, no host → device copy"
)


@rule("TQ212", "cpu-fill-then-copy", "warning", defaults=DEFAULTS)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds a tensor created and filled on the CPU (`torch.zeros`, `ones`, `full`, `randn`,
    `rand`, a module's `reset_parameters`) and copied to the GPU by the very next op
    (`.to("cuda")`, `.cuda()`, `dst.copy_(src)`), which issues a host → device memcpy.
    PyTorch's profiler pattern matcher reports this as `ExtraCUDACopyPattern`; traceq finds
    it in a saved trace, from the op tree and the `Memcpy HtoD` the copy launched, and
    where shapes are recorded checks that the filled tensor is the copied one.

    ## Why is this bad?
    The values are written by the CPU into pageable memory, then moved over PCIe; the
    host blocks for a pageable copy. Created on the device, the same tensor is one fill
    kernel at device bandwidth, and nothing crosses the bus.

    Estimated saving: the host's time in the memcpy call (it waits for a pageable copy)
    plus the CPU fill, less one kernel launch for the fill on the device.

    ## Example
    ```python
    mask = torch.zeros(batch, seq).to("cuda")
    noise = torch.randn(shape).cuda()
    ```

    ## Use instead
    ```python
    mask = torch.zeros(batch, seq, device="cuda")
    noise = torch.randn(shape, device="cuda")
    with torch.device("cuda"):
        model = Model()  # parameters initialized on the GPU
    ```

    ## Options
    - `min_saving_us` (0): leave out copies that save less.

    ## References
    - PyTorch performance tuning guide, "Create tensors directly on the target device":
      https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    - `torch/profiler/_pattern_matcher.py`, `ExtraCUDACopyPattern`
    """
    kernels = ctx.trace.kernels
    copies = kernels.filter(
        (pl.col("kind") == "memcpy") & pl.col("name").str.contains(HOST_TO_DEVICE)
    )
    if copies.height == 0:
        return
    ops = ctx.trace.ops
    copies = outermost_operator(copies, ops).filter(pl.col("top_name").is_in(COPY_OPS))
    if copies.height == 0:
        return
    calls = ctx.trace.runtime.select(
        pl.col("event").alias("runtime_event"), pl.col("dur_ns").alias("call_ns")
    )
    per_copy = (
        copies.join(calls, on="runtime_event", how="left")
        .group_by(pl.col("top_event").alias("copy"), maintain_order=True)
        .agg(
            pl.col("event").alias("memcpy"),
            pl.col("bytes").fill_null(0).sum(),
            pl.col("dur_ns").sum().alias("memcpy_ns"),
            pl.col("call_ns").fill_null(0).sum(),
        )
    )
    matched = fill_then_copy(ops).join(per_copy, on="copy")
    if matched.height == 0:
        return
    info = ops.select(
        pl.col("event").cast(pl.Int64), "name", "dur_ns", "step", "module", "shapes", "input_types"
    )
    events = matched.select(pl.concat_list("copy", "fill_op", "init")).to_series().explode()
    rows = {
        r["event"]: r
        for r in info.filter(pl.col("event").is_in(events.implode())).iter_rows(named=True)
    }
    launch_us = ctx.device.launch_overhead_us
    for found in matched.iter_rows(named=True):
        copy, fill, init = rows[found["copy"]], rows[found["fill_op"]], rows[found["init"]]
        copy_us = (copy["dur_ns"] or 0) / 1000
        fill_us = (fill["dur_ns"] or 0) / 1000
        # the host waits in the memcpy call (pageable), not in the copy op's other work
        # (the first copy of a process may hold CUDA's context set-up)
        call_us = min(found["call_ns"] / 1000, copy_us) if copy_us else found["call_ns"] / 1000
        saving = max(0.0, call_us + fill_us - launch_us)
        if saving < ctx.options["min_saving_us"]:
            continue
        shape = (copy["shapes"] or [None])[0] if copy["name"] != "aten::copy_" else None
        shape = shape or None
        what = f"`{fill['name']}`" + (
            f" (ending in `{init['name']}`)" if init["name"] != fill["name"] else ""
        )
        yield ctx.finding(
            message=(
                f"tensor filled on the CPU by {what} and copied to the GPU by the next op, "
                f"`{copy['name']}` ({found['bytes']} bytes host → device)"
            ),
            step=copy["step"],
            module=copy["module"],
            ops=list(dict.fromkeys([found["fill_op"], found["init"], found["copy"]])),
            kernels=sorted(found["memcpy"]),
            shapes=[shape] if shape else [],
            dtype=(copy["input_types"] or [None])[0] or None,
            time_us=call_us + fill_us,
            est_saving_us=saving,
            saving_model=(
                f"the host's {call_us:.1f} µs in the memcpy call and the CPU fill's "
                f"{fill_us:.1f} µs, less one fill kernel launch on the device "
                f"({launch_us:.2f} µs)"
            ),
            fix=FIX + ".",
            evidence={
                "fill_op": found["fill_op"],
                "init_op": found["init"],
                "init_name": init["name"],
                "copy_op": found["copy"],
                "memcpy_bytes": found["bytes"],
                "memcpy_us": round(found["memcpy_ns"] / 1000, 3),
                "shapes_checked": found["shapes_checked"],
            },
        )


RULE = check
