"""Inference steps: one engine step (a forward over a batch) per row, from the serving
engine's own annotations, with its phase, batch and what it cost the GPU.

Serving traces have no `ProfilerStep`s worth the name: the unit of work is the engine's
step. vLLM v1 names each one `execute_<tokens>_context_<n>(...)_generation_<m>(...)`
(`gpu_model_runner`: `n` prefill requests and `m` decode requests, `sq` their query
tokens, `sk` their context tokens); SGLang `step[DECODE bs=32]` (also `EXTEND`,
`PREFILL`, `MIXED`, `IDLE`). Without either, the engines' Python frames mark a step:
vLLM's `execute_model`, SGLang's `forward_batch_generation`, with no batch known. Ranges
nested in one another on a thread are one step (SGLang records both names on one step).

A step inside a setup phase (`relations.phases`: CUDA-graph capture, compilation, warm-up)
is kept but marked (`setup_phase`): it is not the steady state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.intervals import union_ns
from traceq.relations.launches import GRAPH_LAUNCH, LAUNCH_API
from traceq.relations.phases import setup_phase_of

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

_COUNTS = r"\(sq(\d+)sk(\d+)sqsq\d+sqsk\d+\)"
VLLM_STEP = rf"^execute_(\d+)_context_(\d+){_COUNTS}_generation_(\d+){_COUNTS}$"
"""vLLM v1's step range: tokens, then prefill requests (query, context tokens), then decode."""
SGLANG_STEP = r"^step\[(DECODE|EXTEND|PREFILL|MIXED|IDLE|TARGET_VERIFY|DRAFT_EXTEND)\s+bs=(\d+)\]$"
"""SGLang's step range: forward mode and batch size."""
ENGINE_FRAMES = {
    "vllm": r"gpu_model_runner\.py\(\d+\): execute_model$",
    "sglang": r"tp_worker\.py\(\d+\): forward_batch_generation$",
}
"""Python frames (`with_stack`) that hold one step, when no step annotation was recorded."""

STEP_COLUMNS = {
    "step_index": pl.Int64,
    "engine": pl.String,
    "name": pl.String,
    "phase": pl.String,
    "batch_size": pl.Int64,
    "tokens": pl.Int64,
    "prefill_requests": pl.Int64,
    "decode_requests": pl.Int64,
    "context_tokens": pl.Int64,
    "pid": pl.String,
    "tid": pl.String,
    "ts_ns": pl.Int64,
    "end_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "setup_phase": pl.String,
}


def _int(expr: pl.Expr) -> pl.Expr:
    return expr.cast(pl.Int64, strict=False)


def _named_ranges(trace: LoadedTrace) -> pl.DataFrame:
    """Every engine step range of the trace (annotations, else Python frames), parsed."""
    columns = ["name", "pid", "tid", "ts_ns", "end_ns"]
    marks = trace.annotations.filter(pl.col("kind") == "cpu").select(columns)
    marks = marks.with_columns(pl.col("pid", "tid").cast(pl.String))
    name = pl.col("name")
    vllm = name.str.extract_groups(VLLM_STEP)
    sglang = name.str.extract_groups(SGLANG_STEP)
    prefill = _int(vllm.struct.field("2"))
    decode = _int(vllm.struct.field("5"))
    vllm_phase = (
        pl.when(prefill.is_null())
        .then(None)
        .when(prefill == 0)
        .then(pl.lit("decode"))
        .when(decode == 0)
        .then(pl.lit("prefill"))
        .otherwise(pl.lit("mixed"))
    )
    sglang_mode = sglang.struct.field("1").str.to_lowercase()
    sglang_phase = (
        pl.when(sglang_mode.is_in(["extend", "prefill"]))
        .then(pl.lit("prefill"))
        .otherwise(sglang_mode)
    )
    parsed = marks.with_columns(
        pl.when(name.str.contains(VLLM_STEP))
        .then(pl.lit("vllm"))
        .when(name.str.contains(SGLANG_STEP))
        .then(pl.lit("sglang"))
        .alias("engine"),
        pl.coalesce(vllm_phase, sglang_phase).alias("phase"),
        pl.coalesce(prefill + decode, _int(sglang.struct.field("2"))).alias("batch_size"),
        _int(vllm.struct.field("1")).alias("tokens"),
        prefill.alias("prefill_requests"),
        decode.alias("decode_requests"),
        (_int(vllm.struct.field("4")) + _int(vllm.struct.field("7"))).alias("context_tokens"),
    ).filter(pl.col("engine").is_not_null())
    if parsed.height or "python" not in trace.frames:
        return parsed
    frames = trace.python.select(columns).with_columns(pl.col("pid", "tid").cast(pl.String))
    engine = pl.lit(None, dtype=pl.String)
    for key, pattern in ENGINE_FRAMES.items():
        engine = pl.when(name.str.contains(pattern)).then(pl.lit(key)).otherwise(engine)
    unknown = ["phase", "batch_size", "tokens", "prefill_requests", "decode_requests"]
    return (
        frames.with_columns(engine.alias("engine"))
        .filter(pl.col("engine").is_not_null())
        .with_columns(pl.lit(None, dtype=STEP_COLUMNS[c]).alias(c) for c in unknown)
        .with_columns(pl.lit(None, dtype=pl.Int64).alias("context_tokens"))
    )


