"""TQ205 compile-overhead: torch.compile's compilation, recompilation and per-call cost."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.common import US, step_text, step_windows
from traceq.rules.finding import Finding

# Dynamo/Inductor compile phases (`dynamo_timed` ranges, recorded as CPU ops).
COMPILE = (
    r"^(dynamo|entire_frame_compile|_compile\.compile_inner|compile_attempt_\d+|backend_compile|"
    r"OutputGraph\.call_user_compiler|create_aot_dispatcher_function|compile_fx_inner|"
    r"inductor_compile|fx_codegen_and_compile|bytecode_tracing|GraphLowering\.\w+|"
    r"Scheduler\.codegen|compile_file|async_compile\.wait|PyCodeCache\.load_by_key_path|"
    r"aot_collect_metadata|_recursive_joint_graph_passes|_recursive_post_grad_passes)"
    r"( \(dynamo_timed\))?$"
)
# Phases that do not nest in one another, with the words a reader knows them by.
PHASES = {
    "bytecode_tracing": "Dynamo tracing",
    "GraphLowering.run": "Inductor lowering",
    "compile_file": "C++/Triton compile",
    "async_compile.wait": "waiting for compile workers",
}
REGION = r"^Torch-Compiled Region: (\d+)/(\d+)"
LOOKUP = "TorchDynamo Cache Lookup"
GRAPH_CALL = r"^## Call CompiledFxGraph"
WRAPPER_MARKERS = (
    "Pregraph bytecode",
    "AOTDispatcher Runtime Wrapper Prologue",
    "AOTDispatcher Runtime Wrapper Epilogue",
)


@rule(
    "TQ205",
    "compile-overhead",
    "warning",
    defaults={"min_compile_us": 1000.0, "min_share": 0.1},
)
def compile_overhead(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds time that `torch.compile` itself costs inside the profiled steps:

    - **compilation** (Dynamo tracing, AOTAutograd, Inductor code generation and the C++ /
      Triton compiler: the `dynamo`, `entire_frame_compile`, `inductor_compile`,
      `compile_file`, ... ranges, recorded as CPU ops or, by PyTorch 2.1-2.4, as
      `user_annotation` ranges) longer than `min_compile_us`, inside a step or, in a trace
      without `ProfilerStep`s, anywhere in it. A compile whose region then
      runs as `Torch-Compiled Region: F/C` with C > 0 (frame F compiled again) is a
      **recompilation**.
    - **per-call overhead** in steady state: `TorchDynamo Cache Lookup` (guard evaluation)
      plus the compiled region's wrapper (its time outside the `## Call CompiledFxGraph`
      range: pregraph bytecode, AOTDispatcher prologue/epilogue), reported when each
      iteration runs two or more compiled regions (graph breaks) and they cost at least
      `min_share` of the step. Regions are counted by frame id (`Torch-Compiled Region:
      F/C`): the same frame id again is the next iteration (a trace without
      `ProfilerStep`s is one window of many iterations) or another call of the same
      region, not a graph break.

    Savings model: compilation inside a step is all saved in steady state (warm caches, no
    recompiles), so the saving is its measured time. For per-call overhead with `k`
    distinct compiled regions per iteration (graph breaks split it), merging them into one
    saves `(k − 1) / k` of it, taken on the typical call (median overhead × calls) so one
    call stretched by the OS or the profiler's start-up does not set the estimate. One
    region per iteration is not reported: its fixed cost is not avoidable by merging (only
    a C++ wrapper or an AOTInductor export trims it).

    Not seen: compilation a trace records only as Python frames (PyTorch 2.0 and older,
    which wrote no compile ranges), compiles on a thread or process of their own (the
    compile workers' own time: only the main thread's `async_compile.wait` shows), and the
    per-call cost of a single compiled region per iteration.

    ## Why is this bad?
    A cold compile takes seconds to minutes; inside a profiled step it dwarfs everything
    and hides the steady state. Recompilations (shape or guard changes) pay it again at
    run time. For small graphs the fixed per-call cost of guards and wrappers can be a
    large share of each step.

    ## Example
    ```python
    model = torch.compile(model)
    with torch.profiler.profile(schedule=schedule(wait=0, warmup=0, active=3)) as prof:
        for x in batches:  # step 0 compiles; a new batch size recompiles
            model(x)
    ```

    ## Use instead
    ```python
    model = torch.compile(model, dynamic=True)  # or torch._dynamo.mark_dynamic(x, 0)
    model(example)                              # warm up before profiling
    with torch.profiler.profile(schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        ...
    ```
    Keep the FX graph / Inductor caches warm across runs, remove graph breaks
    (`torch._dynamo.explain`), and for tiny graphs try `torch._inductor.config.cpp_wrapper`.

    ## References
    - [torch.compile troubleshooting: recompilations](https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html)
    - [Compile-time caching in torch.compile](https://pytorch.org/tutorials/recipes/torch_compile_caching_tutorial.html)
    """
    ops = ctx.trace.ops
    if ops.height == 0 and ctx.trace.annotations.height == 0:
        return
    yield from _compilations(ctx, ops)
    yield from _per_call(ctx, ops)


