"""TQ201 launch-bound: stretches where the GPU idles between kernels, waiting for launches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceq.relations.inference import inference_steps
from traceq.rules.base import Context, rule
from traceq.rules.common import US, common_module, step_text
from traceq.rules.finding import Finding


@rule(
    "TQ201",
    "launch-bound",
    "warning",
    defaults={
        "min_gap_us": 1.0,
        "max_gap_us": 1000.0,
        "window": 16,
        "min_starved_share": 0.5,
        "min_kernels": 20,
        "min_idle_share": 0.3,
        "min_idle_us": 50.0,
        "graph_gap_us": 1.0,
    },
)
def launch_bound(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds regions where the GPU waits on the CPU: kernels are launched only after the
    previous one has started (the launch queue is empty), and the idle gaps between them
    are as long as, or longer than, the kernels themselves.

    A transition between two consecutive GPU activities on a device is *starved* when the
    GPU sat idle for at least `min_gap_us` and the next kernel's launch call began only after
    the previous kernel had started. A region is a run of kernels in one step where, over a
    sliding `window` of transitions, at least `min_starved_share` are starved. A gap longer
    than `max_gap_us` ends a region: the CPU was doing other work then (loading data,
    Python between benchmark cases), which no launch mechanism removes. A region is
    reported when it holds `min_kernels` kernels or more and the GPU idles at least
    `min_idle_share` of its span (and `min_idle_us` in all).

    Savings model: the sum of the idle gaps in the region, minus the gap a CUDA graph
    replay still leaves between consecutive kernels (`graph_gap_us` per transition). The
    kernels themselves still run; only the waiting goes.

    CPU-only traces have no GPU queue to starve, so this rule is silent there (per-op
    dispatch cost on the CPU is TQ204's).

    ## Why is this bad?
    In the overhead-bound regime the GPU finishes each kernel faster than Python, the
    dispatcher and the driver can launch the next one: wall time is set by the CPU, and a
    faster GPU or a faster kernel changes nothing.

    ## Example
    ```python
    for _ in range(steps):
        y = small_mlp(x)  # dozens of 5 µs kernels, each launched after ~20 µs of CPU work
    ```

    ## Use instead
    ```python
    graphed = torch.cuda.make_graphed_callables(small_mlp, (x,))  # or:
    small_mlp = torch.compile(small_mlp, mode="reduce-overhead")  # CUDA graphs + fusion
    ```
    Larger batches also move work per launch up. In a serving engine's decode step
    (`relations.inference`: vLLM `execute_*`, SGLang `step[DECODE ...]`) that replayed no
    graph, the finding names the engine step and the engine's own switch: vLLM without
    `--enforce-eager`, SGLang without `--disable-cuda-graph`.

    ## References
    - [CUDA graphs in PyTorch](https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/)
    - [Making Deep Learning Go Brrrr: overhead](https://horace.io/brrr_intro.html)
    """
    opts = ctx.options
    activities = ctx.trace.kernels
    if activities.height == 0:
        return
    min_gap_ns = int(opts["min_gap_us"] * US)
    max_gap_ns = int(opts["max_gap_us"] * US)
    timeline = (
        activities.sort("device", "ts_ns")
        .with_columns(
            pl.col("end_ns").cum_max().shift(1).over("device").alias("_reach"),
            pl.col("ts_ns").shift(1).over("device").alias("_prev_ts"),
        )
        .with_columns((pl.col("ts_ns") - pl.col("_reach")).clip(0).fill_null(0).alias("_gap"))
        .with_columns(
            (
                (pl.col("launch_ts_ns") >= pl.col("_prev_ts"))
                & (pl.col("_gap") >= min_gap_ns)
                & (pl.col("_gap") <= max_gap_ns)
            )
            .fill_null(False)
            .alias("_starved")
        )
        .with_columns(
            pl.col("_starved")
            .cast(pl.Float64)
            .rolling_mean(opts["window"], min_samples=1, center=True)
            .over("device")
            .ge(opts["min_starved_share"])
            .alias("_in")
        )
    )
    new_run = (
        pl.col("_in").ne_missing(pl.col("_in").shift(1))
        | pl.col("step").ne_missing(pl.col("step").shift(1))
        | (pl.col("_gap") > max_gap_ns)  # the CPU was busy elsewhere: not launch overhead
    )
    timeline = timeline.with_columns(new_run.fill_null(True).cum_sum().over("device").alias("_run"))
    regions = (
        timeline.filter(pl.col("_in"))
        .group_by("device", "_run")
        .agg(
            pl.len().alias("n"),
            pl.col("step").first(),
            pl.col("ts_ns").min().alias("start"),
            pl.col("end_ns").max().alias("end"),
            pl.col("_gap").slice(1).sum().alias("idle_ns"),
            pl.col("_starved").slice(1).sum().alias("starved"),
            pl.col("dur_ns").median().alias("kernel_median_ns"),
            pl.col("_gap").slice(1).median().alias("gap_median_ns"),
            pl.col("event"),
            pl.col("op_event").drop_nulls().unique(maintain_order=True),
            pl.col("module").drop_nulls(),
            pl.col("runtime_event").drop_nulls(),
            pl.col("launch_ts_ns").min().alias("launch_start"),
        )
        .with_columns((pl.col("end") - pl.col("start")).alias("span_ns"))
        .with_columns((pl.col("idle_ns") / pl.col("span_ns")).alias("idle_share"))
        .filter(
            (pl.col("n") >= opts["min_kernels"])
            & (pl.col("idle_share") >= opts["min_idle_share"])
            & (pl.col("idle_ns") >= opts["min_idle_us"] * US)
        )
        .sort("start")
    )
    if regions.height == 0:
        return
    launch_median = _launch_median_us(ctx, regions)
    top_ops = _top_ops(ctx, regions)
    graph_gap = float(opts["graph_gap_us"])
    engine_steps = inference_steps(ctx.trace)
    eager_decode = _eager_decode_steps(engine_steps)
    for row in regions.iter_rows(named=True):
        idle_us = row["idle_ns"] / US
        residual = (row["n"] - 1) * graph_gap
        saving = max(0.0, idle_us - residual)
        span_us = row["span_ns"] / US
        engine = _engine_step(engine_steps, row["launch_start"])
        where = _where(row["step"], engine)
        yield ctx.finding(
            message=(
                f"GPU {row['device']} idles {row['idle_share']:.0%} of {span_us:,.0f} µs in "
                f"{where} waiting for launches: {row['n']} kernels (median "
                f"{row['kernel_median_ns'] / US:.1f} µs) with median gaps of "
                f"{row['gap_median_ns'] / US:.1f} µs"
            ),
            step=row["step"],
            module=common_module(row["module"]),
            ops=row["op_event"],
            kernels=row["event"],
            time_us=idle_us,
            est_saving_us=saving,
            saving_model=(
                f"idle gaps {idle_us:,.1f} µs − CUDA-graph residual gap {graph_gap:g} µs × "
                f"{row['n'] - 1} transitions"
            ),
            fix=_fix(eager_decode, row["launch_start"]),
            evidence={
                "device": row["device"],
                "kernels": row["n"],
                "span_us": span_us,
                "idle_us": idle_us,
                "idle_share": row["idle_share"],
                "starved_transitions": row["starved"],
                "kernel_median_us": row["kernel_median_ns"] / US,
                "gap_median_us": (row["gap_median_ns"] or 0) / US,
                "launch_call_median_us": launch_median.get(row["_run"]),
                "top_ops": top_ops.get(row["_run"], []),
                # A region is identified by where it is, not by the many ops inside it.
                "op_names": [],
                "kernel_names": [],
                "start_ns": row["start"],
                "end_ns": row["end"],
                # What the saving comes from, for a report's total (each µs counted once).
                "saves_from": "gpu_idle",
                "window_ns": [row["start"], row["end"]],
                **({"engine_step": engine["step_index"]} if engine else {}),
            },
        )


