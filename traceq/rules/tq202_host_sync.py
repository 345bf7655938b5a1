"""TQ202 host-sync: the host waits for the GPU, draining the launch queue."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.relations.phases import setup_phase_of
from traceq.rules.base import Context, rule
from traceq.rules.common import US, in_ranges, optimizer_ranges, outermost_operator
from traceq.rules.finding import Finding

SYNC_CALL = (
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|Memcpy2D|"
    r"Memcpy3D|MemcpyFromSymbol|MemcpyToSymbol|MemcpyDtoH|MemcpyHtoD|MemcpyWithStream)$|"
    r"^cu(CtxSynchronize|StreamSynchronize|EventSynchronize|MemcpyDtoH(_v2)?|MemcpyHtoD(_v2)?)$"
)
PAGEABLE_DTOH = r"^Memcpy DtoH \(Device -> Pageable\)"
SCALAR_OPS = ("aten::item", "aten::_local_scalar_dense")
BRANCH_OPS = ("aten::is_nonzero",)
"""`bool(t)`: what Python runs for `if t:`, `while t:`, `and`/`or` on a tensor."""


@rule(
    "TQ202",
    "host-sync",
    "warning",
    defaults={"min_saving_us": 5.0, "include_outside_steps": False},
)
def host_sync(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds the points where the CPU stops to wait for the GPU: `cudaDeviceSynchronize`,
    `cudaStreamSynchronize`, `cudaEventSynchronize`, synchronous `cudaMemcpy`, copies into
    pageable host memory (synchronous even when issued as `cudaMemcpyAsync`), and the ops
    that cause them (`aten::item` / `_local_scalar_dense`, `.cpu()`, `.tolist()`, `print`
    of a CUDA tensor, data-dependent shapes such as `nonzero`).

    Each sync is attributed to the top-level op it ran under (e.g. `aten::item`), so it
    points at the line of Python to change. Syncs outside profiler steps (the harness's own
    `synchronize()` around timing) are left out unless `include_outside_steps = true`, and
    so are syncs in setup phases (`traceq.relations.phases`): CUDA-graph capture (vLLM's
    `capture_model`, SGLang's `cuda_graph_runner.capture`, `torch.cuda.graph`), compilation
    (`async_compile.wait`, Triton's compiler), an engine's warm-up and the profiler's own
    stop: each runs once, with no steady-state work queued behind it. ROCm's blocking
    `hipMemcpyWithStream` is a sync like `hipMemcpy`.

    Savings model: `min(wait, bubble)`, where *wait* is how long the CPU was blocked in the
    sync call and *bubble* is how long the GPU then sat idle until the CPU had launched its
    next kernel (the queue refill). Without the sync the CPU would have run ahead (saving
    the wait) while the GPU kept working (saving the bubble); the step shortens by the
    smaller of the two. Syncs below `min_saving_us` are not reported, nor a trailing sync
    with no GPU work after it.

    On CPU-only traces the same ops (`aten::item`, `_local_scalar_dense`) are reported as
    info: they cost little there, but each becomes a full GPU drain once the model runs on a
    GPU. Their CPU time is the saving shown. Reads inside `Optimizer.step` are left out:
    `torch.optim` keeps its step counters on the host (`capturable=False`, the default), so
    Adam's per-tensor `step.item()` reads host memory on a GPU too and never drains it.

    ## Why is this bad?
    The CPU normally runs ahead of the GPU, queueing launches. A sync empties that queue: the
    GPU finishes, idles while the CPU resumes and launches again, and any overlap of CPU
    overhead with GPU work is lost for that step.

    ## Example
    ```python
    loss = criterion(model(x), y)
    total += loss.item()  # waits for the whole forward pass every step
    ```

    ## Use instead
    ```python
    total += loss.detach()  # stays on the GPU; read it once, at the end
    ```
    Use `non_blocking=True` copies from pinned memory, and keep shapes static (masks instead
    of `nonzero`/boolean indexing) in the hot loop.

    ## References
    - [PyTorch performance tuning guide: avoid unnecessary CPU-GPU synchronization](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html)
    - [`torch.cuda.set_sync_debug_mode`](https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)
    """
    trace = ctx.trace
    if trace.kernels.height == 0:
        yield from _cpu_scalar_reads(ctx)
        return
    # A copy into pageable host memory is synchronous too: the call returns only after the
    # GPU has finished everything queued before it, then the copy.
    to_pageable = trace.kernels.filter(
        pl.col("name").str.contains(PAGEABLE_DTOH) & pl.col("runtime_event").is_not_null()
    )["runtime_event"]
    calls = trace.runtime.filter(
        pl.col("name").str.contains(SYNC_CALL) | pl.col("event").is_in(to_pageable.implode())
    )
    if not ctx.options["include_outside_steps"] and trace.steps.height:
        calls = calls.filter(pl.col("step").is_not_null())
    calls = calls.filter(setup_phase_of(calls, trace).is_null())
    if calls.height == 0:
        return
    calls = _with_bubble(calls, trace.kernels)
    calls = outermost_operator(calls, trace.ops)
    min_saving = ctx.options["min_saving_us"]
    for row in calls.sort("ts_ns").iter_rows(named=True):
        if row["next_ts"] is None:
            continue  # nothing ran after it: the drain cost nothing measurable
        wait_us = row["dur_ns"] / US
        bubble_us = max(0, row["next_ts"] - max(row["end_ns"], row["reach"] or 0)) / US
        saving = min(wait_us, bubble_us)
        if saving < min_saving:
            continue
        culprit = row["top_name"] or row["name"]
        ops = [e for e in (row["top_event"], row["op_event"]) if e is not None]
        yield ctx.finding(
            message=(
                f"{_who(row['top_name'], row['name'])}: CPU blocked "
                f"{wait_us:,.1f} µs, then GPU idle {bubble_us:,.1f} µs until the next launch"
            ),
            step=row["step"],
            module=row["top_module"],
            ops=list(dict.fromkeys(ops)),
            time_us=wait_us + bubble_us,
            est_saving_us=saving,
            saving_model=(
                f"min(CPU wait {wait_us:,.1f} µs, GPU refill bubble {bubble_us:,.1f} µs)"
            ),
            fix=_fix(culprit),
            evidence={
                "sync_call": row["name"],
                "sync_event": row["event"],
                "innermost_op": row["op_name"],
                "op_names": [culprit],
                "wait_us": wait_us,
                "bubble_us": bubble_us,
            },
        )


