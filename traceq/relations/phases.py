"""Setup phases: the CPU time spent capturing CUDA graphs, compiling, warming up, or inside the
profiler's own bookkeeping — one-time work that is not the steady state a user optimizes.

A serving engine records its CUDA-graph capture (vLLM's `capture_model`, SGLang's
`cuda_graph_runner.capture`, `torch.cuda.graph`'s `__enter__`), `torch.compile` its
compilation (Dynamo's and Inductor's spans, `async_compile.wait`, Triton's compiler), and
the profiler synchronizes the device when it stops. A sync, an idle gap or a copy inside
them happens once, with nothing queued that it could delay: a finding there would be wrong
(issue: TQ202 on `hipDeviceSynchronize` under `capture_32_FULL`). Phases are found by name
on the CPU frames that enclose the work — Python frames (`with_stack`), ops and user
annotations — on the same thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

SETUP_PHASES: dict[str, str] = {
    "graph capture": (
        r"^torch/cuda/graphs\.py\(\d+\): "  # torch.cuda.graph(...) and capture_begin/end
        r"|^capture_\d+_(?:FULL|PIECEWISE|DECODE|EXTEND|PREFILL|NONE)\b"  # vLLM/SGLang ranges
        r"|cuda_graph_runner\.py\(\d+\): _?capture"  # SGLang
        r"|gpu_model_runner\.py\(\d+\): (?:capture_model|_capture_cudagraphs)$"  # vLLM v1
        r"|^torch/_inductor/cudagraph_trees\.py\(\d+\): (?:record|_record)"
        r"|CUDAGraphNode\.record"
    ),
    "compilation": (
        r"\(dynamo_timed\)$|^(?:entire_frame_compile|backend_compile|inductor_compile"
        r"|compile_fx_inner|fx_codegen_and_compile|create_aot_dispatcher_function)$"
        r"|^torch/_inductor/async_compile\.py\(\d+\): wait"
        r"|^triton/compiler/compiler\.py\(\d+\): compile"
        r"|^torch/_dynamo/convert_frame\.py\(\d+\): "
    ),
    "warm-up": r"gpu_worker\.py\(\d+\): compile_or_warm_up_model$",
    "profiler": (
        r"^torch/profiler/profiler\.py\(\d+\): "  # the profiler's own start/stop/step
        r"|^torch/autograd/profiler\.py\(\d+\): "
    ),
}
"""Each phase, and the names of the CPU frames (Python frames, ops, annotations) that open it."""

_SCHEMA = {"phase": pl.String, "pid": pl.String, "tid": pl.String, "ts_ns": pl.Int64}


def setup_ranges(trace: LoadedTrace) -> pl.DataFrame:
    """The outermost setup range of each thread: `phase`, `pid`, `tid`, `ts_ns`, `end_ns`
    (`pid` and `tid` as text). Nested frames of one phase collapse into the outermost one;
    the phase is the outermost frame's."""
    columns = ["name", "pid", "tid", "ts_ns", "end_ns"]
    frames = [trace.ops.select(columns), trace.annotations.select(columns)]
    if "python" in trace.frames:
        frames.append(trace.python.select(columns))
    named = pl.concat(
        [f.with_columns(pl.col("pid", "tid").cast(pl.String)) for f in frames],
        how="vertical_relaxed",
    )
    phase = pl.lit(None, dtype=pl.String)
    for name, pattern in reversed(SETUP_PHASES.items()):  # the first listed wins
        phase = pl.when(pl.col("name").str.contains(pattern)).then(pl.lit(name)).otherwise(phase)
    marked = (
        named.with_columns(phase.alias("phase"))
        .drop_nulls("phase")
        .sort("pid", "tid", "ts_ns", pl.col("end_ns"), descending=[False, False, False, True])
    )
    reach = pl.col("end_ns").cum_max().shift(1).over("pid", "tid")
    return marked.filter(reach.is_null() | (pl.col("ts_ns") >= reach)).select(
        "phase", "pid", "tid", "ts_ns", "end_ns"
    )


def setup_phase_of(rows: pl.DataFrame, trace: LoadedTrace) -> pl.Series:
    """For each of `rows` (with `pid`, `tid`, `ts_ns`), the setup phase it starts in, or null:
    one as-of join against the outermost ranges of its thread."""
    ranges = setup_ranges(trace)
    probe = rows.select(
        pl.col("pid").cast(pl.String), pl.col("tid").cast(pl.String), "ts_ns"
    ).with_row_index("_row")
    if ranges.height == 0 or probe.height == 0:
        return pl.Series("setup_phase", [None] * rows.height, dtype=pl.String)
    found = probe.sort("ts_ns").join_asof(
        ranges.rename({"ts_ns": "_start"}).sort("_start"),
        left_on="ts_ns",
        right_on="_start",
        by=["pid", "tid"],
        strategy="backward",
        check_sortedness=False,
    )
    inside = pl.when(pl.col("ts_ns") < pl.col("end_ns")).then(pl.col("phase"))
    return found.sort("_row").select(inside.alias("setup_phase"))["setup_phase"]