def _eager_decode_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """Serving decode steps (`relations.inference`) that replayed no CUDA graph."""
    return steps.filter((pl.col("phase") == "decode") & (pl.col("graph_launches") == 0))


def _engine_step(steps: pl.DataFrame, launch_start: int | None) -> dict[str, Any] | None:
    """The serving engine step (`relations.inference`) whose CPU window holds the region's
    first launch: a serving trace has no profiler steps, its engine's steps are the unit."""
    if launch_start is None:
        return None
    inside = steps.filter((pl.col("ts_ns") <= launch_start) & (launch_start < pl.col("end_ns")))
    return inside.row(0, named=True) if inside.height else None


def _where(step: int | None, engine: dict[str, Any] | None) -> str:
    """The region's profiler step, else the engine step around it ("engine step 0 (decode,
    batch 32)", as TQ210 names it), else the trace."""
    if step is not None or engine is None:
        return step_text(step)
    batch = engine["batch_size"] and f"batch {engine['batch_size']}"
    details = ", ".join(str(part) for part in (engine["phase"], batch) if part)
    return f"engine step {engine['step_index']}" + (f" ({details})" if details else "")


def _fix(eager_decode: pl.DataFrame, launch_start: int | None) -> str:
    """The fix: CUDA graphs, named the serving engine's way inside an eager decode step."""
    inside = (
        launch_start is not None
        and eager_decode.filter(
            (pl.col("ts_ns") <= launch_start) & (launch_start < pl.col("end_ns"))
        ).height
    )
    if inside:
        return (
            "This decode step launches its kernels one by one, without CUDA graphs: enable "
            "them (vLLM: drop --enforce-eager, compilation_config cudagraph_mode "
            "FULL_AND_PIECEWISE; SGLang: drop --disable-cuda-graph, raise "
            "--cuda-graph-max-bs to cover this batch; torch.compile(mode='reduce-overhead') "
            "elsewhere). A replay launches the whole step at once."
        )
    return (
        "Capture the region in a CUDA graph (torch.cuda.graphs / "
        "torch.compile(mode='reduce-overhead')), or fuse its kernels with "
        "torch.compile so fewer launches are needed."
    )


