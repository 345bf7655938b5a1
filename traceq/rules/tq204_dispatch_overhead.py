"""TQ204 dispatch-overhead: CPU time in ops that compute nothing (views, transposes, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.common import US, step_text
from traceq.rules.finding import Finding

if TYPE_CHECKING:
    from traceq.trace import Trace

# Ops that only make a new tensor header (shape, strides, aliasing) or allocate: they launch
# no kernel and touch no data unless they fall back to a copy (then a child op shows it).
METADATA_OPS = (
    "aten::view",
    "aten::_unsafe_view",
    "aten::view_as",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::as_strided",
    "aten::t",
    "aten::numpy_T",
    "aten::transpose",
    "aten::permute",
    "aten::movedim",
    "aten::expand",
    "aten::expand_as",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::flatten",
    "aten::unflatten",
    "aten::slice",
    "aten::select",
    "aten::narrow",
    "aten::split",
    "aten::split_with_sizes",
    "aten::chunk",
    "aten::unbind",
    "aten::detach",
    "aten::detach_",
    "aten::alias",
    "aten::lift_fresh",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::contiguous",
    "aten::to",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::result_type",
)


@rule(
    "TQ204",
    "dispatch-overhead",
    "info",
    defaults={"min_share": 0.1, "min_us": 20.0, "top": 5},
)
def dispatch_overhead(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Measures, per profiler step, the CPU time spent in ops that do no work: views,
    reshapes, transposes, `as_strided`, `expand`, `detach`, empty allocations, no-op `to`.
    An op counts only when nothing under it computes, copies or calls the CUDA runtime
    (e.g. `cudaMalloc`), and nested ones count once. Reports steps where that time is at
    least `min_share` of the step and `min_us` in all. Traces without `ProfilerStep`s are
    measured as one window, from the first op to the last.

    Savings model: on a CPU-only trace, the CPU *is* the timeline, so all of that time is
    the saving, each op counted at its name's median duration in the trace (at most its
    own), so one op stretched by the OS scheduler does not become the estimate; the step
    is reported only when that typical time also meets `min_share` and `min_us`. On a GPU
    trace the CPU overhead only costs time while the GPU waits: the saving is that time ×
    the GPU's idle share of the step (`1 − busy / step`), so a GPU-bound step shows
    little. That idle time is also what TQ201 saves in a launch-bound stretch: a report's
    total counts it once (`traceq.reports.savings`).

    ## Why is this bad?
    Each eager op goes through Python, the dispatcher and autograd bookkeeping: a few µs
    even when it only relabels strides. Models with many small ops (attention head
    reshapes, `F.linear`'s weight `t()`) spend a large share of the step there, which is
    what leaves the GPU starved (see TQ201).

    ## Example
    ```python
    q = self.q(x).view(b, s, h, d).transpose(1, 2)  # 2 dispatches, no work
    k = self.k(x).view(b, s, h, d).transpose(1, 2)
    ```

    ## Use instead
    ```python
    model = torch.compile(model)  # traces views away; no per-op dispatch at run time
    ```
    Or merge projections (one `qkv` GEMM + one `view`/`unbind`), and move shape juggling
    out of the hot loop.

    ## References
    - [Making Deep Learning Go Brrrr: overhead](https://horace.io/brrr_intro.html)
    - [torch.compile tutorial](https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html)
    """
    ops = ctx.trace.ops
    if ops.height == 0:
        return
    busy = ctx.trace.runtime["op_event"].drop_nulls().unique()  # ops that call the driver
    pure = _pure_outermost(ops, busy)
    if pure.height == 0:
        return
    windows = _step_bounds(ctx.trace)
    gpu = _gpu_busy_by_step(ctx)
    # On a CPU-only trace each op is counted at its name's median duration: one `aten::t`
    # stretched 30x by the OS scheduler (or the profiler's first call) is not dispatch cost.
    typical = pl.col("dur_ns").median().over("name") if gpu is None else pl.col("dur_ns")
    per_step = (
        pure.with_columns(pl.min_horizontal(typical, pl.col("dur_ns")).alias("_typical"))
        .group_by("step")
        .agg(
            pl.col("dur_ns").sum().alias("overhead_ns"),
            pl.col("_typical").sum().alias("typical_ns"),
            pl.len().alias("n"),
            pl.col("event"),
        )
    )
    top = (
        pure.group_by("step", "name")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("ns"))
        .sort("ns", descending=True)
        .group_by("step", maintain_order=True)
        .head(ctx.options["top"])
    )
    rows = per_step.join(windows, on="step", how="inner", nulls_equal=True).sort(
        "step", nulls_last=True
    )
    for row in rows.iter_rows(named=True):
        span = row["window_ns"]
        if not span:
            continue
        share = row["overhead_ns"] / span
        overhead_us = row["overhead_ns"] / US
        typical_us = row["typical_ns"] / US
        if (
            min(share, row["typical_ns"] / span) < ctx.options["min_share"]
            or typical_us < ctx.options["min_us"]
        ):
            continue
        names = top.filter(pl.col("step").eq_missing(row["step"]))
        saves_from: dict = {}
        if gpu is None:
            factor = 1.0
            model = (
                f"(each op at its name's median, {typical_us:,.1f} µs) CPU-only trace: all of "
                "it is on the timeline"
            )
        else:
            busy = gpu.get(row["step"], 0)
            factor = max(0.0, 1.0 - busy / span)
            model = f"× GPU idle share {factor:.0%} of the step (busy {busy / US:,.1f} µs)"
            # On a GPU trace the saving is GPU idle time in the step (a report's total
            # counts it once, with TQ201's launch-bound gaps).
            saves_from = {"saves_from": "gpu_idle", "window_ns": [row["ts_ns"], row["end_ns"]]}
        where = step_text(row["step"])
        summary = ", ".join(f"{n} ×{c}" for n, c, _ in names.select("name", "count", "ns").rows())
        yield ctx.finding(
            message=(
                f"{share:.0%} of {where} ({overhead_us:,.1f} of {span / US:,.1f} µs) is "
                f"dispatch of {row['n']} ops that compute nothing: {summary}"
            ),
            step=row["step"],
            ops=row["event"],
            time_us=overhead_us,
            est_saving_us=typical_us * factor,
            saving_model=f"{overhead_us:,.1f} µs of no-work ops {model}",
            fix=(
                "Compile the step (torch.compile) so views are traced away, or merge the "
                "ops that need them (e.g. one fused qkv projection)."
            ),
            evidence={
                "share": share,
                "window_us": span / US,
                "ops": row["n"],
                "op_names": names["name"].to_list(),
                "by_name": [
                    {"name": n, "count": c, "us": ns / US}
                    for n, c, ns in names.select("name", "count", "ns").rows()
                ],
                "typical_us": typical_us,
                **saves_from,
            },
        )


