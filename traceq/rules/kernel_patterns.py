"""Fusion patterns read from kernels alone, for kernels no semantic op launched.

A compiled graph on a GPU often shows as one `Torch-Compiled Region` / `CompiledFunction`
op whose kernels (extern `mm` / `addmm` from cuBLAS or hipBLASLt, Inductor's
`triton_poi_fused_..._gelu_...`) hang off launches with no aten op per kernel; a custom
`torch.autograd.Function` (Megatron's `GeLUFunction`) launches an anonymous Triton kernel
(`triton__0d1d2d3de`) from its own range. Data flow between ops cannot see these: there are
no ops. What is left is the order of kernels on a stream, what their names say
(`kernel_names.decode`), and which region launched them. No shapes exist there, so the
findings built on these say so and count kernel time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.kernel_names import decode_frame
from traceq.rules.op_classes import ACTIVATION_TOKENS, FUSED_GLU
from traceq.rules.op_groups import fusion_ops

if TYPE_CHECKING:
    from traceq.rules.base import Context


#: Kernel names of attention the q/k/v GEMMs feed, beyond what `decode` calls attention
#: (AMD's Triton `attn_fwd`, cuDNN's SDPA).
ATTENTION_KERNEL = r"(?i)attn|attention|flash|fmha|sdpa"

#: Activation tokens in an autograd Function's name (`GeLUFunction`, `BiasSiLUFunction`),
#: longest first: `elu` is part of `gelu`, `relu`, `selu`.
_FUNCTION_ACTIVATION = sorted((*ACTIVATION_TOKENS, "swish"), key=len, reverse=True)


def activation_in(text: pl.Expr) -> pl.Expr:
    """The first activation token (`ACTIVATION_TOKENS`) in `text`, lower-cased; null if none.
    `swish` reads as SiLU."""
    lowered = text.str.to_lowercase()
    found = pl.lit(None, dtype=pl.String)
    for token in reversed(_FUNCTION_ACTIVATION):
        found = (
            pl.when(lowered.str.contains(token, literal=True)).then(pl.lit(token)).otherwise(found)
        )
    return pl.when(found == "swish").then(pl.lit("silu")).otherwise(found)


def stream_kernels(ctx: Context) -> pl.DataFrame:
    """The trace's kernels in order on each stream, decoded: `event`, `name`, `ts_ns`,
    `dur_ns`, `step`, `module`, `grid`, `_lane` (device, stream), `_pos` (order on it),
    `category`, `fused_ops`, `op_event` and `launcher` (the op that launched it and its name),
    `opless` (no semantic op of `fusion_ops` launched it: a compiled region's kernel, or
    one a custom Function launched from its own range), `gemm_op` (the launching op when
    it is a GEMM of `fusion_ops`). Computed once per analysis."""

    def build() -> pl.DataFrame:
        kernels = ctx.trace.kernels
        if "kind" in kernels.columns:
            kernels = kernels.filter(pl.col("kind") == "kernel")
        if kernels.height == 0:
            return pl.DataFrame()
        # a semantic op's kernels may hang off an op inside it (`aten::linear` ->
        # `aten::addmm`): attribute through the op's own `kernel_events`
        semantic = (
            fusion_ops(ctx)
            .select(pl.col("event").alias("_op"), pl.col("role").alias("_role"), "kernel_events")
            .explode("kernel_events")
            .drop_nulls("kernel_events")
            .select(pl.col("kernel_events").cast(pl.Int64).alias("event"), "_op", "_role")
            .unique("event", keep="first")
        )
        names = ctx.trace.ops.select(
            pl.col("event").cast(pl.Int64).alias("op_event"), pl.col("name").alias("launcher")
        )
        decoded = decode_frame(kernels.select("name").unique())
        return (
            kernels.select(
                pl.col("event").cast(pl.Int64),
                "name",
                "ts_ns",
                "dur_ns",
                "step",
                "module",
                "grid",
                "launch_pid",
                "launch_tid",
                pl.col("op_event").cast(pl.Int64),
                pl.concat_str(
                    pl.col("device").cast(pl.String),
                    pl.col("stream").cast(pl.String),
                    separator=":",
                ).alias("_lane"),
            )
            .join(decoded.select("name", "category", "fused_ops"), on="name", how="left")
            .join(semantic, on="event", how="left")
            .join(names, on="op_event", how="left")
            .with_columns(
                pl.col("_op").is_null().alias("opless"),
                pl.when(pl.col("_role") == "gemm").then(pl.col("_op")).alias("gemm_op"),
                pl.col("ts_ns").rank("ordinal").over("_lane").cast(pl.Int64).alias("_pos"),
            )
            .drop("_role", "_op")
            .sort("_lane", "_pos")
        )

    return ctx.cached("fusion.stream_kernels", build)


def _is_gemm() -> pl.Expr:
    return pl.col("category") == "gemm"


#: The backward pass in a kernel's name or its launcher's (`triton_poi_fused_gelu_backward_0`,
#: `flash_bwd_kernel`, `CompiledFunctionBackward`): a dgrad and a wgrad GEMM back to back
#: read one gradient but are no merged projection, and a GELU's gradient is no split.
BACKWARD = r"(?i)backward|_bwd|bwd_"


def _backward() -> pl.Expr:
    return pl.col("name").str.contains(BACKWARD) | pl.col("launcher").fill_null("").str.contains(
        BACKWARD
    )


def _with_previous(kernels: pl.DataFrame, back: int) -> pl.DataFrame:
    """`kernels` with the columns of the `back` kernels before each on its stream
    (`prev1_name`, `prev2_category`, ...)."""
    cols = ["event", "name", "category", "opless", "launch_tid", "step", "dur_ns"]
    return kernels.with_columns(
        pl.col(c).shift(n).over("_lane").alias(f"prev{n}_{c}")
        for n in range(1, back + 1)
        for c in cols
    )


def kernel_activation_splits(ctx: Context, include_compiled: bool = True) -> pl.DataFrame:
    """One row per GEMM kernel followed on its stream by an activation kernel that no
    semantic op launched: `gemm_kernel`, `act_kernel`, `gemm_op` (the GEMM's op, or null in
    a compiled region), `activation`, `generated` (an Inductor kernel), `launcher` (the
    region or Function that launched the activation), the names and times.

    The activation is named by the kernel (Inductor's `triton_poi_fused_addmm_gelu_0`:
    its fused ops hold an activation) or by the Function that launched it (an anonymous
    `triton__0d1d2d3de` under `GeLUFunction`). Not a split: a kernel that fuses the
    multiply of a GLU after gate and up GEMMs (`..._mul_silu` following two GEMMs;
    TQ103's, fused already), `silu_and_mul`-style kernels, a GEMM template that applied
    the activation itself, or work of the backward pass.
    """
    kernels = stream_kernels(ctx)
    if kernels.height == 0:
        return pl.DataFrame()
    seen = _with_previous(kernels, back=2)
    by_name = activation_in(
        pl.col("fused_ops").list.eval(pl.element().filter(pl.element() != "mul")).list.join("_")
    )
    launcher = pl.col("launcher").fill_null("")
    function_act = pl.when(
        ~launcher.str.starts_with("aten::")
        & ~launcher.str.contains(r"(?i)backward|compiled|^##")
        & ~launcher.str.contains(FUSED_GLU)
    ).then(activation_in(launcher))
    generated = pl.col("fused_ops").list.len() > 0
    glu_mul = (
        pl.col("fused_ops").list.contains("mul")
        & (pl.col("prev2_category") == "gemm")
        & pl.col("prev2_opless").eq_missing(pl.col("prev1_opless"))
    )
    found = (
        seen.filter(
            pl.col("opless")
            & ~_is_gemm()
            & (pl.col("prev1_category") == "gemm")
            & (pl.col("prev1_step").eq_missing(pl.col("step")))
            & (pl.col("prev1_launch_tid").eq_missing(pl.col("launch_tid")))
            & ~pl.col("name").str.contains(FUSED_GLU)
            & ~_backward()
        )
        .with_columns(
            pl.when(generated).then(by_name).otherwise(function_act).alias("activation"),
            generated.alias("generated"),
        )
        .filter(pl.col("activation").is_not_null() & ~(pl.col("generated") & glu_mul))
    )
    if not include_compiled:
        found = found.filter(~pl.col("generated"))
    gemm_ops = kernels.select(pl.col("event").alias("prev1_event"), "gemm_op")
    return (
        found.drop("gemm_op")
        .join(gemm_ops, on="prev1_event", how="left")
        .select(
            pl.col("prev1_event").alias("gemm_kernel"),
            pl.col("event").alias("act_kernel"),
            "gemm_op",
            "activation",
            "generated",
            "launcher",
            pl.col("prev1_name").alias("gemm_name"),
            pl.col("name").alias("act_name"),
            pl.col("prev1_dur_ns").alias("gemm_ns"),
            pl.col("dur_ns").alias("act_ns"),
            "step",
            "module",
            "ts_ns",
        )
        .sort("ts_ns")
    )


def kernel_parallel_gemms(ctx: Context, max_between: int = 4) -> pl.DataFrame:
    """One row per run of GEMM kernels no semantic op launched that read one input: two or
    more back to back on a stream, each like the one before (same kernel name or same
    grid: one shape class), launched from one region, and then either an attention kernel
    (after at most `max_between` other non-GEMM kernels: q, k, v before SDPA) or, right
    after, a kernel fusing a GLU's multiply with its activation (gate and up). Columns:
    `kernels` (events, in order), `names`, `times_ns`, `launcher`, `step`, `module`,
    `after` (the attention or GLU kernel's name).

    Two GEMMs back to back with no kernel between cannot read one the other's result
    through anything but the first GEMM's output itself, and a projection's output is never
    a projection's input before attention; with neither shapes nor ops, that is the evidence
    there is.
    """
    kernels = stream_kernels(ctx)
    if kernels.height == 0:
        return pl.DataFrame()
    gemm = _is_gemm() & pl.col("opless") & ~_backward()
    region = pl.col("op_event").fill_null(-1)
    like_prev = (
        gemm
        & (pl.col("category").shift(1).over("_lane") == "gemm")
        & pl.col("opless").shift(1).over("_lane").fill_null(False)
        & (
            (pl.col("name") == pl.col("name").shift(1).over("_lane"))
            | (pl.col("grid") == pl.col("grid").shift(1).over("_lane"))
        )
        & (region == region.shift(1).over("_lane"))
        & pl.col("step").eq_missing(pl.col("step").shift(1).over("_lane"))
    )
    runs = kernels.with_columns(like_prev.fill_null(False).alias("_joins")).with_columns(
        (~pl.col("_joins")).cum_sum().over("_lane").alias("_run")
    )
    grouped = (
        runs.filter(gemm)
        .group_by("_lane", "_run", maintain_order=True)
        .agg(
            pl.col("event").alias("kernels"),
            pl.col("name").alias("names"),
            pl.col("dur_ns").alias("times_ns"),
            pl.col("_pos").max().alias("_last"),
            pl.col("launcher").first(),
            pl.col("step").first(),
            pl.col("module").first(),
            pl.col("op_event").first().alias("_region"),
        )
        .filter(pl.col("kernels").list.len() >= 2)
    )
    if grouped.height == 0:
        return grouped
    attention = (
        (pl.col("category") == "attention") | pl.col("name").str.contains(ATTENTION_KERNEL)
    ) & ~_backward()
    glu = (
        pl.col("fused_ops").list.contains("mul")
        & activation_in(pl.col("fused_ops").list.join("_")).is_not_null()
    )
    glu = glu | pl.col("name").str.contains(FUSED_GLU)
    later = kernels.select(
        "_lane",
        "_pos",
        "name",
        pl.col("op_event").alias("_region"),
        _is_gemm().alias("_gemm"),
        attention.alias("_attention"),
        glu.alias("_glu"),
    )
    after = (
        grouped.select("_lane", "_run", "_last", "_region")
        .join(later, on="_lane")
        .filter(
            (pl.col("_pos") > pl.col("_last"))
            & (pl.col("_pos") <= pl.col("_last") + 1 + max_between)
        )
        .sort("_pos")
    )
    # the first GEMM after the run ends the search: attention behind it is not the run's
    before_gemm = pl.col("_gemm").cum_sum().over("_lane", "_run") == 0
    fits = (
        after.filter(before_gemm & pl.col("_region").eq_missing(pl.col("_region_right")))
        .filter(pl.col("_attention") | (pl.col("_glu") & (pl.col("_pos") == pl.col("_last") + 1)))
        .group_by("_lane", "_run")
        .agg(pl.col("name").first().alias("after"))
    )
    return grouped.join(fits, on=["_lane", "_run"]).drop("_lane", "_run", "_last", "_region")
