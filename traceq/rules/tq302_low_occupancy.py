"""TQ302 low-occupancy: heavy kernels that keep most of the GPU's SMs or warp slots empty."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.common import US
from traceq.rules.finding import Finding

# Vendor GEMM/conv kernels pick low occupancy on purpose (large register tiles hide latency
# with instruction-level parallelism); only an under-filled grid is flagged for them.
TUNED_LIBRARIES = (
    "cublas",
    "cublasLt",
    "cutlass",
    "cudnn",
    "hipblaslt",
    "rocblas",
    "flash-attn",
)


@rule(
    "TQ302",
    "low-occupancy",
    "info",
    defaults={
        "min_share": 0.05,
        "max_grid_fill": 0.5,
        "max_occupancy_pct": 25.0,
        "target_occupancy_pct": 50.0,
    },
)
def low_occupancy(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds kernels that take at least `min_share` of the GPU's kernel time and leave it
    under-used, by the profiler's own numbers (`grid`, `est. achieved occupancy %`):

    - **small grid**: at most `max_grid_fill` × as many thread blocks as the GPU has SMs
      (`numSms`), so whole SMs sit idle for the kernel's duration;
    - **low occupancy**: a time-weighted achieved occupancy below `max_occupancy_pct`,
      from registers, shared memory or block size. Not reported for vendor GEMM/convolution
      kernels (cuBLAS, CUTLASS, cuDNN, hipBLASLt) and flash attention, which run at low
      occupancy by design.

    Kernels are grouped by name over the whole trace. Communication kernels (NCCL) are
    left out: they use few blocks on purpose.

    Savings model: small grid — the kernel's time × `(1 − blocks / SMs)`, the share of SMs
    it leaves idle (an upper bound reached if the work spreads evenly over all SMs, e.g. by
    split-K or a smaller tile). Low occupancy — the kernel's time × `(1 − occupancy /
    target_occupancy_pct)`: the time a latency-bound kernel would lose if its resident
    warps rose to the target; an upper bound, since a kernel limited by bandwidth or ILP
    gains less.

    CPU-only traces have no kernels: no finding.

    ## Why is this bad?
    A GPU hides memory latency by switching between resident warps. With few warps per SM,
    or SMs without any block, the hardware waits instead of working: the kernel takes as
    long as a much larger one would.

    ## Example
    ```python
    # a reduction over a (8, 4096) tensor launches 8 blocks on a 108-SM A100
    y = x.sum(dim=1)
    ```

    ## Use instead
    Batch the work (larger or fused ops), choose a block size and tile that fill the GPU
    (`triton.Config(num_warps=...)`, split-K for skinny GEMMs), or cut register and
    shared-memory use per thread.

    ## References
    - [CUDA C++ Best Practices: occupancy](https://docs.nvidia.com/cuda/cuda-c-best-practices-guide/index.html#occupancy)
    - [Kineto kernel args: est. achieved occupancy](https://github.com/pytorch/kineto/blob/main/libkineto/src/output_json.cpp)
    """
    kernels = ctx.kernel_names.filter((pl.col("kind") == "kernel") & (pl.col("category") != "comm"))
    if kernels.height == 0:
        return
    total_ns = kernels["dur_ns"].sum()
    if not total_ns:
        return
    sms = ctx.device.num_sms
    grid = pl.col("grid")
    blocks = pl.when(grid.is_not_null()).then(
        grid.list.get(0, null_on_oob=True).fill_null(1)
        * grid.list.get(1, null_on_oob=True).fill_null(1)
        * grid.list.get(2, null_on_oob=True).fill_null(1)
    )
    valid_occ = pl.when(pl.col("occupancy_pct") > 0).then(pl.col("occupancy_pct"))
    weighted = (valid_occ * pl.col("dur_ns")).sum() / pl.col("dur_ns").filter(
        pl.col("occupancy_pct") > 0
    ).sum()
    by_name = (
        kernels.with_columns(blocks.alias("_blocks"))
        .group_by("name")
        .agg(
            pl.col("dur_ns").sum().alias("ns"),
            pl.len().alias("n"),
            weighted.alias("occupancy"),
            pl.col("_blocks").median().alias("blocks"),
            pl.col("library").first(),
            pl.col("registers_per_thread").median().alias("registers"),
            pl.col("shared_memory").median().alias("shared_memory"),
            pl.col("block").first(),
            pl.col("grid").first(),
            pl.col("event"),
            pl.col("op_event").drop_nulls().unique(maintain_order=True),
            pl.col("module").drop_nulls().mode().sort().first(),  # ties: the same every run
        )
        .with_columns((pl.col("ns") / total_ns).alias("share"))
        .filter(pl.col("share") >= ctx.options["min_share"])
        .sort("ns", descending=True)
    )
    target = float(ctx.options["target_occupancy_pct"])
    for row in by_name.iter_rows(named=True):
        time_us = row["ns"] / US
        occupancy = row["occupancy"]
        small_grid = (
            sms is not None
            and row["blocks"] is not None
            and row["blocks"] <= sms * ctx.options["max_grid_fill"]
        )
        low = (
            occupancy is not None
            and occupancy < ctx.options["max_occupancy_pct"]
            and row["library"] not in TUNED_LIBRARIES
        )
        if small_grid:
            idle = 1.0 - row["blocks"] / sms
            saving = time_us * idle
            cause = f"{row['blocks']:.0f} blocks on {sms} SMs"
            model = f"{time_us:,.1f} µs × (1 − {row['blocks']:.0f} blocks / {sms} SMs)"
            fix = (
                "Give the kernel at least one block per SM: batch or fuse the work, use a "
                "smaller tile or split-K for skinny GEMMs."
            )
        elif low:
            saving = time_us * max(0.0, 1.0 - occupancy / target)
            cause = f"{occupancy:.0f}% achieved occupancy"
            model = (
                f"{time_us:,.1f} µs × (1 − {occupancy:.0f}% / {target:.0f}% target occupancy), "
                "upper bound for a latency-bound kernel"
            )
            fix = (
                "Raise resident warps: fewer registers per thread (__launch_bounds__, "
                "num_warps/num_stages in Triton), less shared memory per block, or larger "
                "blocks."
            )
        else:
            continue
        yield ctx.finding(
            message=(
                f"{_short(row['name'])} takes {row['share']:.0%} of GPU kernel time "
                f"({time_us:,.1f} µs over {row['n']} launches) with {cause}"
            ),
            module=row["module"],
            ops=row["op_event"],
            kernels=row["event"],
            time_us=time_us,
            est_saving_us=saving,
            saving_model=model,
            fix=fix,
            evidence={
                "kernel": row["name"],
                "share": row["share"],
                "occupancy_pct": occupancy,
                "blocks": row["blocks"],
                "sms": sms,
                "grid": row["grid"],
                "block": row["block"],
                "registers_per_thread": row["registers"],
                "shared_memory": row["shared_memory"],
                "kernel_names": [row["name"]],
                "op_names": [_short(row["name"])],
            },
        )


def _short(name: str) -> str:
    return name if len(name) <= 80 else name[:77] + "..."


RULE = low_occupancy
