"""TQ301 fp32-gemm: full-precision GEMMs on CUDA cores of a GPU that has tensor cores."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.common import US
from traceq.rules.finding import Finding

FP32_BYTES = 4
# A launch over this many times the median of its site is a stall, counted at the median.
STALL_FACTOR = 4.0
# cuDNN kernels that compute a convolution (not its layout transforms or scaling).
CONV_COMPUTE = r"(?i)fprop|dgrad|wgrad|convolve|winograd|scudnn|conv2d|implicit_gemm|_engine<"


@rule(
    "TQ301",
    "fp32-gemm",
    "warning",
    defaults={"max_speedup": 4.0, "min_saving_us": 10.0},
)
def fp32_gemm(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds matrix multiplies and convolutions that run in full fp32 on the CUDA cores (SIMT
    kernels such as `volta_sgemm_128x64_nn`, `ampere_sgemm_*`, `cutlass_*_simt_sgemm_*`,
    cuBLAS's FFMA xmma kernels `sm80_xmma_gemm_f32f32_f32f32_f32_*_ffma`, and cuDNN's
    fp32 convolutions: `volta_scudnn_*`, `cudnn::cnn::wgrad_alg0_engine<float>`, fp32 xmma
    `fprop`/`dgrad`/`wgrad`, winograd, `implicit_convolve_sgemm`) on a GPU whose tensor cores
    could run them as TF32 (Ampere and later) or fp16 (Volta and later; bf16 from Ampere).
    The kernel name decides the precision (decoded: `sgemm` / `f32f32` = fp32 SIMT,
    `s1688gemm` / `tf32f32` = TF32 tensor cores); the GPU's capability comes from
    `deviceProperties`.

    One finding per GEMM or convolution site and step: the op that launched it, its input
    shapes and the kernel name, with all its launches summed. A site is judged by its
    typical launch: a launch over 4× the median of its site (and grid) over the whole
    trace counts as that median, so one launch stalled by preemption or the profiler
    (2.4 ms among 10 µs ones) neither reports a site nor sets its saving.

    Savings model: the tensor-core time is the measured time divided by the ratio of the
    GPU's tensor-core peak (TF32 if it has it and it is at least 2× fp32, else fp16/bf16)
    to its fp32 peak, capped at `max_speedup` (datasheet ratios of 8-16× are not reached by
    real GEMMs), and never below the time to read the operands and write the result once
    at peak DRAM bandwidth when the shapes are known (a small GEMM stays memory-bound).
    The saving is the typical time minus that.

    CPU-only traces and GPUs without tensor cores give no finding. Not seen: fp32 GEMMs in
    kernels whose names say nothing of their precision (Triton / Inductor `mm` templates,
    custom kernels, most hipBLASLt names without a type letter); a TF32 kernel is taken as
    already using the tensor cores; convolutions have no memory floor (their operand
    traffic is not computed).

    ## Why is this bad?
    Tensor cores deliver 2-16× the fp32 throughput. PyTorch keeps fp32 matmuls on CUDA
    cores unless TF32 is allowed or autocast is on, so a model written in fp32 leaves most
    of the GPU idle in its largest kernels.

    ## Example
    ```python
    y = x @ w  # x, w float32 on an A100: runs ampere_sgemm_128x64_nn
    ```

    ## Use instead
    ```python
    torch.set_float32_matmul_precision("high")  # TF32 on Ampere+
    with torch.autocast("cuda", dtype=torch.bfloat16):  # or bf16/fp16 autocast
        y = x @ w
    ```

    ## References
    - [TF32 on Ampere in PyTorch](https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices)
    - [Automatic mixed precision](https://pytorch.org/docs/stable/amp.html)
    """
    device = ctx.device
    if device.kind != "gpu" or not device.tensor_cores or not device.fp32_tflops:
        return
    ratio, target = _tensor_ratio(ctx)
    if ratio <= 1.0:
        return
    speedup = min(ratio, float(ctx.options["max_speedup"]))
    fp32_simt = (pl.col("dtype") == "fp32") & (pl.col("tensor_core") == False)  # noqa: E712
    kernels = ctx.kernel_names.filter(
        fp32_simt
        & (
            (pl.col("category") == "gemm")
            | ((pl.col("category") == "conv") & pl.col("name").str.contains(CONV_COMPUTE))
        )
    )
    if kernels.height == 0:
        return
    ops = ctx.trace.ops.select(
        pl.col("event").alias("op_event"), pl.col("name").alias("op_name"), "shapes"
    )
    site = ["op_name", "shapes", "name", "module"]
    launches = kernels.join(ops, on="op_event", how="left").with_columns(
        pl.col("shapes").cast(pl.List(pl.List(pl.Int64))),
        pl.col("grid").cast(pl.List(pl.String)).list.join("x").alias("_grid"),
    )
    # A site is judged by its typical launch, never by one a stall stretched: a launch over
    # STALL_FACTOR × the median of its site and grid over the whole trace (the grid tells
    # apart the layers of a site whose shapes were not recorded) counts as that median.
    median = pl.col("dur_ns").median().over(*site, "_grid")
    typical = pl.when(pl.col("dur_ns") > STALL_FACTOR * median).then(median)
    launches = launches.with_columns(typical.otherwise(pl.col("dur_ns")).alias("typical_ns"))
    sites = launches.group_by("step", *site, maintain_order=True).agg(
        pl.len().alias("n"),
        pl.col("dur_ns").sum().alias("ns"),
        pl.col("typical_ns").sum(),
        pl.col("dur_ns").median().alias("median_ns"),
        pl.col("event"),
        pl.col("op_event").drop_nulls().unique(maintain_order=True),
        *[pl.col(c).first() for c in DECODED],
    )
    for row in sites.iter_rows(named=True):
        time_us = row["ns"] / US
        typical_us = min(time_us, row["typical_ns"] / US)
        shapes = [list(s) for s in (row["shapes"] or []) if s is not None]
        floor_us, floor_text = _memory_floor(ctx, row["op_name"], shapes, row["n"])
        new_us = max(typical_us / speedup, floor_us)
        saving = max(0.0, typical_us - new_us)
        if saving < ctx.options["min_saving_us"]:
            continue
        conv = row["category"] == "conv"
        what = row["op_name"] or ("convolution" if conv else "GEMM")
        stalled = (
            f" (typical {typical_us:,.1f} µs: a stalled launch counted at its median)"
            if typical_us < time_us - 0.05
            else ""
        )
        yield ctx.finding(
            message=(
                f"{what} runs in fp32 on CUDA cores ({row['name']}, "
                f"{row['n']}×, {time_us:,.1f} µs{stalled}) on {device.name}, whose {target} "
                f"tensor cores are {ratio:.1f}× faster at peak"
            ),
            step=row["step"],
            module=row["module"],
            ops=row["op_event"],
            kernels=row["event"],
            shapes=[s for s in shapes if s],
            dtype="fp32",
            time_us=time_us,
            est_saving_us=saving,
            saving_model=(
                f"{typical_us:,.1f} µs (launches over {STALL_FACTOR:g}× the site's median at "
                "the median) − "
                f"max({typical_us:,.1f} µs / {speedup:.1f} ({target} peak ratio {ratio:.1f}×, "
                f"capped at {ctx.options['max_speedup']:g}×), {floor_text})"
            ),
            fix=_fix(target, conv),
            evidence={
                "kernel": row["name"],
                "decoded": {k: row[k] for k in DECODED if row[k] is not None},
                "launches": row["n"],
                "median_us": row["median_ns"] / US,
                "typical_us": typical_us,
                "op_names": [row["op_name"]] if row["op_name"] else [],
                "tensor_core_peak_ratio": ratio,
            },
        )