def compile_ranges(ctx: Context) -> pl.DataFrame:
    """Dynamo/Inductor's compile ranges: CPU ops (`dynamo_timed` in recent PyTorch) and CPU
    annotations (`record_function` ranges, how PyTorch 2.1-2.4's `dynamo_timed` wrote them:
    category `user_annotation`), in the columns the rule reads."""
    columns = ["event", "name", "pid", "tid", "ts_ns", "end_ns", "dur_ns", "step", "module"]
    ops = ctx.trace.ops.filter(pl.col("name").str.contains(COMPILE)).select(columns)
    annotations = ctx.trace.annotations.filter(
        (pl.col("kind") == "cpu") & pl.col("name").str.contains(COMPILE)
    )
    annotations = annotations.with_columns(pl.lit(None, pl.String).alias("module"))
    return pl.concat(
        [ops.cast({"event": pl.Int64}), annotations.select(columns).cast({"event": pl.Int64})],
        how="vertical_relaxed",
    )


def _compilations(ctx: Context, ops: pl.DataFrame) -> Iterator[Finding]:
    compile_ops = compile_ranges(ctx)
    if compile_ops.height == 0:
        return
    outermost = _outermost_compiles(compile_ops)
    regions = ops.filter(pl.col("name").str.contains(REGION)).sort("ts_ns")
    for row in outermost.iter_rows(named=True):
        cost = row["dur_ns"] / US
        if cost < ctx.options["min_compile_us"]:
            continue
        recompile = _produced_recompile(regions, row)
        phases = _phases(compile_ops, row)
        kind = "recompilation" if recompile else "compilation"
        top = ", ".join(f"{PHASES[name]} {us / 1e6:,.2f} s" for name, us in phases.items())
        yield ctx.finding(
            message=(
                f"torch.compile {kind} inside {step_text(row['step'])}: {cost / 1e6:,.2f} s"
                + (f" ({top})" if top else "")
            ),
            step=row["step"],
            module=row["module"],
            ops=[row["event"]],
            time_us=cost,
            est_saving_us=cost,
            saving_model=f"measured {kind} time {cost:,.0f} µs; absent in a warmed-up steady state",
            fix=(
                "Mark dynamic dimensions (dynamic=True / torch._dynamo.mark_dynamic) and fix the "
                "guard failures that TORCH_LOGS=recompiles shows."
                if recompile
                else "Warm up (run the compiled model once) before profiling, and keep the "
                "Inductor/FX graph caches warm across runs."
            ),
            evidence={
                "kind": kind,
                "compile_event": row["name"],
                "phases_us": phases,
                "op_names": [row["name"]],
            },
        )


