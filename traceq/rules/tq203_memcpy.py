"""TQ203 memcpy: host↔device copies from pageable memory, and many small copies."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.common import US, outermost_operator
from traceq.rules.finding import Finding

HOST_COPY = r"^Memcpy (HtoD|DtoH) \((\w+) -> (\w+)\)"
# Practical pinned-copy bandwidth by PCIe generation, used when the trace holds no pinned
# copy large enough to measure it: PCIe 3.0 x16 ≈ 12 GB/s, 4.0 ≈ 24, 5.0 ≈ 48.
PCIE_GBS_BY_CC = ((9, 0, 48.0), (8, 0, 24.0), (0, 0, 12.0))
MEASURE_MIN_BYTES = 1 << 20


@rule(
    "TQ203",
    "memcpy",
    "warning",
    defaults={
        "min_saving_us": 10.0,
        "small_bytes": 65536,
        "min_small_copies": 16,
        "pinned_gbs": 0.0,
    },
)
def memcpy(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds host↔device copies that move host memory the slow way: from or to *pageable*
    (not pinned) memory, and many small copies of one kind in one step that could be one.

    Copies are grouped per step, direction, memory kind and the op that issued them (the
    outermost operator, e.g. `aten::to`), one finding per group.

    Savings model:
    - pageable: `Σ min(CPU time in the copy call, GPU copy time)`. The driver stages a
      pageable copy through its own pinned buffer and the host blocks for the copy itself;
      from pinned memory with `non_blocking=True` it returns at once and the copy overlaps
      compute. (Waiting for *earlier* GPU work before a device→pageable copy is a host sync:
      TQ202 reports that part.)
    - many small copies (`min_small_copies` or more below `small_bytes` each, counted
      without the group's larger copies): `Σ small copy time − (one small copy's median
      time + Σ their bytes / pinned bandwidth)`, at most their own time: small copies cost
      their fixed latency, so one batched copy pays it once. A group's larger copies are
      neither counted nor saved (a 6 MB copy is bandwidth-bound). The pinned bandwidth is
      the median achieved by this trace's pinned copies of 1 MiB or more in that
      direction; without any, `pinned_gbs` if set, else the PCIe generation of the GPU
      (12 / 24 / 48 GB/s for compute capability < 8, 8.x, ≥ 9).

    CPU-only traces have no host↔device copies: the rule is silent there. Not seen:
    device↔device and peer copies, copies a CUDA graph replays (no runtime call), and
    small copies spread over several ops or steps (each group is one op in one step).

    ## Why is this bad?
    A pageable copy is synchronous for the host and runs at a fraction of the bus bandwidth,
    so input pipelines stall the step. Tiny copies (one scalar at a time) pay ~µs of fixed
    cost each and serialize on the copy engine.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64)
    for x, y in loader:
        x, y = x.cuda(), y.cuda()  # pageable -> device, host blocks
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=64, pin_memory=True)
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    ```
    Batch small tensors into one buffer (`torch.cat` / a flat buffer) before copying.

    ## References
    - [How to optimize data transfers in CUDA](https://developer.nvidia.com/blog/how-optimize-data-transfers-cuda-cc/)
    - [PyTorch: pin_memory and non_blocking](https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html)
    """
    opts = ctx.options
    copies = ctx.trace.kernels.filter(
        (pl.col("kind") == "memcpy") & pl.col("name").str.contains(HOST_COPY)
    )
    if copies.height == 0:
        return
    parts = pl.col("name").str.extract_groups(HOST_COPY)
    copies = copies.with_columns(
        parts.struct.field("1").alias("direction"),
        pl.when(parts.struct.field("1") == "HtoD")
        .then(parts.struct.field("2"))
        .otherwise(parts.struct.field("3"))
        .alias("host_memory"),
        pl.col("bytes").fill_null(0),
    )
    calls = ctx.trace.runtime.select(
        pl.col("event").alias("runtime_event"), pl.col("dur_ns").alias("call_ns")
    )
    copies = copies.join(calls, on="runtime_event", how="left", maintain_order="left")
    copies = outermost_operator(copies, ctx.trace.ops)
    bandwidth = _pinned_bandwidth(ctx, copies)
    keys = ["step", "direction", "host_memory", "top_name", "top_module"]
    small = pl.col("bytes") < opts["small_bytes"]
    groups = copies.group_by(keys, maintain_order=True).agg(
        pl.len().alias("n"),
        pl.col("bytes").sum().alias("bytes"),
        pl.col("bytes").median().alias("median_bytes"),
        pl.col("dur_ns").sum().alias("gpu_ns"),
        pl.col("dur_ns").median().alias("median_ns"),
        pl.min_horizontal(pl.col("call_ns").fill_null(0), pl.col("dur_ns"))
        .sum()
        .alias("blocked_ns"),
        pl.col("event"),
        pl.col("top_event").drop_nulls().unique(maintain_order=True),
        pl.col("name").first().alias("copy_name"),
        # The small copies alone: a group's large copies are not what batching saves.
        small.sum().alias("small_n"),
        pl.col("bytes").filter(small).sum().alias("small_bytes"),
        pl.col("bytes").filter(small).median().alias("small_median_bytes"),
        pl.col("dur_ns").filter(small).sum().alias("small_gpu_ns"),
        pl.col("dur_ns").filter(small).median().alias("small_median_ns"),
        pl.col("event").filter(small).alias("small_events"),
    )
    for row in groups.iter_rows(named=True):
        finding = _pageable(ctx, row) if row["host_memory"] == "Pageable" else None
        if finding is None and row["small_n"] >= opts["min_small_copies"]:
            finding = _small(ctx, row, bandwidth[row["direction"]])
        if finding is not None and finding.est_saving_us >= opts["min_saving_us"]:
            yield finding


