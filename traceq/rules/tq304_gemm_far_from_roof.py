"""TQ304 gemm-far-from-roof: GEMMs far below their roofline roof for a reason the user can
change (unaligned dimensions, a last wave of tiles mostly idle, a slower operand layout).

The roofline (`traceq.perf.roofline`) says how far a GEMM ran from its roof; the reasons
below say why, from the op's shapes and its kernel's name and grid. One finding per op
signature (name, shapes, dtype) and reason, over the whole trace.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import polars as pl

from traceq.perf.roofline import trace_spec
from traceq.rules.base import Context, rule
from traceq.rules.finding import Finding

DEFAULTS = {
    "max_pct_roof": 50.0,
    "target_pct_roof": 70.0,
    "min_wave_efficiency": 0.75,
    "min_layout_speedup": 1.5,
    "min_time_us": 20.0,
}

#: Per-SM limits by architecture (CUDA programming guide, compute capabilities table):
#: shared memory (bytes), registers, threads. What bounds the CTAs one SM runs at once.
SM_LIMITS = {
    "volta": (98304, 65536, 2048),
    "turing": (65536, 65536, 1024),
    "ampere": (167936, 65536, 2048),
    "ada": (102400, 65536, 1536),
    "hopper": (233472, 65536, 2048),
}
AMPERE_GA10X = (102400, 65536, 1536)  # sm86 parts (A10, RTX 30xx): the "ampere" spec arch

#: Elements in 16 bytes (what tensor-core loads take at a time): the multiple K and N need.
ALIGNMENT = {"fp16": 8, "bf16": 8, "fp8": 16, "int8": 16, "tf32": 4, "fp32": 4, "fp64": 2}


@rule("TQ304", "gemm-far-from-roof", "info", defaults=DEFAULTS)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds GEMMs (`mm`, `addmm`, `bmm`, `linear`, `matmul`, ...) whose kernels reach less
    than `max_pct_roof` % of their roofline roof (`traceq roofline`: the datasheet's
    compute peak for their dtype or its memory bandwidth, whichever binds) and shows a
    reason a user can change:

    - **unaligned**: K or N (the row lengths of the operands and the output) not a multiple
      of 16 bytes of elements — 8 for fp16/bf16, 16 for fp8/int8, 4 for TF32 — so the
      tensor-core kernels cannot load whole rows in 16-byte vectors;
    - **wave quantization**: the kernel's grid fills its last wave less than
      `min_wave_efficiency` (e.g. 140 tiles on 132 SMs holding one each: the second wave
      runs 8 tiles while 124 SMs idle). Tiles come from M, N and the tile the kernel name
      states (else the grid). A wave is the SM count times the CTAs one SM holds
      at once (from the kernel's block size, registers and shared memory against the
      architecture's per-SM limits; NVIDIA parts only). A grid of less than one wave is
      TQ302's;
    - **layout**: an aligned GEMM whose M, N, K and dtype run elsewhere in the trace with
      another operand layout (the kernel name's `nn`/`nt`/`tn`/`tt`) at least
      `min_layout_speedup` × faster: the trace's own run shows what this shape reaches.

    fp32 GEMMs on CUDA cores (no TF32) are TQ301's, which states their tensor-core saving:
    this rule leaves them out. TQ303 (PyTorch's pattern matcher's check, saving 0) reports
    unaligned fp16/bf16 `mm`/`bmm`/`addmm` whatever their speed; this rule reports an
    unaligned GEMM only when the roofline shows it slow, with that evidence and a saving.
    Latency-bound GEMMs (too short to reach any roof) are left out: no layout or padding
    makes a 3 µs GEMM fast.

    ## Why is this bad?
    cuBLAS reaches 70-80 % of the datasheet peak on large aligned GEMMs; an unaligned
    dimension drops it to slower kernels, a mostly idle last wave wastes up to half of the
    GPU for that wave, and a transposed operand can pick a slower kernel.

    Estimated saving, stated per reason: the time over what the GEMM would take at
    `target_pct_roof` % of its roof (the achievable fraction of the datasheet: what
    cuBLAS reaches on aligned shapes), and for wave quantization at most the idle share of
    the waves (1 − efficiency), for layout at most the time at the faster layout's rate.

    ## Example
    ```python
    logits = hidden @ embedding.weight.T     # vocabulary 30522: N is not a multiple of 8
    ```

    ## Use instead
    ```python
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    # choose batch x tokens and widths whose tile count fills whole waves of the SMs;
    # keep weights in the layout the fast run uses (`w.t().contiguous()` once, not per call)
    ```

    ## Options
    - `max_pct_roof` (50): report GEMMs below this % of their roof.
    - `target_pct_roof` (70): the % of roof the saving assumes once the reason is fixed.
    - `min_wave_efficiency` (0.75): report wave quantization below this share of busy SMs.
    - `min_layout_speedup` (1.5): report a layout when another runs this much faster.
    - `min_time_us` (20): leave out GEMM signatures with less time in all.

    ## References
    - NVIDIA, "Matrix Multiplication Background User's Guide" (tensor core requirements,
      tile and wave quantization):
      https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/
    - Williams, Waterman, Patterson, "Roofline: an insightful visual performance model",
      CACM 52(4), 2009
    """
    if ctx.device.kind != "gpu":
        return
    spec = trace_spec(ctx.trace)
    if spec is None:
        return
    frame = ctx.cached("perf.roofline", lambda: ctx.trace.roofline)
    gemms = signatures(frame, ctx)
    if gemms.height == 0:
        return
    options = ctx.options
    rows = gemms.to_dicts()
    for row in rows:
        if row["pct_roof"] >= options["max_pct_roof"] or row["time_us"] < options["min_time_us"]:
            continue
        found = reasons(row, rows, spec.compute_units, options, spec.arch)
        for reason, saving, why, evidence in found:
            yield finding(ctx, row, reason, saving, why, evidence, spec.name)


