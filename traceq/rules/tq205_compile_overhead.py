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
      `compile_file`, ... ranges) longer than `min_compile_us`. A compile whose region then
      runs as `Torch-Compiled Region: F/C` with C > 0 (frame F compiled again) is a
      **recompilation**.
    - **per-call overhead** in steady state: `TorchDynamo Cache Lookup` (guard evaluation)
      plus the compiled region's wrapper (its time outside the `## Call CompiledFxGraph`
      range: pregraph bytecode, AOTDispatcher prologue/epilogue), reported when a step runs
      two or more compiled regions (graph breaks) and they cost at least `min_share` of it.

    Savings model: compilation inside a step is all saved in steady state (warm caches, no
    recompiles), so the saving is its measured time. For per-call overhead with `k` compiled
    regions in the step (graph breaks split it), merging them into one saves `(k − 1) / k`
    of it. One region per step is not reported: its fixed cost is not avoidable by merging
    (only a C++ wrapper or an AOTInductor export trims it).

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
    if ops.height == 0:
        return
    yield from _compilations(ctx, ops)
    yield from _per_call(ctx, ops)


def _compilations(ctx: Context, ops: pl.DataFrame) -> Iterator[Finding]:
    compile_ops = ops.filter(pl.col("name").str.contains(COMPILE))
    if compile_ops.height == 0:
        return
    # Outermost by time on each thread: other ranges (PythonDispatchMode, ...) sit between
    # compile phases in the op tree, so parent links alone would split one compile.
    outermost = (
        compile_ops.sort("pid", "tid", "ts_ns")
        .with_columns(pl.col("end_ns").cum_max().shift(1).over("pid", "tid").alias("_reach"))
        .filter(pl.col("_reach").is_null() | (pl.col("ts_ns") >= pl.col("_reach")))
        .sort("ts_ns")
    )
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
    per_step = (
        pl.concat(
            [
                wrapper.select("step", "event", "overhead_ns", pl.lit(1).alias("is_region")),
                lookups.select(
                    "step",
                    pl.col("event").cast(pl.Int64),
                    pl.col("dur_ns").alias("overhead_ns"),
                    pl.lit(1).alias("is_region").mul(0),
                ),
            ]
        )
        .group_by("step")
        .agg(
            pl.col("overhead_ns").sum(),
            pl.col("is_region").sum().alias("regions"),
            pl.col("event"),
        )
    )
    steps = step_windows(ctx.trace).rename({"window_ns": "step_ns"})
    rows = per_step.join(steps, on="step", how="inner", nulls_equal=True).sort("step")
    for row in rows.iter_rows(named=True):
        share = row["overhead_ns"] / row["step_ns"] if row["step_ns"] else 0.0
        if share < ctx.options["min_share"] or row["regions"] < 2:
            continue  # one region per step: its fixed cost is not avoidable by merging
        cost = row["overhead_ns"] / US
        k = max(1, row["regions"])
        saving = cost * (k - 1) / k
        yield ctx.finding(
            severity="info",
            message=(
                f"torch.compile per-call overhead (guards + wrapper of {k} compiled "
                f"region{'s' if k > 1 else ''}) is {share:.0%} of {step_text(row['step'])} "
                f"({cost:,.1f} µs)"
            ),
            step=row["step"],
            ops=row["event"],
            time_us=cost,
            est_saving_us=saving,
            saving_model=(
                f"{cost:,.1f} µs × ({k} − 1) / {k}: merging the step's compiled regions into one "
                "pays guards and wrapper once"
            ),
            fix=(
                "Remove graph breaks so the step is one compiled region "
                "(torch._dynamo.explain); for tiny graphs try "
                "torch._inductor.config.cpp_wrapper = True or an AOTInductor export."
            ),
            evidence={
                "kind": "per-call",
                "regions": k,
                "share": share,
                "op_names": ["Torch-Compiled Region"],
            },
        )


def _wrapper_ns(ctx: Context, ops: pl.DataFrame, regions: pl.DataFrame) -> pl.DataFrame:
    """Per compiled region: its time outside the graph call (`## Call CompiledFxGraph`
    annotation on the same thread), or, without that annotation, its wrapper markers."""
    if regions.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "event": pl.Int64, "overhead_ns": pl.Int64})
    calls = ctx.trace.annotations.filter(
        (pl.col("kind") == "cpu") & pl.col("name").str.contains(GRAPH_CALL)
    ).select(
        "pid", "tid", "ts_ns", pl.col("end_ns").alias("_call_end"), pl.col("dur_ns").alias("_call")
    )
    markers = ops.filter(pl.col("name").is_in(WRAPPER_MARKERS)).select(
        "pid", "tid", "ts_ns", pl.col("dur_ns").alias("_marker")
    )
    spans = regions.select("event", "step", "pid", "tid", "ts_ns", "end_ns", "dur_ns")
    inside_calls = _contained(spans, calls, "_call")
    inside_markers = _contained(spans, markers, "_marker")
    joined = spans.join(inside_calls, on="event", how="left").join(
        inside_markers, on="event", how="left"
    )
    overhead = (
        pl.when(pl.col("_call").fill_null(0) > 0)
        .then(pl.col("dur_ns") - pl.col("_call"))
        .otherwise(pl.col("_marker").fill_null(0))
    )
    return joined.select("step", pl.col("event").cast(pl.Int64), overhead.alias("overhead_ns"))


def _contained(spans: pl.DataFrame, items: pl.DataFrame, value: str) -> pl.DataFrame:
    """Sum of `value` over items starting inside each span on the same thread."""
    if items.height == 0:
        return pl.DataFrame(schema={"event": spans["event"].dtype, value: pl.Int64})
    pairs = items.join(
        spans.select("event", "pid", "tid", pl.col("ts_ns").alias("_s"), "end_ns"),
        on=["pid", "tid"],
        how="inner",
    )
    pairs = pairs.filter((pl.col("ts_ns") >= pl.col("_s")) & (pl.col("ts_ns") < pl.col("end_ns")))
    return pairs.group_by("event").agg(pl.col(value).sum())


RULE = compile_overhead
