"""Dispatch: which kernels (or, on CPU-only traces, which child ops) each op runs as.

The same op with the same input shapes should run the same kernels from one run to the
next. When it does not (a `_tn_` GEMM became `_nn_`, bf16 became fp32, cuBLAS was replaced
by a Triton kernel), the time moves between kernel groups and a per-kernel diff shows one
group shrinking and another growing; this table says it was one op changing its mind.
"""

from __future__ import annotations

import polars as pl

from traceq.kernel_names import decode
from traceq.trace import Trace

IMPL_SEP = "\n"
# A choice counts as the op's implementation when more than this share of its calls made it.
STABLE_SHARE = 0.5
KEY = ["op", "shapes", "strides", "call"]
IMPL_SCHEMA = {
    "op": pl.String,
    "shapes": pl.String,  # input shapes as recorded, without spaces ("" when not recorded)
    "strides": pl.String,  # input strides, when recorded
    "call": pl.Int64,  # which call of this op and signature in a step (0-based); null: all
    "types": pl.String,
    "impl": pl.String,  # kernel names (or child ops) in launch order, joined by IMPL_SEP
    "count": pl.Int64,  # calls that ran `impl`
    "calls": pl.Int64,  # calls in all
    "time_ns": pl.Int64,  # time of the calls that ran `impl`
}


def implementations(trace: Trace, semantic: pl.DataFrame) -> pl.DataFrame:
    """Per op signature (name, input shapes and strides): the implementation most calls ran.

    Identical signatures can run different kernels on purpose: the two GEMMs of a Linear
    layer's backward take [1024, 1024] x [1024, 1705] once as `nn` and once as `nt` when
    the trace records no strides. Calls are therefore told apart by their order within a
    step (`call`), which a program repeats exactly; signatures whose calls all agree are
    stored once, with `call` null.
    """
    ops = trace.ops
    if trace.kernels.height:
        units = trace.kernels.select(
            pl.col("op_event").cast(pl.Int64).alias("event"),
            pl.col("name").alias("impl"),
            "ts_ns",
            pl.col("dur_ns").fill_null(0).alias("time_ns"),
        ).join(semantic, on="event", how="inner")
    else:
        heads = semantic.filter(pl.col("event") == pl.col("semantic")).select("semantic")
        units = ops.filter(pl.col("parent").is_not_null()).select(
            pl.col("parent").cast(pl.Int64).alias("semantic"),
            pl.col("name").alias("impl"),
            "ts_ns",
            pl.col("dur_ns").fill_null(0).alias("time_ns"),
        )
        units = units.join(heads, on="semantic", how="semi")
    signature = ["op", "shapes", "strides"]
    calls = (
        units.sort("ts_ns")
        .group_by("semantic", maintain_order=True)
        .agg(pl.col("impl").str.join(IMPL_SEP), pl.col("time_ns").sum())
        .join(
            ops.select(
                pl.col("event").cast(pl.Int64).alias("semantic"),
                pl.col("name").alias("op"),
                pl.col("input_dims").str.replace_all(" ", "").fill_null("").alias("shapes"),
                _text(pl.col("input_strides")).alias("strides"),
                pl.col("input_types").list.join(", ").fill_null("").alias("types"),
                "step",
                pl.col("ts_ns").alias("op_ts_ns"),
            ),
            on="semantic",
            how="inner",
        )
        .with_columns(
            (pl.col("op_ts_ns").rank("ordinal").over([*signature, "step"]) - 1)
            .cast(pl.Int64)
            .alias("call")
        )
    )
    choices = calls.group_by(*signature, "call", "impl").agg(
        pl.len().cast(pl.Int64).alias("count"),
        pl.col("time_ns").sum().cast(pl.Int64),
        pl.col("types").mode().sort(nulls_last=True).first(),
    )
    per_call = (
        choices.with_columns(pl.col("count").sum().over(*signature, "call").alias("calls"))
        .sort(["count", "time_ns", "impl"], descending=[True, True, False])
        .unique([*signature, "call"], keep="first", maintain_order=True)
        .with_columns(pl.col("impl").n_unique().over(signature).alias("_choices"))
    )
    uniform = (
        per_call.filter(pl.col("_choices") == 1)
        .group_by(signature)
        .agg(
            pl.lit(None, dtype=pl.Int64).alias("call"),
            pl.col("types").first(),
            pl.col("impl").first(),
            pl.col("count").sum(),
            pl.col("calls").sum(),
            pl.col("time_ns").sum(),
        )
    )
    varied = per_call.filter(pl.col("_choices") > 1)
    return (
        pl.concat([uniform.select(list(IMPL_SCHEMA)), varied.select(list(IMPL_SCHEMA))])
        .cast(IMPL_SCHEMA)
        .sort(KEY, nulls_last=False)
    )


