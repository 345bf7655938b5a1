"""The roofline of a trace: for each op (or kernel, or module) the work it did, the time it
took, and how far that is from what the device could do.

"Is this GEMM already good?" has an answer once an op's FLOPs and bytes (`cost`) meet the
device's peaks (`specs`): its arithmetic intensity says which roof binds, and its achieved
rate says how close it came. An op reaches its roof when it runs in its ideal time,
`max(FLOPs / peak FLOP/s, bytes / peak bandwidth)`; `pct_roof` is that ideal over the
time it took. Short kernels never reach either roof: below `LATENCY_FLOOR_US` of ideal
time per kernel, launch and ramp-up dominate, and the op is `latency` bound.

Times are GPU kernel time on a GPU trace (the op's kernels, memsets included) and the
op's CPU duration on a CPU-only trace. Peaks come from the datasheet spec of the trace's
device and, when given, from a calibrated spec (`traceq device calibrate`): each gets its
own `pct_*` columns. `pct_memory` counts every modelled byte against HBM: an op whose
bytes fit in L2 (`fits_l2_*`) can pass 100 % by reading what the op before it just wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import polars as pl
import polars.selectors as cs

from traceq.perf import specs
from traceq.perf.cost import op_costs

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace
    from traceq.perf.specs import Spec

LATENCY_FLOOR_US = 5.0
"""Ideal time per kernel under which an op is latency bound: a kernel's launch, ramp-up and
tail cost a few µs whatever it computes (H100 and MI300X: 2-5 µs for an empty kernel),
so a 1 µs ideal is out of reach by construction. A stated constant."""

MATRIX_FAMILIES = ("gemm", "attention", "conv")
"""Families whose compute roof is the matrix (tensor core) peak of their dtype; the others
run on the vector units at the FP32 rate (their math is done in FP32)."""

TF32_KERNEL = r"(?i)tf32|s1688|s16816gemm_tf|xmma_.*_tf32|cutlass.*_tensorop_s\d"
"""Kernel names that say an FP32 GEMM ran on TF32 tensor cores (cuBLAS/CUTLASS)."""

By = Literal["op", "kernel", "module"]


def trace_spec(trace: LoadedTrace) -> Spec | None:
    """The datasheet spec of the device that ran most kernels; None on CPU-only traces and
    on parts the table does not have."""
    kernels = trace.select("kernels", "kind", "device", "name").filter(pl.col("kind") == "kernel")
    if kernels.height == 0:
        return None
    counts = kernels.group_by("device").len().sort(["len", "device"], descending=[True, False])
    device = counts["device"][0]
    props = next((p for p in trace.device_properties if p.get("id") == device), None)
    if props is None and len(trace.device_properties) == 1:
        props = trace.device_properties[0]
    names = kernels.filter(pl.col("device") == device)["name"].unique().head(2000).to_list()
    return specs.identify(props, names)


def roofline(
    trace: LoadedTrace,
    by: By = "op",
    spec: Spec | Literal["auto"] | None = "auto",
    achievable: Spec | None = None,
    ops: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One row per op call (`by="op"`), kernel name (`"kernel"`) or module (`"module"`):
    flops, bytes, intensity, time_us, tflops, gbs, and against each roof known
    (`datasheet`, `achievable`): peak_tflops_*, pct_compute_*, pct_memory_*, pct_roof_*,
    bound_*. `bound` is the datasheet's, else the achievable one's."""
    if spec == "auto":
        spec = trace_spec(trace)
    if ops is None:
        from traceq.relations.dataflow import dataflow_ops

        ops = dataflow_ops(trace)
    gpu = trace.select("kernels", "kind").filter(pl.col("kind") == "kernel").height > 0
    frame = _op_frame(op_costs(ops), gpu)
    if by not in ("op", "kernel", "module"):
        raise ValueError(f"by must be 'op', 'kernel' or 'module', not {by!r}")
    if by == "kernel":
        frame = _by_kernel(trace, frame)
    roofs = [("datasheet", spec), ("achievable", achievable)]
    for label, roof in roofs:
        frame = _against(frame, roof, label)
    if by == "module":
        frame = _by_module(frame, [label for label, roof in roofs if roof is not None])
    frame = frame.drop(cs.starts_with("_ideal"))
    first = next((label for label, roof in roofs if roof is not None), None)
    bound = pl.col(f"bound_{first}") if first else pl.lit(None, pl.String)
    return frame.with_columns(bound.alias("bound")).sort("time_us", descending=True)


SIGNATURE = ("name", "family", "shape", "dtype", "input_dims")
"""What makes two op calls "the same op": `summed` adds their calls up over it."""