def _cpu_scalar_reads(ctx: Context) -> Iterator[Finding]:
    """CPU-only traces: scalar reads that would be syncs on a GPU (outermost op only)."""
    ops = ctx.trace.ops
    reads = ops.filter(pl.col("name").is_in(SCALAR_OPS))
    if reads.height == 0:
        return
    parents = ops.select(pl.col("event").alias("parent"), pl.col("name").alias("_parent_name"))
    reads = reads.join(parents, on="parent", how="left").filter(
        pl.col("_parent_name").is_null() | ~pl.col("_parent_name").is_in(SCALAR_OPS)
    )
    updates = optimizer_ranges(ctx.trace, "step")
    if updates.height:  # host-side step counters (see the docstring)
        counters = in_ranges(reads.select("event", "tid", "ts_ns"), updates)["event"]
        reads = reads.filter(~pl.col("event").is_in(counters.implode()))
    for row in reads.sort("ts_ns").iter_rows(named=True):
        cost = row["dur_ns"] / US
        branch = row["_parent_name"] in BRANCH_OPS  # `if t:` runs is_nonzero -> item
        culprit = row["_parent_name"] if branch else row["name"]
        yield ctx.finding(
            severity="info",
            message=(
                f"{culprit} reads a tensor value on the host ({cost:,.1f} µs here); on a "
                "GPU this waits for every queued kernel"
            ),
            step=row["step"],
            module=row["module"],
            ops=[row["event"]],
            time_us=cost,
            est_saving_us=cost,
            saving_model=f"measured CPU time of the op ({cost:,.1f} µs); on a GPU add the drain",
            fix=_fix(culprit),
            evidence={"op_names": [row["name"]], "called_from": row["_parent_name"]},
        )


def _with_bubble(calls: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """Add `next_ts` (first GPU activity starting after the sync returned) and `reach`
    (latest end of GPU work started before then) to each sync call."""
    gpu = kernels.select("ts_ns", "end_ns").sort("ts_ns")
    reach = gpu.with_columns(pl.col("end_ns").cum_max().alias("reach")).select(
        pl.col("ts_ns").alias("_t"), "reach"
    )
    starts = gpu.select(pl.col("ts_ns").alias("_t"), pl.col("ts_ns").alias("next_ts"))
    probe = calls.sort("end_ns").with_columns(pl.col("end_ns").alias("_t"))
    probe = probe.join_asof(reach, on="_t", strategy="backward")
    probe = probe.join_asof(starts, on="_t", strategy="forward")
    return probe.drop("_t")


def _who(op: str | None, call: str) -> str:
    return f"{op} synchronizes with the GPU ({call})" if op else f"explicit {call} in the step"


def _fix(culprit: str) -> str:
    if culprit in SCALAR_OPS:
        return (
            "A Python number is read from a device tensor (`.item()`, `float(t)`, `int(t)`, "
            "`.tolist()`): keep the value on the device (accumulate tensors, read once at the "
            "end), or record it with a non_blocking copy to pinned memory and read it a step "
            "later."
        )
    if culprit in BRANCH_OPS:
        return (
            "A Python `if`/`while`/`bool()`/`and`/`or` on a device tensor reads its value: "
            "branch on the device instead (`torch.where`, a mask), or test a value computed on "
            "the host; `torch.cuda.set_sync_debug_mode('warn')` points at the line."
        )
    if culprit in ("aten::to", "aten::copy_", "aten::_to_copy"):
        return (
            "Copy device→host with non_blocking=True into pinned memory and read it later, or "
            "keep the tensor on the device."
        )
    if culprit in ("aten::nonzero", "aten::masked_select", "aten::unique"):
        return "Avoid data-dependent shapes in the hot loop: use masks or torch.where."
    return (
        "Remove explicit torch.cuda.synchronize() from the step; use CUDA events "
        "(torch.cuda.Event(enable_timing=True)) to time without draining the queue."
    )


RULE = host_sync