def _outermost_compiles(compile_ops: pl.DataFrame) -> pl.DataFrame:
    """Compile ranges not inside another, by time on each thread: other ranges
    (PythonDispatchMode, ...) sit between compile phases in the op tree, so parent links
    alone would split one compile."""
    return (
        compile_ops.sort("pid", "tid", "ts_ns")
        .with_columns(pl.col("end_ns").cum_max().shift(1).over("pid", "tid").alias("_reach"))
        .filter(pl.col("_reach").is_null() | (pl.col("ts_ns") >= pl.col("_reach")))
        .drop("_reach")
        .sort("ts_ns")
    )


def _produced_recompile(regions: pl.DataFrame, compile_row: dict) -> bool:
    """True when the first compiled region run after this compile, on its thread, has a
    compile id above 0 (`Torch-Compiled Region: F/C`, C > 0): Dynamo compiled frame F again."""
    after = regions.filter(
        (pl.col("tid") == compile_row["tid"]) & (pl.col("ts_ns") >= compile_row["end_ns"])
    )
    if after.height == 0:
        return False
    compile_id = after["name"].str.extract(REGION, 2).cast(pl.Int64)[0]
    return compile_id is not None and compile_id > 0


def _phases(compile_ops: pl.DataFrame, outer: dict) -> dict[str, float]:
    """Time per phase inside one compile (each counted once, not its `(dynamo_timed)`
    twin), largest first."""
    inside = compile_ops.filter(
        (pl.col("tid") == outer["tid"])
        & (pl.col("ts_ns") >= outer["ts_ns"])
        & (pl.col("end_ns") <= outer["end_ns"])
        & pl.col("name").is_in(list(PHASES))
    )
    totals = inside.group_by("name").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)
    return {name: ns / US for name, ns in totals.iter_rows()}


def _per_call(ctx: Context, ops: pl.DataFrame) -> Iterator[Finding]:
    regions = ops.filter(pl.col("name").str.contains(REGION))
    lookups = ops.filter(pl.col("name") == LOOKUP)
    if regions.height == 0 and lookups.height == 0:
        return
    wrapper = _wrapper_ns(ctx, ops, regions)
    # Each region run pays the cache lookup just before it: both are the call's overhead.
    calls = pl.concat(
        [
            wrapper.select("step", "event", "frame", "overhead_ns"),
            lookups.select(
                "step",
                pl.col("event").cast(pl.Int64),
                pl.lit(None, pl.Int64).alias("frame"),
                pl.col("dur_ns").alias("overhead_ns"),
            ),
        ]
    )
    # The typical call, not the sum of its occurrences: on a CPU trace one call stretched
    # by the OS (or the profiler's first call) would become the estimate. Taken per frame
    # (lookups on their own), since frames differ in cost.
    per_frame = (
        calls.with_columns(pl.col("frame").fill_null(-1))
        .group_by("step", "frame")
        .agg(
            pl.col("overhead_ns").sum(),
            (pl.col("overhead_ns").median() * pl.len()).alias("typical_ns"),
            pl.len().alias("runs"),
            pl.col("event"),
        )
    )
    is_region = pl.col("frame") >= 0
    per_step = per_frame.group_by("step").agg(
        pl.col("overhead_ns").sum(),
        pl.col("typical_ns").sum(),
        # Distinct frames, not region runs: a frame id that repeats is the next iteration
        # (or a second call) of the same region, not a graph break.
        is_region.sum().alias("regions"),
        pl.col("runs").filter(is_region).sum(),
        pl.col("event").list.explode(keep_nulls=False, empty_as_null=False).sort(),
    )
    steps = step_windows(ctx.trace).rename({"window_ns": "step_ns"})
    rows = per_step.join(steps, on="step", how="inner", nulls_equal=True).sort("step")
    for row in rows.iter_rows(named=True):
        share = row["overhead_ns"] / row["step_ns"] if row["step_ns"] else 0.0
        if share < ctx.options["min_share"] or row["regions"] < 2:
            continue  # one region per iteration: its fixed cost is not avoidable by merging
        cost = row["overhead_ns"] / US
        typical = min(cost, row["typical_ns"] / US)
        k = row["regions"]
        saving = typical * (k - 1) / k
        yield ctx.finding(
            severity="info",
            message=(
                f"torch.compile per-call overhead (guards + wrapper of {k} compiled regions, "
                f"{row['runs']} runs) is {share:.0%} of {step_text(row['step'])} "
                f"({cost:,.1f} µs)"
            ),
            step=row["step"],
            ops=row["event"],
            time_us=cost,
            est_saving_us=saving,
            saving_model=(
                f"{typical:,.1f} µs (median call × calls) × ({k} − 1) / {k}: merging the "
                f"{k} compiled regions each iteration runs into one pays guards and wrapper once"
            ),
            fix=(
                "Remove graph breaks so the step is one compiled region "
                "(torch._dynamo.explain); for tiny graphs try "
                "torch._inductor.config.cpp_wrapper = True or an AOTInductor export."
            ),
            evidence={
                "kind": "per-call",
                "regions": k,
                "region_runs": row["runs"],
                "share": share,
                "op_names": ["Torch-Compiled Region"],
            },
        )


