"""TQ403 imbalanced-collective: ranks of one collective move different sizes or take
different times once all have arrived."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import JobContext, rule
from traceq.rules.common import US
from traceq.rules.finding import Finding


@rule(
    "TQ403",
    "imbalanced-collective",
    "warning",
    scope="job",
    defaults={
        "max_time_ratio": 1.5,
        "min_saving_us": 100.0,
        "min_calls_share": 0.75,
        "min_steps": 3,
        "min_spread_ratio": 3.0,
    },
)
def imbalanced_collective(ctx: JobContext) -> Iterator[Finding]:
    """## What it does
    Finds collectives whose ranks are imbalanced: different message sizes across the ranks
    of one collective (uneven `all_to_all` splits, ragged `all_gather`), or one rank that
    is persistently slower once every rank has arrived (its active time: duration minus
    wait). One finding per process group and collective.

    A time imbalance is reported only when it is real, not noise: the same rank is the
    slowest in at least `min_calls_share` of the group's calls, over at least `min_steps`
    steps; in those calls it takes `max_time_ratio` × the median rank's active time; and
    its excess over the median rank is large against its own call-to-call spread (median
    excess ≥ `min_spread_ratio` × the median absolute deviation of the excess). Collectives
    measured on the host (gloo on CPU) are judged by message size only: there the
    collective runs on a worker thread that shares the host's cores with every local
    rank's training threads, so its time after arrival measures the scheduler, not the
    ranks.

    Savings model: per collective, the slowest rank's active time minus the median rank's,
    or, for uneven sizes, the transfer time × (1 − smallest / largest message) if larger
    (the transfer scales with the largest message); summed over the collectives found.

    ## Why is this bad?
    A collective finishes when its slowest rank does. A rank that sends more (an uneven
    shard, a hot expert in MoE all-to-all) or moves it slower (a slow link, a congested
    NIC) holds every rank of the group.

    ## Example
    ```python
    dist.all_to_all_single(out, inp, output_split_sizes=uneven, input_split_sizes=uneven)
    ```

    ## Use instead
    Balance the splits (capacity factors, padding, re-sharding); check the slow rank's link.

    ## References
    - [NCCL performance: algorithm and bus bandwidth](https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)
    """
    opts = ctx.options
    calls = ctx.job.collectives.filter(pl.col("ranks_seen") > 1)
    if calls.height == 0:
        return
    calls = calls.with_columns((pl.col("dur_ns") - pl.col("wait_ns")).alias("active_ns"))
    per_instance = calls.group_by("instance").agg(
        pl.col("pg").first(),
        pl.col("collective").first(),
        pl.col("step").first(),
        pl.col("seq").first(),
        (pl.col("on") == "gpu").all().alias("on_gpu"),
        pl.col("bytes").min().alias("min_bytes"),
        pl.col("bytes").max().alias("max_bytes"),
        pl.col("active_ns").max().alias("max_active"),
        pl.col("active_ns").median().alias("median_active"),
        pl.col("transfer_ns").first().alias("transfer"),
        pl.col("rank").sort_by("active_ns").last().alias("slowest"),
        pl.col("event").sort_by("active_ns").last().alias("event"),
    )
    per_instance = per_instance.with_columns(
        (pl.col("max_bytes") > pl.col("min_bytes")).fill_null(False).alias("by_size"),
        (pl.col("max_active") - pl.col("median_active")).alias("time_excess"),
        (pl.col("transfer") * (1 - pl.col("min_bytes") / pl.col("max_bytes")))
        .fill_null(0)
        .alias("size_excess"),
    )
    by_time = _persistent(per_instance, opts)
    imbalanced = per_instance.join(by_time, on="instance", how="left").with_columns(
        pl.col("persistent").fill_null(False)
    )
    imbalanced = imbalanced.filter(pl.col("by_size") | pl.col("persistent")).with_columns(
        pl.max_horizontal(
            pl.when(pl.col("persistent")).then("time_excess").otherwise(0), "size_excess"
        ).alias("excess_ns")
    )
    groups = imbalanced.group_by("pg", "collective").agg(
        pl.len().alias("n"),
        pl.col("excess_ns").sum(),
        pl.col("max_active").sum().alias("time_ns"),
        pl.col("by_size").sum(),
        pl.col("slowest").mode().sort(nulls_last=True).first().alias("slowest"),
        pl.col("slowest").alias("slowest_ranks"),
        pl.col("step"),
        pl.col("seq"),
        pl.col("event"),
        pl.col("calls_share").first(),
        pl.col("spread_ratio").first(),
    )
    for row in groups.sort("excess_ns", descending=True).iter_rows(named=True):
        saving = row["excess_ns"] / US
        if saving < opts["min_saving_us"]:
            continue
        events: dict[int, list[int]] = {}
        for rank, event in zip(row["slowest_ranks"], row["event"], strict=True):
            events.setdefault(int(rank), []).append(int(event))
        if row["by_size"]:
            kind = "message sizes"
        else:
            kind = (
                f"time after all ranks arrived (slowest in {row['calls_share']:.0%} of the "
                f"calls over {len(set(row['step']))} steps, {row['spread_ratio']:.1f}× its "
                "call-to-call spread)"
            )
        yield ctx.finding(
            message=(
                f"{row['n']} {row['collective']} calls in process group {row['pg']} are imbalanced "
                f"by {kind}; rank {row['slowest']} is slowest most often, "
                f"{saving / row['n']:,.0f} µs over the median rank per call"
            ),
            time_us=row["time_ns"] / US,
            est_saving_us=saving,
            saving_model=(
                "Σ max(slowest − median rank's active time, transfer × (1 − min/max bytes))"
            ),
            fix="Balance what each rank sends (splits, shards, experts); check the slow link.",
            evidence={
                "process_group": row["pg"],
                "collective": row["collective"],
                "ranks": sorted(events),
                "steps": row["step"],
                "seq": row["seq"],
                "imbalanced_by_size": bool(row["by_size"]),
                "events": events,
            },
        )


def _persistent(per_instance: pl.DataFrame, opts: dict) -> pl.DataFrame:
    """The calls of each (process group, collective) on the GPU whose time imbalance is
    persistent: one rank slowest in most calls over several steps, by `max_time_ratio`, and
    its excess large against its own call-to-call spread. `instance, persistent,
    calls_share, spread_ratio`."""
    gpu = per_instance.filter(pl.col("on_gpu"))
    schema = {
        "instance": pl.Int64,
        "persistent": pl.Boolean,
        "calls_share": pl.Float64,
        "spread_ratio": pl.Float64,
    }
    if gpu.height == 0:
        return pl.DataFrame(schema=schema)
    group = ["pg", "collective"]
    mode = pl.col("slowest").mode().sort(nulls_last=True).first().over(group)
    gpu = gpu.with_columns(
        mode.alias("_rank"),
        ((pl.col("slowest") == mode).sum().over(group) / pl.len().over(group)).alias("calls_share"),
    )
    mine = gpu.filter(pl.col("slowest") == pl.col("_rank"))
    excess = pl.col("time_excess")
    stats = mine.group_by(group).agg(
        pl.col("step").n_unique().alias("_steps"),
        excess.median().alias("_median"),
        (excess - excess.median()).abs().median().alias("_mad"),
    )
    spread_ratio = pl.col("_median") / pl.col("_mad").clip(lower_bound=1)
    ratio = opts["max_time_ratio"] * pl.col("median_active").clip(lower_bound=1)
    return (
        mine.join(stats, on=group, how="left")
        .with_columns(spread_ratio.alias("spread_ratio"))
        .with_columns(
            (
                (pl.col("calls_share") >= opts["min_calls_share"])
                & (pl.col("_steps") >= opts["min_steps"])
                & (pl.col("spread_ratio") >= opts["min_spread_ratio"])
                & (pl.col("max_active") > ratio)
            ).alias("persistent")
        )
        .select(pl.col(c).cast(t) for c, t in schema.items())
    )


RULE = imbalanced_collective