def _pure_outermost(ops: pl.DataFrame, busy: pl.Series) -> pl.DataFrame:
    """Metadata ops with no working op or runtime call (`cudaMalloc`, ...) beneath them,
    not nested in another such op."""
    ops = ops.with_columns(pl.col("event").cast(pl.Int64), pl.col("parent").cast(pl.Int64))
    is_meta = pl.col("name").is_in(METADATA_OPS)
    meta = ops.filter(is_meta).select("event", "parent")
    # Mark metadata ancestors of any working op (or runtime call) impure, a level per pass.
    seeds = pl.concat(
        [
            ops.filter(~is_meta).select(pl.col("parent").alias("event")).drop_nulls(),
            pl.DataFrame({"event": busy.cast(pl.Int64)}),
        ]
    )
    impure = seeds.join(meta, on="event", how="semi").unique()
    frontier = impure
    while frontier.height:
        frontier = (
            meta.join(frontier, on="event", how="semi")
            .select(pl.col("parent").alias("event"))
            .drop_nulls()
            .join(meta, on="event", how="semi")
            .join(impure, on="event", how="anti")
            .unique()
        )
        impure = pl.concat([impure, frontier])
    pure = ops.filter(is_meta).join(impure, on="event", how="anti")
    pure_ids = pure.select(pl.col("event").alias("parent"))
    return pure.join(pure_ids, on="parent", how="anti")


def _step_bounds(trace: Trace) -> pl.DataFrame:
    """`step`, `ts_ns`, `end_ns`, `window_ns` of each profiler step; a trace without steps
    is one window (step null) from its first op to its last."""
    if trace.steps.height:
        return trace.steps.select("step", "ts_ns", "end_ns", pl.col("dur_ns").alias("window_ns"))
    return trace.ops.select(
        pl.lit(None, pl.Int64).alias("step"),
        pl.col("ts_ns").min(),
        pl.col("end_ns").max(),
        (pl.col("end_ns").max() - pl.col("ts_ns").min()).alias("window_ns"),
    )


def _gpu_busy_by_step(ctx: Context) -> dict[int | None, int] | None:
    """GPU busy time (kernel time, summed) per step; None on CPU-only traces."""
    kernels = ctx.trace.kernels
    if kernels.height == 0:
        return None
    if ctx.trace.steps.height == 0:
        kernels = kernels.with_columns(pl.lit(None, pl.Int64).alias("step"))
    busy = kernels.group_by("step").agg(pl.col("dur_ns").sum())
    return dict(busy.iter_rows())


RULE = dispatch_overhead
