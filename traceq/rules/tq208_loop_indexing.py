"""TQ208 loop-indexing: a Python loop indexing a tensor one element or row at a time.

Mirrors PyTorch's pattern matcher (`ForLoopIndexingPattern`): an `aten::select` followed by
the ops up to the next `aten::select`, that same sequence of op names repeated back to
back among sibling ops (same thread, same parent op) at least `min_repeats` times. The
sequence is cut at each `select`, so `t[i] = i` (`select`, `fill_`) and `x[i].sum()`
(`select`, `sum`) are periods; one finding per run.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.finding import Finding

SELECT = "aten::select"
DEFAULTS = {"min_repeats": 10}


@rule("TQ208", "loop-indexing", "info", defaults=DEFAULTS)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds Python loops that index a tensor element by element: the same short sequence of
    ops starting with `aten::select` (`t[i]`) repeated at least `min_repeats` times in a
    row, as PyTorch's profiler pattern matcher's `ForLoopIndexingPattern` does.

    ## Why is this bad?
    Each iteration dispatches a `select` and the ops on its row from Python: microseconds of
    host overhead each, and on a GPU a tiny kernel each. One vectorized op over the whole
    tensor does the same work in one dispatch.

    Estimated saving: the run's measured time less one period (what one vectorized op of
    the same kind costs at most).

    ## Example
    ```python
    for i in range(n):
        t[i] = i
    ```

    ## Use instead
    ```python
    t[:] = torch.arange(n, dtype=t.dtype)[:, None]
    ```

    ## Options
    - `min_repeats` (10): fewest back-to-back repetitions reported.

    ## References
    - `torch/profiler/_pattern_matcher.py`, `ForLoopIndexingPattern`
    """
    ops = ctx.trace.ops.select(
        pl.col("event").cast(pl.Int64),
        "name",
        "pid",
        "tid",
        "parent",
        "ts_ns",
        "dur_ns",
        "step",
        "module",
    ).sort("pid", "tid", "ts_ns", "event")
    siblings = ["pid", "tid", "parent"]
    starts = (pl.col("name") == SELECT).cum_sum().over(siblings, order_by="ts_ns")
    ops = ops.with_columns(starts.alias("_segment")).filter(pl.col("_segment") > 0)
    segments = (
        ops.group_by([*siblings, "_segment"])
        .agg(
            pl.col("name").sort_by("ts_ns").str.join("|").alias("_period"),
            pl.col("event").sort_by("ts_ns"),
            pl.col("ts_ns").min(),
            (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("_end"),
            pl.col("step").first(),
            pl.col("module").first(),
        )
        .sort([*siblings, "_segment"])
    )
    new_run = (pl.col("_period") != pl.col("_period").shift(1)).fill_null(True).over(siblings)
    segments = segments.with_columns(new_run.cum_sum().over(siblings).alias("_run"))
    runs = (
        segments.group_by([*siblings, "_run"])
        .agg(
            pl.col("_period").first(),
            pl.len().alias("repeats"),
            pl.col("event"),
            pl.col("ts_ns").min().alias("_start"),
            pl.col("_end").max(),
            (pl.col("_end") - pl.col("ts_ns")).min().alias("_one"),
            pl.col("step").first(),
            pl.col("module").first(),
        )
        .filter(pl.col("repeats") >= ctx.options["min_repeats"])
        .sort("_start")
    )
    for run in runs.iter_rows(named=True):
        events = [e for period in run["event"] for e in period]
        span_us = (run["_end"] - run["_start"]) / 1000
        saving = max(0.0, span_us - run["_one"] / 1000)
        period = run["_period"].split("|")
        yield ctx.finding(
            message=(
                f"a Python loop indexes a tensor {run['repeats']} times: "
                f"{' → '.join(period)} per iteration"
            ),
            step=run["step"],
            module=run["module"],
            ops=events,
            time_us=span_us,
            est_saving_us=saving,
            saving_model=(
                f"the loop's {span_us:.1f} µs less one iteration ({run['_one'] / 1000:.1f} µs), "
                "the most one vectorized op of the same kind takes"
            ),
            fix=(
                "Replace the loop with one vectorized op over the whole tensor (slicing, "
                "`torch.arange`, `index_put_` / `scatter_`, boolean masks)."
            ),
            evidence={
                "repeats": run["repeats"],
                "period": period,
                "first_select": run["event"][0][0],
                "selects": [p[0] for p in run["event"]],
            },
        )


RULE = check
