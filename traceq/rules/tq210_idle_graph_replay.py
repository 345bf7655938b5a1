"""TQ210 idle-graph-replay: a serving step replays CUDA/HIP graphs, yet its GPU sits idle.

A graph replay removes the launch overhead *inside* the graph: one `cudaGraphLaunch`
enqueues hundreds of kernels back to back. What it cannot remove is the CPU work around
it: scheduling the next batch, preparing inputs, sampling, detokenizing, waiting on a
blocking copy. When that work is not overlapped with the GPU, each engine step
(`relations.inference`) is mostly GPU idle, however fast the graph. The rule reads each
step's GPU busy time (union of the activities it launched), the replayed graph's own
busy share from its first kernel to its last, and the longest CPU work of the step.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.relations.inference import inference_steps
from traceq.relations.intervals import union_ns
from traceq.relations.launches import GRAPH_LAUNCH
from traceq.rules.base import Context, rule
from traceq.rules.finding import Finding

DEFAULTS = {"min_idle_share": 0.5, "min_us": 100.0}


@rule("TQ210", "idle-graph-replay", "warning", defaults=DEFAULTS)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds engine steps (vLLM `execute_*`, SGLang `step[...]`) that replay CUDA/HIP graphs
    while the GPU is idle for most of the step (`min_idle_share` of its wall time), and
    says where the idle is: outside the graph (the graph's kernels keep the GPU busy from
    the first to the last) or inside it, and which CPU work of the step lasted longest.

    ## Why is this bad?
    The GPU does the step's work in a fraction of the step; the rest of the step is CPU
    time (scheduling, input preparation, sampling, a blocking copy) during which the GPU
    waits. A graph already removed the launch overhead inside the graph: more fusion or
    a larger graph will not shorten this step, overlapping the CPU with the GPU will.

    Estimated saving: the step's GPU-idle time the GPU's own work could hide it behind,
    i.e. the smaller of the idle time and the GPU busy time (overlap schedules the next
    step's CPU work while this step's graph runs; it cannot hide more than that).

    ## Example
    A decode step of 466 ms whose graph replay keeps the GPU busy for 9.8 ms: the CPU
    blocked 463 ms in `aten::copy_` (a device-to-host copy) before the replay.

    ## Use instead
    Overlap scheduling: SGLang's overlap scheduler (on by default; not
    `--disable-overlap-schedule`), vLLM's async scheduling (`--async-scheduling`). Then
    profile the CPU side (`with_stack=True`, or `py-spy`) for what runs between replays: a
    `.item()`, `.tolist()` or `.cpu()` on the step's results makes the CPU wait.

    ## Options
    - `min_idle_share` (0.5): the share of the step's wall time the GPU is idle.
    - `min_us` (100): leave out steps shorter than this.

    ## References
    - SGLang, "Zero-overhead batch scheduler":
      https://lmsys.org/blog/2024-12-04-sglang-v0-4/
    - vLLM, `--async-scheduling`: https://docs.vllm.ai/en/latest/configuration/engine_args.html
    """
    steps = inference_steps(ctx.trace)
    if steps.height == 0:
        return
    idle = steps.filter(
        (pl.col("graph_launches") > 0)
        & (pl.col("gpu_idle_share") >= ctx.options["min_idle_share"])
        & (pl.col("dur_ns") >= ctx.options["min_us"] * 1000)
    )
    if idle.height == 0:
        return
    calls = ctx.trace.select("runtime", "event", "name", "ts_ns", "dur_ns")
    graph_calls = calls.filter(pl.col("name").str.contains(GRAPH_LAUNCH))
    kernels = ctx.trace.select(
        "kernels", "event", "device", "ts_ns", "end_ns", "dur_ns", "runtime_event"
    ).with_columns(
        pl.col("runtime_event").is_in(graph_calls["event"].implode()).fill_null(False).alias("_rep")
    )
    cpu = _cpu_work(ctx, graph_calls)
    for step in idle.iter_rows(named=True):
        start, end = step["ts_ns"], step["end_ns"]
        launches = graph_calls.filter(pl.col("ts_ns").is_between(start, end, closed="left"))
        replayed = kernels.filter(
            pl.col("_rep") & pl.col("runtime_event").is_in(launches["event"].implode())
        )
        if replayed.height == 0:
            continue
        first, last = int(replayed["ts_ns"].min()), int(replayed["end_ns"].max())
        graph_busy = int(
            union_ns(
                replayed.select(pl.lit(0).alias("_k"), "device", "ts_ns", "end_ns"),
                ["_k", "device"],
            )["union_ns"].sum()
        )
        graph_share = graph_busy / max(last - first, 1)
        busy_ns, wall_ns = step["gpu_busy_ns"], step["dur_ns"]
        idle_ns = max(wall_ns - busy_ns, 0)
        longest = (
            cpu.filter(pl.col("ts_ns").is_between(start, end, closed="left"))
            .sort("dur_ns", descending=True)
            .head(1)
        )
        worst = longest.row(0, named=True) if longest.height else None
        what = (
            f"; longest CPU work in it: `{worst['name']}` {worst['dur_ns'] / 1e3:,.1f} µs"
            + (f" (in `{worst['call']}`)" if worst["call"] else "")
            if worst
            else ""
        )
        where = (
            f"the graph kept the GPU {graph_share:.0%} busy from its first kernel to its last, "
            "so the idle is CPU work around the replay (scheduling, input preparation, "
            "sampling, waits), not launch overhead inside the graph"
            if graph_share >= 0.8
            else f"the GPU is idle inside the replay too ({graph_share:.0%} busy from its "
            "first kernel to its last: kernels waiting on memory copies or host nodes)"
        )
        phase = ", ".join(
            str(part)
            for part in (step["phase"], step["batch_size"] and f"batch {step['batch_size']}")
            if part
        )
        saving_ns = min(idle_ns, busy_ns)
        yield ctx.finding(
            message=(
                f"engine step {step['step_index']}"
                + (f" ({phase})" if phase else "")
                + f" replays {_count(launches.height, 'CUDA/HIP graph')} but the GPU is idle "
                f"{step['gpu_idle_share']:.1%} of it: {busy_ns / 1e3:,.1f} µs of GPU work in a "
                f"{wall_ns / 1e3:,.1f} µs step; {where}{what}"
            ),
            step=None,
            ops=[int(worst["event"])] if worst and worst["kind"] == "op" else [],
            time_us=idle_ns / 1e3,
            est_saving_us=saving_ns / 1e3,
            saving_model=(
                f"overlap scheduling hides the CPU work of the next step behind this step's "
                f"GPU work: at most min(idle {idle_ns / 1e3:,.1f} µs, GPU busy "
                f"{busy_ns / 1e3:,.1f} µs) per step"
            ),
            fix=(
                "Overlap the CPU's scheduling with the GPU: SGLang's overlap scheduler (the "
                "default; check the server does not run with `--disable-overlap-schedule`), "
                "vLLM's `--async-scheduling`. Then profile the CPU side (`with_stack=True` or "
                "`py-spy`) for what runs between replays; a `.item()`, `.tolist()` or "
                "`.cpu()` on the step's results blocks the CPU until the GPU is done."
            ),
            evidence={
                "saves_from": "gpu_idle",
                "window_ns": [start, end],
                "step_index": step["step_index"],
                "engine": step["engine"],
                "phase": step["phase"],
                "batch_size": step["batch_size"],
                "step_us": round(wall_ns / 1e3, 3),
                "gpu_busy_us": round(busy_ns / 1e3, 3),
                "gpu_idle_share": round(step["gpu_idle_share"], 4),
                "graph_launches": launches["event"].cast(pl.Int64).to_list(),
                "replayed_kernels": replayed.height,
                "replay_window_us": round((last - first) / 1e3, 3),
                "replay_busy_share": round(graph_share, 4),
                "longest_cpu": (
                    {
                        "event": int(worst["event"]),
                        "kind": worst["kind"],
                        "name": worst["name"],
                        "us": round(worst["dur_ns"] / 1e3, 3),
                        "call": worst["call"],
                    }
                    if worst
                    else None
                ),
            },
        )


