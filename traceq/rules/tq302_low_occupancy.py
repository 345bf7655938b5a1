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
# Communication kernels use few blocks on purpose (they wait on the network or on peer
# GPUs, not on SMs): NCCL/RCCL, NVLS multimem, the custom all-reduces of vLLM, SGLang
# and TensorRT-LLM, and expert-parallel dispatch/combine (DeepEP's `internode::` and
# `intranode::` kernels, NVSHMEM, pplx). The decoder marks NCCL's as `comm`; the others
# only their names show.
COMM_KERNEL = (
    r"(?i)(^|[\s:])(nccl|rccl)|ncclDevKernel|multimem_all_reduce|cross_device_reduce|"
    r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|one_?shot|two_?shot|lamport|"
    r"\b(internode|intranode|internode_ll)::|deep_?ep|nvshmem|pplx|mscclpp"
)
# A launch over this many times the median of its configuration is a stall (preemption, a
# peer, the profiler), not the kernel's work: it counts as the median.
STALL_FACTOR = 4.0
# With no kernel shorter than this in the trace to measure it, the fixed cost of a launch
# on the GPU timeline (block scheduling, ramp-up, drain) of recent NVIDIA/AMD parts.
DEFAULT_FLOOR_US = 2.0


@rule(
    "TQ302",
    "low-occupancy",
    "info",
    defaults={
        "min_share": 0.05,
        "max_grid_fill": 0.5,
        "max_occupancy_pct": 25.0,
        "min_kernel_us": 10.0,
    },
)
def low_occupancy(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds kernels that take at least `min_share` of the GPU's kernel time and leave it
    under-used, by the profiler's own numbers (`grid`, `est. achieved occupancy %`).
    Launches are grouped by kernel name and grid size (one launch configuration):

    - **small grid**: at least 2 and at most `max_grid_fill` × as many thread blocks as the
      GPU has SMs (`numSms`), so whole SMs sit idle for the kernel's duration;
    - **low occupancy**: a full grid (at least one block per SM) whose time-weighted
      achieved occupancy is below `max_occupancy_pct`, from registers, shared memory or
      block size. Not reported for vendor GEMM/convolution kernels (cuBLAS, CUTLASS,
      cuDNN, hipBLASLt) and flash attention, which run at low occupancy by design.

    A configuration is judged by its typical launch, never by one: "latency-bound" is decided
    on the median launch, and a launch over 4× the median (stalled by preemption, a peer or
    the profiler: 2.4 ms among 9 µs ones) counts as the median in its share and saving, so
    it neither reports a kernel nor sets its saving.

    Never reported: configurations whose median launch is under `min_kernel_us`
    (latency-bound: launch and ramp-up set their time, not the SMs they fill), 1-block
    kernels (a fill, the last pass of a reduction, a scalar update: serial by
    construction), and communication kernels (NCCL/RCCL `nccl*`, `ncclDevKernel_*`,
    `multimem_all_reduce`, custom all-reduces such as `cross_device_reduce`, DeepEP's
    `internode::` / `intranode::` dispatch and combine, NVSHMEM), which limit their SMs by
    design: they wait on the network or on peer GPUs.

    Savings model (small grid): a grid of `B` blocks on `S` SMs runs one partial wave,
    `B / S` of a full one. Spread evenly over all SMs (split-K, a smaller tile, a batched
    launch) the same work takes `B / S` of the time the SMs now spend on it, and the
    launch's fixed cost stays:
    `saving = Σ over launches (duration − floor) × (1 − B / S)` (stalls at the median),
    where `floor` is the
    shortest kernel on the trace's GPU timeline (the fixed cost no launch avoids; 2 µs when
    the trace rounds every kernel to 0). That is the tail a full-occupancy launch would
    cut, an upper bound: a kernel bound by one SM's bandwidth share gains it all, one that
    already saturates DRAM from `B` SMs gains nothing.

    Low occupancy gets **no** estimate (saving 0): fewer resident warps slow a kernel only
    when it is latency-bound, which the trace cannot tell; Nsight Compute's stall reasons
    can. The finding says where to look.

    CPU-only traces have no kernels: no finding. Not seen: kernels without a `grid`
    argument (old Kineto, some ROCm traces) are judged on occupancy alone; kernels a CUDA
    graph replays are seen only where the trace records them; a communication kernel named
    like none of the above is taken for compute.

    ## Why is this bad?
    A GPU hides memory latency by switching between resident warps. With few warps per SM,
    or SMs without any block, the hardware waits instead of working: the kernel takes as
    long as a much larger one would.

    ## Example
    ```python
    # a layer norm over (8, 65536) launches 8 blocks (one per row) on a 132-SM H100
    y = F.layer_norm(x, x.shape[-1:])
    ```

    ## Use instead
    Batch the work (larger or fused ops), choose a block size and tile that fill the GPU
    (`triton.Config(num_warps=...)`, split-K for skinny GEMMs, a split-row norm), or cut
    register and shared-memory use per thread.

    ## References
    - [CUDA C++ Best Practices: occupancy](https://docs.nvidia.com/cuda/cuda-c-best-practices-guide/index.html#occupancy)
    - [NVIDIA: wave quantization](https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html#wave-quant)
    - [Kineto kernel args: est. achieved occupancy](https://github.com/pytorch/kineto/blob/main/libkineto/src/output_json.cpp)
    """
    kernels = ctx.kernel_names.filter(
        (pl.col("kind") == "kernel")
        & (pl.col("category") != "comm")
        & ~pl.col("name").str.contains(COMM_KERNEL)
    )
    all_kernels = ctx.kernel_names.filter(pl.col("kind") == "kernel")
    total_ns = all_kernels["dur_ns"].sum()
    if kernels.height == 0 or not total_ns:
        return
    shortest = all_kernels["dur_ns"].filter(all_kernels["dur_ns"] > 0).min()
    floor_us = shortest / US if shortest is not None else DEFAULT_FLOOR_US
    sms = ctx.device.num_sms
    grid = pl.col("grid")
    blocks = pl.when(grid.is_not_null()).then(
        grid.list.get(0, null_on_oob=True).fill_null(1)
        * grid.list.get(1, null_on_oob=True).fill_null(1)
        * grid.list.get(2, null_on_oob=True).fill_null(1)
    )
    valid_occ = pl.when(pl.col("occupancy_pct") > 0).then(pl.col("occupancy_pct"))
    # A launch configuration is judged by its typical launch, never by one: a launch
    # stalled by preemption, the profiler or a peer (over `STALL_FACTOR` × the median of
    # its configuration) counts as the median; the median decides "latency-bound".
    typical = pl.col("dur_ns").median()
    config_median = pl.col("dur_ns").median().over("name", "blocks")
    clipped = (
        pl.when(pl.col("dur_ns") > STALL_FACTOR * config_median)
        .then(config_median)
        .otherwise(pl.col("dur_ns"))
    )
    weighted = (valid_occ * pl.col("dur_ns")).sum() / pl.col("dur_ns").filter(
        pl.col("occupancy_pct") > 0
    ).sum()
    floor_ns = floor_us * US
    by_launch = (
        kernels.with_columns(blocks.alias("blocks"))
        .with_columns(clipped.alias("typical_ns"))
        .group_by("name", "blocks")
        .agg(
            pl.col("dur_ns").sum().alias("ns"),
            pl.len().alias("n"),
            typical.alias("median"),
            weighted.alias("occupancy"),
            pl.col("typical_ns").sum(),
            (pl.col("typical_ns") - floor_ns).clip(0).sum().alias("above_floor_ns"),
            pl.col("library").first(),
            pl.col("registers_per_thread").median().alias("registers"),
            pl.col("shared_memory").median().alias("shared_memory"),
            pl.col("block").first(),
            pl.col("grid").first(),
            pl.col("event"),
            pl.col("op_event").drop_nulls().unique(maintain_order=True),
            pl.col("module").drop_nulls().mode().sort().first(),  # ties: the same every run
        )
        .with_columns(
            (pl.col("ns") / total_ns).alias("share"),
            (pl.col("typical_ns") / total_ns).alias("typical_share"),
            (pl.col("ns") / pl.col("n")).alias("mean"),
        )
        .filter(
            (pl.col("typical_share") >= ctx.options["min_share"])
            & (pl.col("median") >= ctx.options["min_kernel_us"] * US)
            & (pl.col("blocks").is_null() | (pl.col("blocks") > 1))
        )
        .sort("ns", "name", descending=[True, False])
    )
    for row in by_launch.iter_rows(named=True):
        finding = _small_grid(ctx, row, sms, floor_us) or _low_occupancy(ctx, row, sms)
        if finding is not None:
            yield finding


def _small_grid(ctx: Context, row: dict, sms: int | None, floor_us: float) -> Finding | None:
    if sms is None or row["blocks"] is None or row["blocks"] > sms * ctx.options["max_grid_fill"]:
        return None
    idle = 1.0 - row["blocks"] / sms
    above_floor_us = row["above_floor_ns"] / US
    return _finding(
        ctx,
        row,
        sms,
        cause=f"{row['blocks']} blocks on {sms} SMs",
        saving=above_floor_us * idle,
        model=(
            f"Σ (duration − {floor_us:.1f} µs floor) = {above_floor_us:,.1f} µs (a launch over "
            f"{STALL_FACTOR:g}× the median {row['median'] / US:,.1f} µs counted at the median) × "
            f"(1 − {row['blocks']} blocks / {sms} SMs): the partial wave's idle SMs, if the "
            "work spread over all of them"
        ),
        fix=(
            "Give the kernel at least one block per SM: batch or fuse the work, use a "
            "smaller tile or split-K for skinny GEMMs, split each row of a norm."
        ),
    )


def _low_occupancy(ctx: Context, row: dict, sms: int | None) -> Finding | None:
    occupancy = row["occupancy"]
    full_grid = sms is None or row["blocks"] is None or row["blocks"] >= sms
    if (
        occupancy is None
        or not occupancy < ctx.options["max_occupancy_pct"]  # NaN: no launch recorded it
        or row["library"] in TUNED_LIBRARIES
        or not full_grid
    ):
        return None
    return _finding(
        ctx,
        row,
        sms,
        cause=f"{occupancy:.0f}% achieved occupancy",
        saving=0.0,
        model=(
            "not estimated: fewer resident warps cost time only in a latency-bound kernel, "
            "which the trace cannot tell (check Nsight Compute's warp stall reasons)"
        ),
        fix=(
            "If Nsight Compute shows the kernel stalled on memory latency, raise resident "
            "warps: fewer registers per thread (__launch_bounds__, num_warps/num_stages in "
            "Triton), less shared memory per block, or larger blocks."
        ),
    )


def _finding(
    ctx: Context, row: dict, sms: int | None, *, cause: str, saving: float, model: str, fix: str
) -> Finding:
    time_us = row["ns"] / US
    return ctx.finding(
        message=(
            f"{_short(row['name'])} takes {row['share']:.0%} of GPU kernel time "
            f"({time_us:,.1f} µs over {row['n']} launches, median {row['median'] / US:,.1f} µs) "
            f"with {cause}"
        ),
        module=row["module"],
        ops=row["op_event"],
        kernels=row["event"],
        time_us=time_us,
        est_saving_us=min(saving, time_us),
        saving_model=model,
        fix=fix,
        evidence={
            "kernel": row["name"],
            "share": row["share"],
            "mean_us": row["mean"] / US,
            "median_us": row["median"] / US,
            "occupancy_pct": row["occupancy"],
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