def summed(frame: pl.DataFrame) -> pl.DataFrame:
    """Calls of one op signature summed: rates recomputed from the sums, not averaged."""
    keys = [k for k in SIGNATURE if k in frame.columns]
    labels = [c.removeprefix("peak_gbs_") for c in frame.columns if c.startswith("peak_gbs_")]
    sums = ["flops", "bytes", "time_us", "n_kernels"]
    out = frame.group_by(keys).agg(
        pl.len().alias("calls"),
        *[pl.col(c).sum() for c in sums],
        pl.col("modelled").all(),
        pl.col("why_not").drop_nulls().first(),
        *[pl.col(c).drop_nulls().first() for c in ("cost_basis",) if c in frame.columns],
        *[pl.col(f"peak_tflops_{label}").first() for label in labels],
        *[pl.col(f"peak_gbs_{label}").first() for label in labels],
        *[pl.col(f"bound_{label}").mode().sort(nulls_last=True).first() for label in labels],
        pl.col("bound").mode().sort(nulls_last=True).first(),
        *(
            [pl.col("roof_dtype").mode().sort(nulls_last=True).first()]
            if "roof_dtype" in frame.columns
            else []
        ),
        *[
            (pl.col(f"pct_roof_{label}") * pl.col("time_us")).sum().alias(f"_roof_{label}")
            for label in labels
        ],
    )
    rates = [
        (pl.col("flops") / pl.col("bytes")).alias("intensity"),
        (pl.col("flops") / (pl.col("time_us") * 1e6)).alias("tflops"),
        (pl.col("bytes") / (pl.col("time_us") * 1e3)).alias("gbs"),
    ]
    out = out.with_columns(rates)
    for label in labels:
        out = out.with_columns(
            (100 * pl.col("tflops") / pl.col(f"peak_tflops_{label}")).alias(f"pct_compute_{label}"),
            (100 * pl.col("gbs") / pl.col(f"peak_gbs_{label}")).alias(f"pct_memory_{label}"),
            (pl.col(f"_roof_{label}") / pl.col("time_us")).alias(f"pct_roof_{label}"),
        ).drop(f"_roof_{label}")
    pcts = [c for c in out.columns if c.startswith("pct_")]
    return out.with_columns(pl.when(pl.col("modelled")).then(pl.col(pcts)))


def _op_frame(costs: pl.DataFrame, gpu: bool) -> pl.DataFrame:
    time_ns = pl.col("gpu_ns") if gpu else pl.col("cpu_ns")
    kernels = pl.col("n_kernels") if gpu else pl.lit(1)
    matrix = pl.col("family").is_in(MATRIX_FAMILIES)
    tf32 = pl.col("kernel_names").list.eval(pl.element().str.contains(TF32_KERNEL)).list.any()
    roof_dtype = (
        pl.when(~matrix)
        .then(pl.when(pl.col("compute_dtype") == "fp64").then(pl.lit("fp64")).otherwise(None))
        .when((pl.col("compute_dtype") == "fp32") & ((pl.col("family") == "conv") | tf32))
        .then(pl.lit("tf32"))
        .otherwise(pl.col("compute_dtype"))
    )
    return (
        costs.filter(time_ns > 0)
        .select(
            "event",
            "name",
            "family",
            pl.col("output_shape").alias("shape"),
            pl.col("compute_dtype").alias("dtype"),
            "module",
            "step",
            "input_dims",
            "kernel_events",
            "kernel_names",
            pl.col("flops").cast(pl.Float64),
            "matmul_flops",
            pl.col("bytes").cast(pl.Float64),
            "bytes_read",
            "bytes_written",
            "modelled",
            "why_not",
            "cost_basis",
            (time_ns / 1000).alias("time_us"),
            kernels.cast(pl.Int64).alias("n_kernels"),
            roof_dtype.alias("roof_dtype"),
        )
        .with_columns(_rates())
    )


def _rates() -> list[pl.Expr]:
    time_ns = pl.col("time_us") * 1000
    return [
        (pl.col("flops") / pl.col("bytes")).alias("intensity"),
        (pl.col("flops") / time_ns / 1e3).alias("tflops"),
        (pl.col("bytes") / time_ns).alias("gbs"),
    ]