def _wrapper_ns(ctx: Context, ops: pl.DataFrame, regions: pl.DataFrame) -> pl.DataFrame:
    """Per compiled region: its own time outside the graph call (`## Call CompiledFxGraph`
    annotation) and outside the regions nested in it with their cache lookups: after a
    graph break the resume frame's region runs *inside* the region of the frame that broke,
    and its graph is compute, its wrapper its own (a compile of the resume frame, there
    too, is TQ205's compilation finding). Without the annotation: the region's wrapper
    markers."""
    schema = {"step": pl.Int64, "event": pl.Int64, "frame": pl.Int64, "overhead_ns": pl.Int64}
    if regions.height == 0:
        return pl.DataFrame(schema=schema)
    columns = ["event", "pid", "tid", "ts_ns", "end_ns", "dur_ns"]
    calls = ctx.trace.annotations.filter(
        (pl.col("kind") == "cpu") & pl.col("name").str.contains(GRAPH_CALL)
    ).select(columns)
    items = pl.concat(
        [
            frame.select(columns)
            .cast({"event": pl.Int64})
            .with_columns(pl.lit(kind).alias("_kind"))
            for kind, frame in (
                ("call", calls),
                (
                    "nested",
                    ops.filter(pl.col("name").str.contains(REGION) | (pl.col("name") == LOOKUP)),
                ),
                # A recompile of the resume frame runs inside the region that broke.
                ("nested", _outermost_compiles(compile_ranges(ctx))),
                ("marker", ops.filter(pl.col("name").is_in(WRAPPER_MARKERS))),
            )
        ]
    )
    spans = regions.select(
        pl.col("event").cast(pl.Int64),
        "step",
        "pid",
        "tid",
        "ts_ns",
        "end_ns",
        "dur_ns",
        pl.col("name").str.extract(REGION, 1).cast(pl.Int64).alias("frame"),
    )
    # Each item belongs to the innermost region holding it (the one that started last).
    owned = (
        items.join(
            spans.select(
                pl.col("event").alias("_region"),
                "pid",
                "tid",
                pl.col("ts_ns").alias("_start"),
                pl.col("end_ns").alias("_end"),
            ),
            on=["pid", "tid"],
        )
        .filter(
            (pl.col("event") != pl.col("_region"))
            & (pl.col("ts_ns") >= pl.col("_start"))
            & (pl.col("end_ns") <= pl.col("_end"))
        )
        .sort("_start")
        .group_by("event", maintain_order=True)
        .last()
        .group_by("_region")
        .agg(
            pl.col("dur_ns").filter(pl.col("_kind") == kind).sum().alias(f"_{kind}")
            for kind in ("call", "nested", "marker")
        )
    )
    joined = spans.join(owned.rename({"_region": "event"}), on="event", how="left").fill_null(0)
    overhead = (
        pl.when(pl.col("_call") > 0)
        .then(pl.col("dur_ns") - pl.col("_call") - pl.col("_nested"))
        .otherwise(pl.col("_marker"))
        .clip(0)
    )
    return joined.select("step", "event", "frame", overhead.alias("overhead_ns"))


RULE = compile_overhead
