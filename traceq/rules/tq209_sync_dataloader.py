"""TQ209 sync-dataloader: batches loaded on the training thread (`DataLoader(num_workers=0)`).

Two records say so. With `num_workers=0` every batch is fetched by
`_SingleProcessDataLoaderIter`, whose `__next__` the DataLoader records as a
`enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` range on the thread that
trains: that time is on the step's critical path. With the Python stack recorded
(`with_stack=True`), PyTorch's pattern matcher (`SynchronizedDataLoaderPattern`) flags each
`dataloader.py: __iter__` whose `_get_iterator` does not call
`check_worker_number_rationality` (only the multi-process iterator does); traceq flags the
same `__iter__` calls, by time nesting on their thread.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.finding import Finding

NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
ITER = r"^torch/utils/data/dataloader\.py\(\d+\): __iter__$"
CHECK = r"^torch/utils/data/dataloader\.py\(\d+\): check_worker_number_rationality$"

DEFAULTS = {"min_us": 0.0}


@rule("TQ209", "sync-dataloader", "warning", defaults=DEFAULTS)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds a `DataLoader` that loads batches on the training thread (`num_workers=0`): the
    `_SingleProcessDataLoaderIter.__next__` ranges the DataLoader records, and, with the
    Python stack recorded, its `__iter__` calls that start no workers (PyTorch's profiler
    pattern matcher's `SynchronizedDataLoaderPattern`). One finding per step.

    ## Why is this bad?
    Each batch is read, decoded, transformed and collated while the model waits: the time
    of every `__next__` is added to the step. Worker processes prepare the next batches
    while the current one trains.

    Estimated saving: the measured time of the `__next__` calls in the step (with enough
    workers and prefetching, a batch is ready when asked for).

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64)
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True,
                        persistent_workers=True, prefetch_factor=2)
    ```

    ## Options
    - `min_us` (0): leave out steps whose loading time is shorter.

    ## References
    - PyTorch performance tuning guide, "Enable asynchronous data loading and
      augmentation": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    - `torch/profiler/_pattern_matcher.py`, `SynchronizedDataLoaderPattern`
    """
    events = ctx.trace.events.select(
        pl.col("event").cast(pl.Int64), "name", "pid", "tid", "ts_ns", "dur_ns"
    ).filter(pl.col("dur_ns").is_not_null())
    nexts = events.filter(pl.col("name") == NEXT)
    iters = events.filter(pl.col("name").str.contains(ITER))
    if iters.height:
        checks = events.filter(pl.col("name").str.contains(CHECK)).select(
            "pid", "tid", pl.col("ts_ns").alias("_check")
        )
        inside = (
            iters.join(checks, on=["pid", "tid"])
            .filter(
                (pl.col("_check") >= pl.col("ts_ns"))
                & (pl.col("_check") < pl.col("ts_ns") + pl.col("dur_ns"))
            )
            .select("event")
        )
        iters = iters.join(inside, on="event", how="anti")
    found = pl.concat(
        [
            nexts.with_columns(pl.lit("next").alias("_kind")),
            iters.with_columns(pl.lit("iter").alias("_kind")),
        ]
    )
    if found.height == 0:
        return
    steps = ctx.trace.steps.select(
        "step", pl.col("ts_ns").alias("_s"), pl.col("end_ns").alias("_e")
    )
    found = found.sort("ts_ns")
    if steps.height:
        found = found.join_asof(
            steps.sort("_s"), left_on="ts_ns", right_on="_s", strategy="backward"
        ).with_columns(pl.when(pl.col("ts_ns") < pl.col("_e")).then("step").alias("step"))
    else:
        found = found.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    for (step,), group in found.group_by("step", maintain_order=True):
        batches = group.filter(pl.col("_kind") == "next")
        loading_us = batches["dur_ns"].sum() / 1000
        if loading_us < ctx.options["min_us"]:
            continue
        iter_events = group.filter(pl.col("_kind") == "iter")["event"].to_list()
        yield ctx.finding(
            message=(
                f"`DataLoader` with `num_workers=0`: {batches.height} batches loaded on the "
                f"training thread ({loading_us:.1f} µs)"
                + (f", {len(iter_events)} synchronous `__iter__`" if iter_events else "")
            ),
            step=step,
            ops=sorted(group["event"].to_list()),
            time_us=loading_us,
            est_saving_us=loading_us,
            saving_model=(
                f"the {batches.height} `__next__` calls' measured {loading_us:.1f} µs, hidden "
                "behind the step by worker processes"
            ),
            fix=(
                "Load in worker processes: `DataLoader(..., num_workers=N, pin_memory=True, "
                "persistent_workers=True)` (N ≈ CPU cores per GPU), so batches are prepared "
                "while the model trains."
            ),
            evidence={
                "batches": batches.height,
                "loading_us": round(loading_us, 3),
                "iter_events": iter_events,
                "next_events": batches["event"].to_list(),
            },
        )


RULE = check
