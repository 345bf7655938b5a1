"""TQ207 zeroed-grads: `zero_grad` writes zeros into every gradient, and backward then adds
into them, where setting them to None would skip both."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.common import US, gpu_busy_in, in_ranges, optimizer_ranges, step_text
from traceq.rules.finding import Finding
from traceq.rules.op_groups import fusion_ops

#: Ops that zero a gradient in place (`zero_` runs `fill_`; `_foreach_zero_` a whole list).
ZEROING = ("aten::zero_", "aten::fill_", "aten::_foreach_zero_")
#: Autograd's node that writes a leaf's gradient; with a zeroed `.grad` it runs an `add_`.
ACCUMULATE = "AccumulateGrad"


@rule("TQ207", "zeroed-grads", "warning", defaults={"min_tensors": 8, "min_us": 50.0})
def zeroed_grads(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds `Optimizer.zero_grad` ranges (recorded by `torch.optim`) that write zeros into the
    gradients (`zero_`, `fill_`, `_foreach_zero_`) instead of setting them to `None`, with
    the `add_`s autograd's `AccumulateGrad` then runs to add each new gradient into its
    zeroed one (those after the range in its step; without steps, until the next range).
    Reports a range that zeroes at least `min_tensors` gradients (a `_foreach_zero_`
    counts its list as one op: the adds are what remain) when the estimated saving is at
    least `min_us`.

    Savings model: both go away with `set_to_none=True`. The zeroing costs the range's time
    the GPU spends waiting (range − GPU busy inside it; on a CPU-only trace, the range);
    the accumulation costs its `add_` ops' time (GPU time of their kernels; CPU time on a
    CPU-only trace). The saving is the sum; a report's total counts both parts (the GPU's
    idle time in the range and the add kernels), each µs once.

    ## Why is this bad?
    Zeroing launches one kernel per parameter tensor (hundreds per step, a few µs of
    dispatch each) and writes every gradient once; backward then reads the zeros back to
    add the new gradient, where with `None` it would just keep the freshly computed tensor.
    Both passes over all gradients are pure overhead.

    ## Example
    ```python
    optimizer.zero_grad(set_to_none=False)  # PyTorch < 2.0 default
    ```

    ## Use instead
    ```python
    optimizer.zero_grad()  # set_to_none=True, the default since PyTorch 2.0
    ```
    Code that reads `.grad` between steps must then handle `None` (e.g. parameters that got
    no gradient).

    ## References
    - [torch.optim.Optimizer.zero_grad](https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html)
    - [Performance tuning guide: zero gradients efficiently](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html)
    """
    regions = optimizer_ranges(ctx.trace, "zero_grad")
    if regions.height == 0:
        return
    ops = fusion_ops(ctx)
    zeroing = in_ranges(ops.filter(pl.col("name").is_in(ZEROING)), regions)
    if zeroing.height == 0:
        return
    gpu = ctx.device.kind == "gpu"
    busy = gpu_busy_in(ctx.trace.kernels, regions) if gpu else None
    zeroed = zeroing.group_by("region").agg(
        pl.col("event").sort_by("ts_ns").alias("zero_ops"),
        (pl.col("name") != "aten::_foreach_zero_").sum().alias("per_tensor"),
        pl.col("kernel_events").list.explode(keep_nulls=False, empty_as_null=False),
    )
    accumulating = gradient_accumulation(ctx).filter(pl.col("name") == "aten::add_")
    adds = (
        zeroed_by(accumulating, regions.join(zeroed.select("region"), on="region"))
        .group_by("region")
        .agg(
            pl.col("event").alias("add_ops"),
            pl.col("time_ns").sum().alias("add_ns"),
            pl.col("kernel_events").list.explode(keep_nulls=False, empty_as_null=False),
        )
    )
    rows = (
        zeroed.join(regions, on="region")
        .join(adds, on="region", how="left", suffix="_adds")
        .sort("ts_ns")
    )
    if busy is not None:
        rows = rows.join(busy, on="region", how="left")
    for row in rows.iter_rows(named=True):
        add_ops = row["add_ops"] or []
        if max(row["per_tensor"], len(add_ops)) < ctx.options["min_tensors"]:
            continue
        span = row["end_ns"] - row["ts_ns"]
        gpu_busy = (row.get("busy_ns") or 0) if gpu else 0
        zeroing_ns = max(0, span - gpu_busy)
        add_ns = row["add_ns"] or 0
        saving_us = (zeroing_ns + add_ns) / US
        if saving_us < ctx.options["min_us"]:
            continue
        n_zero, n_add = len(row["zero_ops"]), len(add_ops)
        where = step_text(row["step"])
        # with `set_to_none` the GPU no longer waits through zero_grad, and the add kernels
        # go: both are what the total may count (`traceq.reports.savings`)
        saves_from = (
            {"saves_from": "gpu_idle+own", "window_ns": [row["ts_ns"], row["end_ns"]]}
            if gpu
            else {}
        )
        yield ctx.finding(
            message=(
                f"{row['optimizer']}.zero_grad writes zeros into the gradients ({n_zero} ops, "
                f"{span / US:,.1f} µs) and backward adds into them ({n_add} AccumulateGrad "
                f"add_ ops, {add_ns / US:,.1f} µs {'GPU' if gpu else 'CPU'}) in {where}"
            ),
            step=row["step"],
            ops=[row["region"], *row["zero_ops"], *add_ops],
            kernels=[*row["kernel_events"], *(row["kernel_events_adds"] or [])],
            time_us=(span + add_ns) / US,
            est_saving_us=saving_us,
            saving_model=(
                f"zeroing {zeroing_ns / US:,.1f} µs ({span / US:,.1f} µs range − "
                f"{gpu_busy / US:,.1f} µs GPU busy) + accumulating {add_ns / US:,.1f} µs"
            ),
            fix=(
                "Call optimizer.zero_grad(set_to_none=True) (the default since PyTorch 2.0) "
                "or model.zero_grad(set_to_none=True)."
            ),
            evidence={
                "optimizer": row["optimizer"],
                "region_event": row["region"],
                "zeroing_ops": n_zero,
                "per_tensor_zeroing_ops": row["per_tensor"],
                "accumulate_adds": n_add,
                "span_us": span / US,
                "gpu_busy_us": gpu_busy / US,
                "accumulate_us": add_ns / US,
                **saves_from,
            },
        )


