"""TQ206 unfused-optimizer: the optimizer step updates the parameters one tensor at a time."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.common import US, gpu_busy_in, in_ranges, optimizer_ranges
from traceq.rules.finding import Finding
from traceq.rules.op_groups import fusion_ops

#: Multi-tensor (`_foreach_add_`) and fused (`_fused_adam_`) updates: already batched.
BATCHED = r"^aten::_(?:foreach|fused)_"
#: What `fix` names per optimizer: `fused=True` exists for these, `foreach=True` for all.
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")


def per_tensor_updates(ctx: Context) -> pl.DataFrame:
    """Elementwise semantic ops run inside an `Optimizer.step` range (same thread), with
    the `region` they ran in: the per-parameter updates a multi-tensor optimizer batches.
    Regions that already use `_foreach_`/`_fused_` ops are left out. Computed once per
    analysis (TQ104 leaves these ops to this rule)."""
    return ctx.cached("per_tensor_updates", lambda: _per_tensor_updates(ctx))


def _step_ranges(ctx: Context) -> pl.DataFrame:
    return ctx.cached("optimizer_ranges.step", lambda: optimizer_ranges(ctx.trace, "step"))


def _per_tensor_updates(ctx: Context) -> pl.DataFrame:
    ops = fusion_ops(ctx)
    inside = in_ranges(ops, _step_ranges(ctx))
    batched = inside.filter(pl.col("name").str.contains(BATCHED))["region"].unique()
    return inside.filter(
        pl.col("role").is_in(["elementwise", "activation"])
        & ~pl.col("region").is_in(batched.implode())
    )


@rule(
    "TQ206",
    "unfused-optimizer",
    "warning",
    defaults={"min_ops": 8, "min_us": 50.0},
)
def unfused_optimizer(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds `Optimizer.step` ranges (recorded by `torch.optim`) in which the update runs as
    one elementwise op per parameter tensor: `mul_`, `add_`, `addcmul_`, `lerp_`, ... each
    with its own kernel launch, and no `_foreach_` or `_fused_` op. Reports a step once it
    has at least `min_ops` such ops and the estimated saving is at least `min_us`. CPU-only
    traces are left alone: there are no launches to batch.

    Savings model: the optimizer's CPU range minus the GPU's busy time inside it is time
    the GPU waits for dispatch and launches; a multi-tensor update issues one op per kind
    instead of one per tensor, so that wait shrinks by `1 − kinds / ops` (kinds: ops per
    tensor, e.g. 3 for SGD with momentum: `mul_`, `add_`, `add_`). A report's total counts
    it from that idle time (not from the update kernels, which run for far less).

    ## Why is this bad?
    A model has hundreds of parameter tensors, most of them small: the per-tensor loop
    spends a few µs of Python, dispatch and launch on each op while the kernel itself runs
    for one. The step is launch-bound and the GPU idles through it. `torch.optim` has a
    multi-tensor path (`foreach`, one kernel per op for a list of tensors) and, for the
    common optimizers, a fused one (one kernel for the whole update).

    ## Example
    ```python
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    ```

    ## Use instead
    ```python
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # or foreach=True
    ```
    Parameters on the CPU, or of mixed devices, fall back to the per-tensor loop.

    ## References
    - [torch.optim: foreach and fused implementations](https://pytorch.org/docs/stable/optim.html#algorithms)
    """
    if ctx.device.kind != "gpu":
        return
    updates = per_tensor_updates(ctx)
    if updates.height == 0:
        return
    regions = _step_ranges(ctx)
    busy = gpu_busy_in(ctx.trace.kernels, regions)
    per_region = (
        updates.group_by("region")
        .agg(
            pl.col("event").sort_by("ts_ns").alias("ops"),
            pl.col("kernel_events")
            .list.explode(keep_nulls=False, empty_as_null=False)
            .alias("kernels"),
            pl.col("gpu_ns").sum().alias("update_gpu_ns"),
        )
        .join(regions, on="region")
        .join(busy, on="region", how="left")
        .sort("ts_ns")
    )
    counts = updates.group_by("region", "name").agg(pl.len().alias("count"))
    for row in per_region.iter_rows(named=True):
        n = len(row["ops"])
        if n < ctx.options["min_ops"]:
            continue
        names = (
            counts.filter(pl.col("region") == row["region"])
            .sort("count", "name", descending=[True, False])
            .select("name", "count")
        )
        tensors = int(names["count"].min())
        kinds = max(1, round(n / tensors))
        span = row["end_ns"] - row["ts_ns"]
        gpu_busy = row["busy_ns"] or 0
        waiting = max(0, span - gpu_busy)
        saving_us = waiting * (1 - kinds / n) / US
        if saving_us < ctx.options["min_us"]:
            continue
        summary = ", ".join(f"{name} ×{count}" for name, count in names.iter_rows())
        optimizer = row["optimizer"]
        yield ctx.finding(
            message=(
                f"{optimizer}.step updates about {tensors} tensors one at a time: {n} ops "
                f"({summary}) launch {len(row['kernels'])} kernels in {span / US:,.1f} µs, "
                f"while the GPU is busy {gpu_busy / US:,.1f} µs"
            ),
            step=row["step"],
            ops=[row["region"], *row["ops"]],
            kernels=row["kernels"],
            time_us=span / US,
            est_saving_us=saving_us,
            saving_model=(
                f"({span / US:,.1f} µs optimizer step − {gpu_busy / US:,.1f} µs GPU busy) × "
                f"(1 − {kinds} multi-tensor ops / {n} per-tensor ops)"
            ),
            fix=_fix(optimizer),
            evidence={
                "optimizer": optimizer,
                "region_event": row["region"],
                "per_tensor_ops": n,
                "tensors": tensors,
                "ops_per_tensor": kinds,
                "by_name": [{"name": a, "count": c} for a, c in names.iter_rows()],
                "kernels": len(row["kernels"]),
                "span_us": span / US,
                "gpu_busy_us": gpu_busy / US,
                "update_gpu_us": row["update_gpu_ns"] / US,
                # what it saves is the GPU's wait through the step, not its kernels' time
                "saves_from": "gpu_idle",
                "window_ns": [row["ts_ns"], row["end_ns"]],
            },
        )


def _fix(optimizer: str) -> str:
    fused = (
        f"torch.optim.{optimizer}(..., fused=True) runs the whole update as one kernel; "
        if optimizer in FUSED_OPTIMIZERS
        else ""
    )
    return (
        f"{fused}foreach=True batches each op over all parameter tensors. Keep the "
        "parameters on one device and dtype, or torch.compile the optimizer step."
    )


RULE = unfused_optimizer
