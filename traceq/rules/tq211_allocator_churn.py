"""TQ211 allocator-churn: device memory allocated and freed through the driver in the loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.phases import setup_phase_of
from traceq.rules.base import Context, rule
from traceq.rules.common import US, outermost_operator, step_text
from traceq.rules.finding import Finding

if TYPE_CHECKING:
    from traceq.trace import Trace

# The driver's own allocation calls. The caching allocator calls them only on a cache miss
# (`cudaMalloc`) or when it gives memory back (`cudaFree`: on an OOM retry, `empty_cache()`,
# or to split a segment). Stream-ordered `cudaMallocAsync` / `cudaFreeAsync` do not
# synchronize and are left alone.
ALLOC_CALL = r"^(cuda|hip)(Malloc|Free)$|^cuMem(Alloc|Free)(_v2)?$"


@rule(
    "TQ211",
    "allocator-churn",
    "warning",
    defaults={"min_saving_us": 50.0},
)
def allocator_churn(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds `cudaMalloc` / `cudaFree` (`hipMalloc` / `hipFree`, `cuMemAlloc` / `cuMemFree`)
    runtime calls inside the steps — in a trace without `ProfilerStep`s, anywhere outside
    its setup phases (CUDA-graph capture, compilation, warm-up, the profiler's own
    bookkeeping: `traceq.relations.phases`) — grouped per step and the op that made them
    (the outermost operator, e.g. `aten::addmm`, `aten::empty`), one finding per group.

    PyTorch's caching allocator keeps freed blocks for reuse; it calls the driver only when
    its cache has no block that fits (`cudaMalloc`) and frees segments back (`cudaFree`)
    when an allocation fails and it retries after emptying its cache, when
    `torch.cuda.empty_cache()` runs, or when fragmentation leaves no block of the size
    asked. `cudaFree` synchronizes the device: the host waits for all queued work, then
    the GPU idles until the host launches again.

    Savings model: per call, the GPU idle it causes: the time in the call after the GPU ran
    out of queued work, plus the refill bubble until the next GPU activity (TQ202's
    bubble): `Σ (end − max(start, reach) + next − max(end, reach))` over the calls, `reach`
    the end of the GPU work queued before the call returned, `next` the next GPU activity
    (the bubble after a call counted up to the call's own length: a longer one is other
    host work, such as the next batch).
    A call the GPU hides (busy all along, work still queued) saves nothing. Calls below
    `min_saving_us` in total per group are not reported.

    Not seen: allocator churn without driver calls (block splitting and coalescing inside
    the cache, `cudaMallocAsync` pools), host allocations (`cudaHostAlloc`, pinned
    memory), the memory timeline itself (the trace's `[memory]` events are not read), and
    calls a trace records outside the runtime frame. Churn (warning) is a call that recurs
    — made in the second half of its op's runs (the op by name, module and shapes), or
    outside any op in two steps or more — in a trace where `cudaFree`s recur too: memory
    given back and taken again. Everything else is reported as one-time (info, "warm up
    before profiling"): lazy CUDA / cuBLAS initialization (`cudaFree(0)`), the allocator's
    first fill, or its growth (`cudaMalloc`s with no recurring free).

    ## Why is this bad?
    A `cudaFree` in the step drains the GPU's queue and each `cudaMalloc` costs driver time
    (milliseconds for large segments). One in every step, or a pair per op in a loop of
    varying shapes, can take as long as the step's compute.

    ## Example
    ```python
    for batch in loader:                  # variable sequence lengths: new block sizes
        loss = model(batch).loss
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()          # frees every cached segment each step
    ```

    ## Use instead
    ```bash
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py
    ```
    Remove `torch.cuda.empty_cache()` from the loop, keep shapes stable (pad or bucket
    variable-length batches), and leave headroom so the allocator does not hit OOM and
    retry.

    ## References
    - [PyTorch CUDA memory management (`PYTORCH_CUDA_ALLOC_CONF`, expandable segments)](https://pytorch.org/docs/stable/notes/cuda.html#memory-management)
    - [Understanding CUDA memory usage](https://pytorch.org/docs/stable/torch_cuda_memory.html)
    """
    trace = ctx.trace
    if trace.kernels.height == 0:
        return
    calls = trace.runtime.filter(pl.col("name").str.contains(ALLOC_CALL))
    if trace.steps.height:
        calls = calls.filter(pl.col("step").is_not_null())
    if calls.height == 0:
        return
    calls = calls.filter(setup_phase_of(calls, trace).is_null())
    if calls.height == 0:
        return
    calls = outermost_operator(_with_gpu_idle(calls, trace.kernels), trace.ops)
    calls = calls.with_columns(_one_time(calls, trace).alias("one_time"))
    keys = ["step", "top_name", "top_module", "one_time"]
    groups = calls.group_by(keys, maintain_order=True).agg(
        pl.len().alias("n"),
        pl.col("dur_ns").sum().alias("call_ns"),
        pl.col("idle_ns").sum(),
        pl.col("name").value_counts(sort=True).alias("counts"),
        pl.col("dur_ns").max().alias("longest_ns"),
        pl.col("event"),
        pl.col("top_event").drop_nulls().unique(maintain_order=True),
    )
    for row in groups.iter_rows(named=True):
        saving = row["idle_ns"] / US
        if saving < ctx.options["min_saving_us"]:
            continue
        counts = {c["name"]: c["count"] for c in row["counts"]}
        calls_text = ", ".join(f"{n} {name}" for name, n in counts.items())
        where = f"inside {row['top_name']}" if row["top_name"] else "outside any op"
        call_us = row["call_ns"] / US
        once = row["one_time"]
        yield ctx.finding(
            severity="info" if once else "warning",
            message=(
                f"{calls_text} {where} in {step_text(row['step'])}: {call_us:,.1f} µs in the "
                f"driver (longest {row['longest_ns'] / US:,.1f} µs), GPU idle {saving:,.1f} µs"
                + (
                    "; not recurring with frees: one-time (lazy CUDA/cuBLAS "
                    "initialization, the allocator's first fill or growth)"
                    if once
                    else ""
                )
            ),
            step=row["step"],
            module=row["top_module"],
            ops=row["top_event"],
            time_us=call_us + max(0.0, saving - call_us),
            est_saving_us=saving,
            saving_model=(
                f"GPU idle the calls cause: in the calls after the queue ran dry plus the "
                f"refill bubble after them = {saving:,.1f} µs (of {call_us:,.1f} µs in the "
                "calls); cached blocks need no driver call"
            ),
            fix=(
                "Warm up (run one iteration) before profiling: a first run initializes CUDA "
                "and cuBLAS and fills the allocator's cache. If it recurs in steady state, set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
                if once
                else "Let the caching allocator reuse its blocks: set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, remove "
                "torch.cuda.empty_cache() from the loop, and keep shapes stable (pad or "
                "bucket variable-length batches)."
            ),
            evidence={
                "calls": counts,
                "one_time": once,
                "call_events": row["event"],
                "call_us": call_us,
                "gpu_idle_us": saving,
                "op_names": [row["top_name"]] if row["top_name"] else sorted(counts),
            },
        )