def signatures(frame: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    """Modelled GEMM calls with a datasheet roof, not latency bound and not fp32 on CUDA
    cores, summed per op signature, with M, N, K and the main kernel decoded."""
    calls = frame.filter(
        (pl.col("family") == "gemm")
        & pl.col("modelled")
        & pl.col("pct_roof_datasheet").is_not_null()
        & pl.col("bound_datasheet").is_in(["compute", "memory"])
        & (pl.col("roof_dtype") != "fp32")  # TQ301's
        & (pl.col("time_us") > 0)
    )
    if calls.height == 0:
        return calls
    kernels = ctx.kernel_names.select(
        pl.col("event").cast(pl.Int64).alias("_kernel"),
        pl.col("name").alias("kernel"),
        "dur_ns",
        "grid",
        "layout",
        "tile",
        "block",
        "registers_per_thread",
        "shared_memory",
    )
    main = (
        calls.select("event", pl.col("kernel_events").alias("_kernel"))
        .explode("_kernel")
        .with_columns(pl.col("_kernel").cast(pl.Int64))
        .join(kernels, on="_kernel")
        .sort("dur_ns", descending=True)
        .group_by("event", maintain_order=True)
        .first()
    )
    keys = ["name", "input_dims", "dtype", "roof_dtype"]
    return (
        calls.join(main.drop("_kernel"), on="event", how="left")
        .with_columns(
            (pl.col("pct_roof_datasheet") * pl.col("time_us") / 100).alias("_ideal_us"),
        )
        .group_by(keys, maintain_order=True)
        .agg(
            pl.col("event"),
            pl.col("kernel_events").explode().alias("kernels"),
            pl.col("kernel_names").explode().unique(maintain_order=True),
            pl.col("shape").first(),
            pl.col("module").drop_nulls().first(),
            pl.col("time_us").sum(),
            pl.col("_ideal_us").sum(),
            pl.col("flops").sum(),
            pl.col("bytes").sum(),
            pl.col("bound_datasheet").mode().sort(nulls_last=True).first().alias("bound"),
            *(_of_main_kernel(c) for c in ("kernel", "layout", "tile")),
            pl.col("grid").first(),
            pl.col("block").first(),
            pl.col("registers_per_thread").first(),
            pl.col("shared_memory").first(),
        )
        .with_columns(
            (100 * pl.col("_ideal_us") / pl.col("time_us")).alias("pct_roof"),
            (pl.col("flops") / (pl.col("time_us") * 1e6)).alias("tflops"),
        )
    )


def _of_main_kernel(column: str) -> pl.Expr:
    """`column` of the signature's main kernel: the one most calls ran, ties to the first
    name in sorting order. Kernel, layout and tile come from that one kernel (a mode of
    each apart broke ties in hash order: a kernel named `_nn_` shown with layout `nt`)."""
    main = pl.col("kernel").drop_nulls().mode().sort().first()
    return pl.col(column).filter(pl.col("kernel") == main).first().alias(column)


def gemm_dims(name: str, dims: Any) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a GEMM call from its recorded input shapes, as `perf.cost`
    lays each op out; None when the shapes do not say."""
    try:
        shapes = json.loads(dims) if isinstance(dims, str) else dims
        op = name.split("::")[-1].rstrip("_")
        if op == "linear":
            x, w = shapes[0], shapes[1]
            return 1, math.prod(x[:-1]), w[0], x[-1]
        if op in ("addmm", "_addmm_activation"):
            (m, k), (_, n) = shapes[1], shapes[2]
            return 1, m, n, k
        if op in ("mm", "_scaled_mm"):
            (m, k), (_, n) = shapes[0], shapes[1]
            return 1, m, n, k
        if op in ("bmm", "baddbmm"):
            a, b = (shapes[0], shapes[1]) if op == "bmm" else (shapes[1], shapes[2])
            return a[0], a[1], b[2], a[2]
        if op == "matmul":
            x, y = shapes[0], shapes[1]
            if len(x) >= 2 and len(y) == 2:
                return 1, math.prod(x[:-1]), y[-1], x[-1]
            if len(x) >= 3 and len(y) >= 3:
                return math.prod(x[:-2]), x[-2], y[-1], x[-1]
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return None


def ctas_per_sm(row: dict[str, Any], arch: str, sms: int) -> int | None:
    """CTAs of the kernel one SM holds at once, from its block size, registers and shared
    memory against the architecture's per-SM limits; None when the trace does not record
    them or the part is not an NVIDIA one the table has (no guess)."""
    limits = SM_LIMITS.get(arch)
    if arch == "ampere" and sms not in (108,):  # A100 has 108 SMs; GA10x parts others
        limits = AMPERE_GA10X
    threads = math.prod(row.get("block") or []) or 0
    regs, smem = row.get("registers_per_thread"), row.get("shared_memory")
    if limits is None or threads <= 0 or regs is None or smem is None:
        return None
    by_smem = limits[0] // smem if smem > 0 else 32
    by_regs = limits[1] // max(1, regs * threads)
    by_threads = limits[2] // threads
    return max(1, min(by_smem, by_regs, by_threads, 32))


def output_tiles(row: dict[str, Any], shape: tuple[int, int, int, int] | None) -> int:
    """CTAs that compute output tiles: from M, N and the tile the kernel name states, in the
    library's column-major terms (cuBLAS, CUTLASS, hipBLASLt compute Cᵀ = Bᵀ·Aᵀ: the tile's
    first size covers N), times the batch and the grid's split-K depth (z); else the grid.
    A CUTLASS grid may launch more CTAs than tiles (a swizzled raster whose extra CTAs exit
    at once: 128 launched for 88 tiles), so the tile count is the one to trust."""
    grid = [int(g) for g in row.get("grid") or []]
    tile = [int(t) for t in (row.get("tile") or "").split("x") if t.isdigit()]
    if shape is not None and len(tile) >= 2:
        batch, m, n, _ = shape
        split = grid[2] if len(grid) == 3 and grid[2] > 1 and batch == 1 else 1
        return math.ceil(n / tile[0]) * math.ceil(m / tile[1]) * batch * split
    return math.prod(grid) if grid else 0


def wave_efficiency(blocks: int, units: int) -> float:
    """Share of SM time the grid's waves keep busy: blocks over whole waves' slots."""
    if blocks <= 0 or units <= 0:
        return 1.0
    return blocks / (math.ceil(blocks / units) * units)


def reasons(
    row: dict[str, Any],
    rows: list[dict[str, Any]],
    units: int | None,
    options: Any,
    arch: str = "",
) -> Iterator[tuple[str, float, str, dict[str, Any]]]:
    """(reason, saving µs, how the saving was computed, evidence) for each reason found."""
    time_us, pct = row["time_us"], row["pct_roof"]
    target = float(options["target_pct_roof"])
    reachable = max(0.0, time_us * (1 - pct / target))
    at_target = (
        f"{time_us:,.1f} µs at {pct:.0f}% of roof → {time_us * pct / target:,.1f} µs at "
        f"{target:.0f}%"
    )
    shape = gemm_dims(row["name"], row["input_dims"])
    odd: dict[str, int] = {}
    if shape is not None:
        batch, m, n, k = shape
        multiple = ALIGNMENT.get(row["roof_dtype"] or "", 8)
        odd = {d: v for d, v in (("N", n), ("K", k)) if v % multiple}
        if odd:
            yield (
                "unaligned",
                reachable,
                f"time over {target:.0f}% of roof once aligned: {at_target}",
                {"unaligned": odd, "multiple": multiple, "mnk": [m, n, k], "batch": batch},
            )
    blocks = output_tiles(row, shape)
    per_sm = ctas_per_sm(row, arch, units or 0) if units else None
    slots = (units or 0) * (per_sm or 0)
    if slots and blocks >= slots and blocks % slots:
        efficiency = wave_efficiency(blocks, slots)
        if efficiency < options["min_wave_efficiency"]:
            waves = math.ceil(blocks / slots)
            saving = min(reachable, time_us * (1 - efficiency))
            yield (
                "wave quantization",
                saving,
                f"the idle share of {waves} waves (1 − {efficiency:.2f}) × {time_us:,.1f} µs = "
                f"{time_us * (1 - efficiency):,.1f} µs, at most the time over "
                f"{target:.0f}% of roof ({at_target})",
                {
                    "blocks": blocks,
                    "sms": units,
                    "ctas_per_sm": per_sm,
                    "slots": slots,
                    "waves": waves,
                    "efficiency": efficiency,
                },
            )
    # a layout is the reason only for an aligned shape: else alignment is, as stated above
    if shape is not None and row.get("layout") and not odd:
        same = [
            r
            for r in rows
            if r is not row
            and r.get("layout")
            and r["layout"] != row["layout"]
            and r["roof_dtype"] == row["roof_dtype"]
            and gemm_dims(r["name"], r["input_dims"]) == shape
        ]
        fastest = max(same, key=lambda r: r["tflops"], default=None)
        if fastest and fastest["tflops"] >= options["min_layout_speedup"] * row["tflops"]:
            at_fast = time_us * row["tflops"] / fastest["tflops"]
            saving = min(reachable, time_us - at_fast)
            yield (
                "layout",
                saving,
                f"time at the {fastest['layout']} run's {fastest['tflops']:.1f} TFLOP/s: "
                f"{time_us:,.1f} → {at_fast:,.1f} µs, at most the time over {target:.0f}% "
                f"of roof ({at_target})",
                {"faster_layout": fastest["layout"], "faster_tflops": fastest["tflops"]},
            )


FIXES = {
    "unaligned": (
        "Pad {dims} to a multiple of {multiple} ({dtype}: 16 bytes; 64 for a vocabulary: "
        "`resize_token_embeddings(..., pad_to_multiple_of=64)`), or pick layer widths that "
        "are, so cuBLAS runs its aligned tensor-core kernels"
    ),
    "wave quantization": (
        "Change M or N (batch × tokens, a layer's width) so the {blocks} tiles fill whole "
        "waves of the {sms} SMs, or let the GEMM library pick another tile "
        "(`torch.compile(mode='max-autotune')` benchmarks tile shapes; cuBLASLt's "
        "stream-K / split-K kernels spread the last wave)"
    ),
    "layout": (
        "Run it in the {faster} layout the faster call uses: keep the weight stored the way "
        "that call reads it (`w.t().contiguous()` once, not a transposed view per call)"
    ),
}


def finding(
    ctx: Context,
    row: dict[str, Any],
    reason: str,
    saving: float,
    why: str,
    evidence: dict[str, Any],
    part: str,
) -> Finding:
    dims = ", ".join(f"{d}={v}" for d, v in (evidence.get("unaligned") or {}).items())
    what = reason_text(reason, row, evidence, dims)
    fix = FIXES[reason].format(
        dims=dims or "the dimension",
        multiple=evidence.get("multiple"),
        dtype=row["roof_dtype"],
        blocks=evidence.get("blocks"),
        sms=evidence.get("sms"),
        faster=evidence.get("faster_layout"),
    )
    shapes = gemm_shapes(row["input_dims"])
    return ctx.finding(
        message=(
            f"{len(row['event'])} × `{row['name']}` {row['roof_dtype']} on "
            + " × ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
            + f" at {row['pct_roof']:.0f}% of its {row['bound']} roof on {part}: {what}"
        ),
        module=row["module"],
        ops=row["event"],
        kernels=[int(k) for k in row["kernels"] if k is not None],
        shapes=shapes,
        dtype=row["dtype"],
        time_us=row["time_us"],
        est_saving_us=max(0.0, min(saving, row["time_us"])),
        saving_model=f"{reason}: {why}",
        fix=fix + ".",
        evidence={
            "reason": reason,
            "pct_roof": round(row["pct_roof"], 1),
            "bound": row["bound"],
            "tflops": round(row["tflops"], 2),
            "calls": len(row["event"]),
            "kernel": row.get("kernel"),
            "grid": row.get("grid"),
            "layout": row.get("layout"),
            "tile": row.get("tile"),
            "kernel_names": row["kernel_names"],
            **evidence,
        },
    )


def reason_text(reason: str, row: dict[str, Any], evidence: dict[str, Any], dims: str) -> str:
    if reason == "unaligned":
        return f"{dims} not a multiple of {evidence['multiple']}"
    if reason == "wave quantization":
        blocks, slots = evidence["blocks"], evidence["slots"]
        return (
            f"{blocks} tiles on {evidence['sms']} SMs × {evidence['ctas_per_sm']} at once: "
            f"the last of {evidence['waves']} waves keeps {100 * (blocks % slots) / slots:.0f}% "
            "of them busy"
        )
    return (
        f"layout {row.get('layout')}; the same shape runs at "
        f"{evidence['faster_tflops']:.1f} TFLOP/s as {evidence['faster_layout']}"
    )


def gemm_shapes(dims: Any) -> list[list[int]]:
    try:
        shapes = json.loads(dims) if isinstance(dims, str) else dims
    except ValueError:
        return []
    return [s for s in shapes or [] if isinstance(s, list) and s]


RULE = check