def _top_ops(ctx: Context, regions: pl.DataFrame, n: int = 5) -> dict[int, list[dict]]:
    """The ops that launched most kernels in each region (evidence of what runs there)."""
    launched = regions.select("_run", pl.col("op_event").alias("event")).explode("event")
    counts = ctx.trace.kernels.group_by("op_event").agg(pl.len().alias("kernels"))
    named = (
        launched.join(ctx.trace.ops.select(pl.col("event").cast(pl.Int64), "name"), on="event")
        .join(counts.rename({"op_event": "event"}), on="event", how="left")
        .group_by("_run", "name")
        .agg(pl.col("kernels").sum())
        .sort("kernels", "name", descending=[True, False])  # ties by name: same every run
        .group_by("_run", maintain_order=True)
        .head(n)
    )
    top: dict[int, list[dict]] = {}
    for run, name, kernels in named.iter_rows():
        top.setdefault(run, []).append({"name": name, "kernels": kernels})
    return top


def _launch_median_us(ctx: Context, regions: pl.DataFrame) -> dict[int, float | None]:
    """Median CPU duration of the launch calls of each region (evidence of the CPU's cost)."""
    calls = regions.select("_run", pl.col("runtime_event").alias("event")).explode("event")
    durations = ctx.trace.runtime.select("event", "dur_ns")
    medians = (
        calls.join(durations, on="event", how="inner")
        .group_by("_run")
        .agg(pl.col("dur_ns").median())
    )
    return {run: (d / US if d is not None else None) for run, d in medians.iter_rows()}


RULE = launch_bound