def _one_time(calls: pl.DataFrame, trace: Trace) -> pl.Series:
    """Whether each call belongs to a one-time fill rather than churn. A call recurs when
    it is made in the second half of its op's runs in the trace (the op by name, module and
    input shapes: one layer's op) — outside any op: in two steps or more — and churn is a
    recurring call in a trace where frees recur too (memory given back and taken again).
    Everything else is lazy initialization, the cache's first fill or its growth."""
    key = ["name", "module", "_shapes"]
    ops = trace.ops.select(
        pl.col("event").cast(pl.Int64).alias("top_event"),
        "name",
        "module",
        pl.col("shapes").hash().alias("_shapes"),  # one layer's op: its input shapes
        "ts_ns",
    )
    runs = ops.with_columns(
        pl.col("ts_ns").rank("ordinal").over(key).alias("_run"),
        pl.len().over(key).alias("_runs"),
    ).select("top_event", *key, "_run", "_runs")
    found = calls.select(pl.col("top_event").cast(pl.Int64), "step", "name").join(
        runs, on="top_event", how="left", maintain_order="left"
    )
    later = (pl.col("_run") > pl.col("_runs") / 2) & (pl.col("_runs") >= 2)
    steps = pl.col("step").n_unique().over(pl.col("top_event").is_null())
    outside = pl.lit(False) if trace.steps.height == 0 else steps >= 2
    recurring = pl.when(pl.col("top_event").is_null()).then(outside).otherwise(later)
    # Churn gives memory back and takes it again: without a recurring free, later
    # `cudaMalloc`s are the cache still growing (more live tensors), not churn.
    frees = recurring & pl.col("name").str.contains("Free")
    return found.select(~(recurring & frees.any())).to_series()


def _with_gpu_idle(calls: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """`calls` plus `idle_ns`: the GPU idle time each call causes — inside the call after
    the GPU work queued before its end ran out (`reach`), and after it until the next GPU
    activity (0 when the GPU had work queued past the call)."""
    gpu = kernels.select("ts_ns", "end_ns").sort("ts_ns")
    reach = gpu.with_columns(pl.col("end_ns").cum_max().alias("reach")).select(
        pl.col("ts_ns").alias("_t"), "reach"
    )
    starts = gpu.select(pl.col("ts_ns").alias("_t"), pl.col("ts_ns").alias("next_ts"))
    probe = calls.sort("end_ns").with_columns(pl.col("end_ns").alias("_t"))
    probe = probe.join_asof(reach, on="_t", strategy="backward")
    probe = probe.join_asof(starts, on="_t", strategy="forward")
    reach_ns = pl.col("reach").fill_null(0)
    inside = (pl.col("end_ns") - pl.max_horizontal(pl.col("ts_ns"), reach_ns)).clip(0)
    after = (pl.col("next_ts") - pl.max_horizontal(pl.col("end_ns"), reach_ns)).clip(0)
    # The refill bubble is the call's only as long as the call: a longer one is other host
    # work (the next batch, the next step's start), not the allocator's.
    after = pl.min_horizontal(after.fill_null(0), pl.col("dur_ns"))
    return probe.with_columns((inside + after).alias("idle_ns")).drop("_t")


RULE = allocator_churn