def _text(strides: pl.Expr) -> pl.Expr:
    """[[1024, 1], [1, 1024]] -> '[[1024,1],[1,1024]]'; '' when not recorded."""
    inner = strides.list.eval(pl.element().cast(pl.List(pl.String)).list.join(","))
    joined = inner.list.eval(pl.concat_str(pl.lit("["), pl.element(), pl.lit("]"))).list.join(",")
    return pl.concat_str(pl.lit("["), joined, pl.lit("]")).fill_null("")


def dispatch_changes(base: pl.DataFrame, new: pl.DataFrame, unit: str = "kernels") -> pl.DataFrame:
    """Op calls (same name, input shapes and strides, same call within a step) whose stable
    implementation differs between two `implementations` tables, with what changed, by
    impact. A signature stored once (`call` null) stands for each of its calls."""
    stable = pl.col("count") > STABLE_SHARE * pl.col("calls")
    joined = base.filter(stable).join(
        new.filter(stable), on=["op", "shapes", "strides"], how="inner", suffix="_new"
    )
    same_call = (
        pl.col("call").is_null()
        | pl.col("call_new").is_null()
        | (pl.col("call") == pl.col("call_new"))
    )
    changed = joined.filter(same_call & (pl.col("impl") != pl.col("impl_new")))
    labels = [
        describe_change(a.split(IMPL_SEP), b.split(IMPL_SEP), unit)
        for a, b in zip(changed["impl"], changed["impl_new"], strict=True)
    ]
    return (
        changed.select(
            "op",
            "shapes",
            pl.coalesce("call", "call_new").alias("call"),
            pl.col("types").alias("base_types"),
            pl.col("types_new").alias("new_types"),
            pl.col("impl").str.split(IMPL_SEP).alias("base_impl"),
            pl.col("impl_new").str.split(IMPL_SEP).alias("new_impl"),
            pl.col("calls").alias("base_calls"),
            pl.col("calls_new").alias("new_calls"),
            (pl.col("time_ns") / pl.col("count")).alias("base_ns_per_call"),
            (pl.col("time_ns_new") / pl.col("count_new")).alias("new_ns_per_call"),
        )
        .with_columns(pl.Series("change", labels, dtype=pl.String))
        .sort(
            (pl.col("new_ns_per_call") - pl.col("base_ns_per_call")).abs() * pl.col("new_calls"),
            "op",
            "shapes",
            "call",
            descending=[True, False, False, False],
            nulls_last=True,
        )
    )


def describe_change(base: list[str], new: list[str], unit: str = "kernels") -> str:
    """'layout tn → nn; dtype bf16 → fp32' from the decoded kernel names of two
    implementations; the count when that changed; 'different kernels' when nothing decoded
    differs (on CPU-only traces the implementation is child ops: only the count is said)."""
    parts = []
    if unit == "kernels":
        for part in ("library", "dtype", "layout"):
            before, after = _decoded(base, part), _decoded(new, part)
            if before != after and (before or after):
                parts.append(f"{part} {before or '?'} → {after or '?'}")
    if len(base) != len(new):
        parts.append(f"{len(base)} → {len(new)} {unit}")
    return "; ".join(parts) or f"different {unit}"


def _decoded(names: list[str], part: str) -> str:
    """The distinct values of one decoded part over the GEMM-like kernels of a sequence
    (all kernels when none is a GEMM): a memset beside a GEMM says nothing about dtype."""
    decoded = [decode(n) for n in names]
    main = [d for d in decoded if d.is_gemm] or decoded
    seen: list[str] = []
    for d in main:
        value = getattr(d, part)
        if value and value not in seen:
            seen.append(value)
    return "+".join(seen)