def _against(frame: pl.DataFrame, spec: Spec | None, label: str) -> pl.DataFrame:
    """`pct_compute`, `pct_memory`, `pct_roof` and `bound` against one spec's peaks."""
    names = [f"{c}_{label}" for c in ("peak_tflops", "pct_compute", "pct_memory", "pct_roof")]
    if spec is None:
        nulls = [pl.lit(None, pl.Float64).alias(n) for n in [*names, f"peak_gbs_{label}"]]
        return frame.with_columns(
            *nulls,
            pl.lit(None, pl.String).alias(f"bound_{label}"),
            pl.lit(None, pl.Boolean).alias(f"fits_l2_{label}"),
        )
    peaks = {d: float(spec.peak(d)) for d in specs.DTYPES if spec.peak(d)}
    peak = pl.col("roof_dtype").replace_strict(peaks, default=None, return_dtype=pl.Float64)
    vector = spec.vector_fp32_tflops
    is_matrix = pl.col("family").is_in(MATRIX_FAMILIES) | (pl.col("roof_dtype") == "fp64")
    peak = pl.when(is_matrix).then(peak).otherwise(pl.lit(vector, pl.Float64))
    time_ns = pl.col("time_us") * 1000
    ideal_c = pl.col("flops") / (peak * 1e3)
    ideal_m = pl.col("bytes") / spec.hbm_gbs
    ideal = pl.max_horizontal(ideal_c.fill_null(0), ideal_m)
    per_kernel_us = ideal / 1000 / pl.col("n_kernels").clip(lower_bound=1)
    bound = (
        pl.when(~pl.col("modelled") | (pl.col("flops") + pl.col("bytes") == 0))
        .then(None)
        .when(per_kernel_us < LATENCY_FLOOR_US)
        .then(pl.lit("latency"))
        .when(ideal_c.fill_null(0) >= ideal_m)
        .then(pl.lit("compute"))
        .otherwise(pl.lit("memory"))
    )
    return frame.with_columns(
        peak.alias(names[0]),
        (100 * pl.col("tflops") / peak).alias(names[1]),
        (100 * pl.col("gbs") / spec.hbm_gbs).alias(names[2]),
        (100 * ideal / time_ns).alias(names[3]),
        bound.alias(f"bound_{label}"),
        ideal_c.alias(f"_ideal_compute_{label}"),
        ideal_m.alias(f"_ideal_memory_{label}"),
        pl.lit(spec.hbm_gbs, pl.Float64).alias(f"peak_gbs_{label}"),
        (pl.col("bytes") <= (spec.l2_mib or 0) * 2**20).alias(f"fits_l2_{label}"),
    ).with_columns(
        [pl.when(pl.col("modelled")).then(pl.col(n)).otherwise(None).alias(n) for n in names]
    )


def _by_kernel(trace: LoadedTrace, ops: pl.DataFrame) -> pl.DataFrame:
    """Each op's cost spread over its kernels in proportion to their time (all of it to a
    single kernel), then summed per kernel name."""
    kernels = trace.select("kernels", "event", "name", "dur_ns").rename(
        {"event": "_kernel", "name": "kernel", "dur_ns": "_dur"}
    )
    spread = (
        ops.select(
            "name", "family", "roof_dtype", "modelled", "flops", "bytes", "time_us", "kernel_events"
        )
        .explode("kernel_events")
        .with_columns(pl.col("kernel_events").cast(pl.Int64).alias("_kernel"))
        .join(kernels.with_columns(pl.col("_kernel").cast(pl.Int64)), on="_kernel", how="inner")
        .with_columns((pl.col("_dur") / (pl.col("time_us") * 1000)).alias("_share"))
    )
    return (
        spread.group_by("kernel")
        .agg(
            pl.col("name").mode().sort(nulls_last=True).first().alias("op"),
            pl.col("family").mode().sort(nulls_last=True).first(),
            pl.col("roof_dtype").mode().sort(nulls_last=True).first(),
            pl.col("modelled").all(),
            (pl.col("flops") * pl.col("_share")).sum().alias("flops"),
            (pl.col("bytes") * pl.col("_share")).sum().alias("bytes"),
            (pl.col("_dur").sum() / 1000).alias("time_us"),
            pl.len().cast(pl.Int64).alias("n_kernels"),
        )
        .rename({"kernel": "name"})
        .with_columns(_rates())
    )


def _by_module(ops: pl.DataFrame, labels: list[str]) -> pl.DataFrame:
    """Ops summed per module. A module reaches its roof when each of its ops does: its
    ideal time is the sum of theirs, and its bound the one most of its time is under."""
    per_label = []
    for label in labels:
        ideal_c, ideal_m = pl.col(f"_ideal_compute_{label}"), pl.col(f"_ideal_memory_{label}")
        ideal = pl.max_horizontal(ideal_c.fill_null(0), ideal_m)
        per_label += [
            (pl.col("flops").sum() / ideal_c.sum() / 1e3).alias(f"peak_tflops_{label}"),
            (100 * ideal_c.sum() / (pl.col("time_us").sum() * 1000)).alias(f"pct_compute_{label}"),
            (100 * ideal_m.sum() / (pl.col("time_us").sum() * 1000)).alias(f"pct_memory_{label}"),
            (100 * ideal.sum() / (pl.col("time_us").sum() * 1000)).alias(f"pct_roof_{label}"),
            pl.col(f"bound_{label}").sort_by("time_us").last(),
            pl.col(f"peak_gbs_{label}").first(),
        ]
    nulls = [
        pl.lit(None, pl.Float64 if c != "bound" else pl.String).alias(f"{c}_{label}")
        for label in ("datasheet", "achievable")
        if label not in labels
        for c in ("peak_tflops", "peak_gbs", "pct_compute", "pct_memory", "pct_roof", "bound")
    ]
    return (
        ops.group_by("module")
        .agg(
            pl.len().alias("ops"),
            pl.col("modelled").all(),
            pl.col("family").sort_by("time_us").last(),
            pl.col("flops").sum(),
            pl.col("bytes").sum(),
            pl.col("time_us").sum(),
            pl.col("n_kernels").sum(),
            *per_label,
        )
        .with_columns(pl.col("module").fill_null("(no module)").alias("name"), *_rates(), *nulls)
    )