def zeroed_by(adds: pl.DataFrame, regions: pl.DataFrame) -> pl.DataFrame:
    """`adds` with the `region` (zero_grad range) whose zeros each one adds into: the last
    one before it in its step, or, for adds before a step's first zero_grad (a loop that
    zeroes after `optimizer.step()`), that first one. Adds run on autograd's threads, so
    only time and step decide. A trace without steps is one long step: this keeps each
    iteration's adds with its own zero_grad, not every add with every zero_grad."""
    key = pl.col("step").fill_null(-1).alias("_step")
    starts = regions.select("region", key, pl.col("ts_ns").alias("_start")).sort("_start")
    probe = adds.with_columns(key).sort("ts_ns")
    after = probe.join_asof(
        starts,
        left_on="ts_ns",
        right_on="_start",
        by="_step",
        strategy="backward",
        check_sortedness=False,  # both sorted on time above
    )
    before = probe.join_asof(
        starts,
        left_on="ts_ns",
        right_on="_start",
        by="_step",
        strategy="forward",
        check_sortedness=False,
    )
    region = pl.coalesce(after["region"], before["region"])
    return after.with_columns(region.alias("region")).drop_nulls("region").drop("_step", "_start")


def gradient_accumulation(ctx: Context) -> pl.DataFrame:
    """Semantic ops run by autograd's `AccumulateGrad` nodes (the `add_` into a parameter's
    `.grad`), computed once per analysis (TQ104 leaves them out of chains)."""

    def build() -> pl.DataFrame:
        ops = fusion_ops(ctx)
        nodes = ctx.trace.ops.filter(pl.col("name").str.ends_with(ACCUMULATE))
        parents = nodes.select(pl.col("event").cast(ops["parent"].dtype).alias("parent"))
        return ops.join(parents, on="parent", how="semi")

    return ctx.cached("gradient_accumulation", build)


RULE = zeroed_grads