def _pageable(ctx: Context, row: dict) -> Finding:
    blocked = row["blocked_ns"] / US
    where = row["top_name"] or "a copy"
    direction = "host→device" if row["direction"] == "HtoD" else "device→host"
    return ctx.finding(
        message=(
            f"{where} copies {_size(row['bytes'])} {direction} through pageable memory in "
            f"{row['n']} cop{'y' if row['n'] == 1 else 'ies'}: host blocked {blocked:,.1f} µs"
        ),
        step=row["step"],
        module=row["top_module"],
        ops=row["top_event"],
        kernels=row["event"],
        time_us=row["gpu_ns"] / US,
        est_saving_us=blocked,
        saving_model=(
            f"Σ min(CPU copy call, GPU copy) = {blocked:,.1f} µs the host waits; a pinned, "
            "non_blocking copy returns at once"
        ),
        fix=(
            "Pin the host buffer (DataLoader(pin_memory=True) or tensor.pin_memory()) and copy "
            "with non_blocking=True."
        ),
        evidence=_evidence(row, "pageable"),
    )


def _small(ctx: Context, row: dict, bandwidth: tuple[float, str]) -> Finding | None:
    """The group's copies under `small_bytes` only: a 6 MB copy among them is not a small
    copy, and batching saves only the small ones' fixed costs (at most their own time)."""
    gbs, source = bandwidth
    n, nbytes = row["small_n"], row["small_bytes"]
    batched_us = row["small_median_ns"] / US + nbytes / (gbs * 1e3)
    total_us = row["small_gpu_ns"] / US
    saving = min(total_us, max(0.0, total_us - batched_us))
    direction = "host→device" if row["direction"] == "HtoD" else "device→host"
    larger = row["n"] - n
    besides = f" (besides {larger} larger ones)" if larger else ""
    return ctx.finding(
        severity="info",
        message=(
            f"{n} small {direction} copies (median {_size(row['small_median_bytes'])}, each "
            f"under {_size(ctx.options['small_bytes'])}){besides} from "
            f"{row['top_name'] or 'copies'} take {total_us:,.1f} µs; one batched copy would "
            f"take ~{batched_us:,.1f} µs"
        ),
        step=row["step"],
        module=row["top_module"],
        ops=row["top_event"],
        kernels=row["small_events"],
        time_us=total_us,
        est_saving_us=saving,
        saving_model=(
            f"{total_us:,.1f} µs of {n} copies under {_size(ctx.options['small_bytes'])} − "
            f"(median copy {row['small_median_ns'] / US:,.1f} µs + {_size(nbytes)} at "
            f"{gbs:.1f} GB/s, {source})"
        ),
        fix=(
            "Gather the small tensors into one buffer and copy it once (or keep them on the "
            "device)."
        ),
        evidence={
            **_evidence(row, "small"),
            "copies": n,
            "bytes": nbytes,
            "median_bytes": row["small_median_bytes"],
            "gpu_us": total_us,
            "larger_copies": larger,
        },
    )


def _pinned_bandwidth(ctx: Context, copies: pl.DataFrame) -> dict[str, tuple[float, str]]:
    """Per direction: the median bandwidth of large pinned copies here, else the default."""
    configured = float(ctx.options["pinned_gbs"])
    if configured > 0:
        default = (configured, "configured")
    else:
        cc = ctx.device.compute_capability or (0, 0)
        gbs = next(g for major, minor, g in PCIE_GBS_BY_CC if cc >= (major, minor))
        default = (gbs, "PCIe default for the GPU generation")
    measured = (
        copies.filter(
            (pl.col("host_memory") == "Pinned")
            & (pl.col("bytes") >= MEASURE_MIN_BYTES)
            & (pl.col("dur_ns") > 0)
        )
        .group_by("direction")
        .agg((pl.col("bytes") / pl.col("dur_ns")).median().alias("gbs"), pl.len())
    )
    found = {d: (g, f"median of {n} pinned copies here") for d, g, n in measured.iter_rows()}
    return {d: found.get(d, default) for d in ("HtoD", "DtoH")}


def _evidence(row: dict, kind: str) -> dict:
    """What both kinds of finding record; `variant` (kind and direction) keeps their
    identities apart: a pageable and a small-copies finding on one op, or uploads and
    downloads of one op, are different findings (`Finding.key`)."""
    return {
        "variant": f"{kind} {row['direction']}",
        "copy_name": row["copy_name"],
        "copies": row["n"],
        "bytes": row["bytes"],
        "median_bytes": row["median_bytes"],
        "gpu_us": row["gpu_ns"] / US,
        "host_blocked_us": row["blocked_ns"] / US,
        "op_names": [row["top_name"]] if row["top_name"] else [],
    }


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes:,.0f} B"


RULE = memcpy