def _cpu_work(ctx: Context, graph_calls: pl.DataFrame) -> pl.DataFrame:
    """Top-level ops the trace recorded (not the copies of a replayed graph's ops) and
    runtime calls other than graph launches: `event`, `kind`, `name`, `ts_ns`, `dur_ns`,
    `call` (for an op, the longest runtime call made inside it: what it waited in)."""
    ops = ctx.trace.ops
    recorded = ~pl.col("replayed") if "replayed" in ops.columns else pl.lit(True)
    top = ops.filter(recorded & pl.col("parent").is_null()).select(
        pl.col("event").cast(pl.Int64),
        "name",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        pl.lit("op").alias("kind"),
    )
    runtime = ctx.trace.select("runtime", "event", "name", "pid", "tid", "ts_ns", "dur_ns").join(
        graph_calls.select("event"), on="event", how="anti"
    )
    inside = (
        top.select("event", "pid", "tid", pl.col("ts_ns").alias("_s"), pl.col("dur_ns").alias("_d"))
        .join(runtime.select("pid", "tid", "ts_ns", "dur_ns", "name"), on=["pid", "tid"])
        .filter(
            (pl.col("ts_ns") >= pl.col("_s"))
            & (pl.col("ts_ns") + pl.col("dur_ns") <= pl.col("_s") + pl.col("_d"))
        )
        .sort("dur_ns", descending=True)
        .group_by("event", maintain_order=True)
        .agg(pl.col("name").first().alias("call"))
    )
    top = top.join(inside, on="event", how="left")
    within = top.select("pid", "tid", pl.col("ts_ns").alias("_s"), pl.col("dur_ns").alias("_d"))
    loose = (
        runtime.with_columns(pl.col("event").cast(pl.Int64))
        .join(
            runtime.with_columns(pl.col("event").cast(pl.Int64))
            .join(within, on=["pid", "tid"])
            .filter(
                (pl.col("ts_ns") >= pl.col("_s"))
                & (pl.col("ts_ns") + pl.col("dur_ns") <= pl.col("_s") + pl.col("_d"))
            )
            .select("event"),
            on="event",
            how="anti",
        )
        .select(
            "event",
            "name",
            "pid",
            "tid",
            "ts_ns",
            "dur_ns",
            pl.lit("runtime").alias("kind"),
            pl.lit(None, dtype=pl.String).alias("call"),
        )
    )
    return pl.concat([top, loose])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


RULE = check