def inference_steps(trace: LoadedTrace) -> pl.DataFrame:
    """One row per engine step, in time order: `step_index`, `engine`, `name`, `phase`
    (prefill, decode, mixed, idle; null where not recorded), `batch_size` (requests),
    `tokens` (scheduled tokens), `prefill_requests`, `decode_requests`, `context_tokens`,
    the CPU window (`pid`, `tid`, `ts_ns`, `end_ns`, `dur_ns`), `setup_phase` (capture,
    compilation, warm-up: not the steady state), and what the step cost
    (`step_metrics`)."""
    ranges = _named_ranges(trace)
    if ranges.height == 0:
        return step_metrics(trace, pl.DataFrame(schema=STEP_COLUMNS))
    ordered = ranges.sort("pid", "tid", "ts_ns", pl.col("end_ns"), descending=[False] * 3 + [True])
    reach = pl.col("end_ns").cum_max().shift(1).over("pid", "tid")
    outer = (reach.is_null() | (pl.col("ts_ns") >= reach)).cum_sum().over("pid", "tid")
    fields = [
        "engine",
        "phase",
        "batch_size",
        "tokens",
        "prefill_requests",
        "decode_requests",
        "context_tokens",
    ]
    steps = (
        ordered.with_columns(outer.alias("_outer"))
        .group_by("pid", "tid", "_outer", maintain_order=True)
        .agg(
            pl.col("name").first(),
            pl.col("ts_ns").first(),
            pl.col("end_ns").first(),
            *[pl.col(f).drop_nulls().first() for f in fields],
            (pl.col("engine") == "sglang").any().alias("_sglang"),
        )
        .with_columns(  # SGLang steps may also carry the vLLM-style name
            pl.when("_sglang").then(pl.lit("sglang")).otherwise("engine").alias("engine")
        )
        .sort("ts_ns")
        .with_row_index("step_index")
        .with_columns(
            pl.col("step_index").cast(pl.Int64),
            (pl.col("end_ns") - pl.col("ts_ns")).alias("dur_ns"),
        )
    )
    for column, dtype in STEP_COLUMNS.items():  # Python frames carry no batch
        if column not in steps.columns:
            steps = steps.with_columns(pl.lit(None, dtype=dtype).alias(column))
    steps = steps.with_columns(setup_phase_of(steps, trace).alias("setup_phase"))
    return step_metrics(trace, steps.select(list(STEP_COLUMNS)).cast(STEP_COLUMNS))


def step_metrics(trace: LoadedTrace, steps: pl.DataFrame) -> pl.DataFrame:
    """`steps` with what each cost: `kernels` and `gpu_ns` (activities it launched: by the
    launch call's time in the step's CPU window), `graph_launches`, `replayed_kernels`,
    `gpu_busy_ns` (union of those activities per device, summed), `gpu_idle_share` (1 -
    busy / wall), `launch_ns` (CPU time in launch calls: the launch overhead),
    `us_per_token` (wall / scheduled tokens, else / batch size)."""
    windows = steps.select("step_index", "ts_ns", "end_ns").sort("ts_ns")
    kernels = trace.select("kernels", "device", "ts_ns", "end_ns", "dur_ns", "launch_ts_ns")
    runtime = trace.select("runtime", "name", "ts_ns", "dur_ns", "event")
    graph_calls = runtime.filter(pl.col("name").str.contains(GRAPH_LAUNCH))
    replayed = (
        trace.select("kernels", "runtime_event")
        .with_columns(pl.col("runtime_event").is_in(graph_calls["event"].cast(pl.Int64).implode()))[
            "runtime_event"
        ]
        .fill_null(False)
        .alias("_replayed")
    )
    kernels = kernels.with_columns(replayed, pl.coalesce("launch_ts_ns", "ts_ns").alias("_at"))

    def placed(frame: pl.DataFrame, at: str) -> pl.DataFrame:
        return (
            frame.sort(at)
            .join_asof(
                windows.rename({"ts_ns": "_start", "end_ns": "_end"}),
                left_on=at,
                right_on="_start",
                strategy="backward",
                check_sortedness=False,
            )
            .filter(pl.col(at) < pl.col("_end"))
        )

    in_step = placed(kernels, "_at")
    per_kernel = in_step.group_by("step_index").agg(
        pl.len().alias("kernels"),
        pl.col("dur_ns").sum().alias("gpu_ns"),
        pl.col("_replayed").sum().cast(pl.Int64).alias("replayed_kernels"),
    )
    busy = (
        union_ns(
            in_step.select("step_index", "device", "ts_ns", "end_ns"), ["step_index", "device"]
        )
        .group_by("step_index")
        .agg(pl.col("union_ns").sum().alias("gpu_busy_ns"))
    )
    calls = placed(runtime.filter(pl.col("name").str.contains(LAUNCH_API)), "ts_ns")
    launches = calls.group_by("step_index").agg(
        pl.col("dur_ns").sum().alias("launch_ns"),
        pl.col("name").str.contains(GRAPH_LAUNCH).sum().cast(pl.Int64).alias("graph_launches"),
    )
    counts = ["kernels", "gpu_ns", "replayed_kernels", "gpu_busy_ns", "launch_ns", "graph_launches"]
    per_token = pl.coalesce(
        pl.when(pl.col("tokens") > 0).then(pl.col("tokens")),
        pl.when(pl.col("batch_size") > 0).then(pl.col("batch_size")),
    )
    return (
        steps.join(per_kernel, on="step_index", how="left")
        .join(busy, on="step_index", how="left")
        .join(launches, on="step_index", how="left")
        .with_columns(pl.col(counts).fill_null(0).cast(pl.Int64))
        .with_columns(
            (1 - pl.col("gpu_busy_ns") / pl.col("dur_ns")).clip(0, 1).alias("gpu_idle_share"),
            (pl.col("dur_ns") / 1000 / per_token).alias("us_per_token"),
        )
        .sort("step_index")
    )