DECODED = ("library", "category", "arch", "dtype", "tensor_core", "tile", "layout", "epilogue")


def _tensor_ratio(ctx: Context) -> tuple[float, str]:
    """Best tensor-core peak over fp32 peak, and which precision gives it."""
    d = ctx.device
    fp32 = d.fp32_tflops or 0.0
    tf32 = (d.tf32_tflops or 0.0) / fp32 if fp32 else 0.0
    half = (d.half_tflops or 0.0) / fp32 if fp32 else 0.0
    if tf32 >= 2.0:
        return tf32, "TF32"
    return half, "fp16/bf16" if d.bf16 else "fp16"


def _memory_floor(
    ctx: Context, op: str | None, shapes: list[list[int]], launches: int
) -> tuple[float, str]:
    """Time to move a GEMM's operands and result once at peak bandwidth (0 if unknown)."""
    mnk = _mnk(op, shapes)
    if mnk is None:
        return 0.0, "operand traffic unknown (no shapes)"
    batch, m, n, k = mnk
    nbytes = batch * (m * k + k * n + m * n) * FP32_BYTES * launches
    floor = ctx.device.transfer_us(nbytes)
    return floor, f"{nbytes / 1e6:,.1f} MB at {ctx.device.bandwidth_text} = {floor:,.1f} µs"


def _mnk(op: str | None, shapes: list[list[int]]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) from an mm/addmm/bmm/matmul/linear op's input shapes."""
    dims = [s for s in shapes if s]
    try:
        if op in ("aten::mm", "aten::matmul") and len(dims) >= 2 and len(dims[0]) == 2:
            (m, k), (_, n) = dims[0], dims[1][-2:]
            return 1, m, n, k
        if op == "aten::addmm" and len(dims) >= 3:
            (m, k), (_, n) = dims[1], dims[2]
            return 1, m, n, k
        if op in ("aten::bmm", "aten::baddbmm") and len(dims) >= 2:
            a, b = (dims[1], dims[2]) if op == "aten::baddbmm" else (dims[0], dims[1])
            return a[0], a[1], b[2], a[2]
        if op == "aten::linear" and len(dims) >= 2:
            x, w = dims[0], dims[1]
            batch = 1
            for d in x[:-1]:
                batch *= d
            return 1, batch, w[0], x[-1]
    except (IndexError, ValueError, TypeError):
        return None
    return None


def _fix(target: str, conv: bool = False) -> str:
    if conv and target == "TF32":
        return (
            "cuDNN ran this convolution on the CUDA cores: keep TF32 allowed "
            "(torch.backends.cudnn.allow_tf32 = True, the default) and let cuDNN pick "
            "tensor-core kernels (torch.backends.cudnn.benchmark = True, "
            "memory_format=torch.channels_last), or run under "
            "torch.autocast('cuda', dtype=torch.bfloat16)."
        )
    if conv:
        dtype = "torch.float16" if target == "fp16" else "torch.bfloat16"
        return (
            f"Run the convolutions under torch.autocast('cuda', dtype={dtype}) (with "
            "torch.cuda.amp.GradScaler for fp16 training) and "
            "memory_format=torch.channels_last: this GPU's tensor cores take half precision, "
            "not fp32."
        )
    if target == "TF32":
        return (
            "Allow TF32 (torch.set_float32_matmul_precision('high') or "
            "torch.backends.cuda.matmul.allow_tf32 = True), or run under "
            "torch.autocast('cuda', dtype=torch.bfloat16)."
        )
    return (
        "Run under torch.autocast('cuda', dtype=torch.float16) (with torch.cuda.amp.GradScaler "
        "for training): this GPU's tensor cores take fp16, not TF32"
        + (" or bf16." if target == "fp16" else ".")
    )


RULE = fp32_gemm
