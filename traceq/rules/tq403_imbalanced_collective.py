"""TQ403 imbalanced-collective: ranks of one collective move different sizes or take
different times once all have arrived."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import rule
from traceq.rules.common import US
from traceq.rules.finding import Finding
from traceq.rules.jobs import JobContext


@rule(
    "TQ403",
    "imbalanced-collective",
    "warning",
    scope="job",
    defaults={"max_time_ratio": 1.5, "min_saving_us": 100.0},
)
def imbalanced_collective(ctx: JobContext) -> Iterator[Finding]:
    """## What it does
    Finds collectives whose ranks are imbalanced: different message sizes across the ranks
    of one collective (uneven `all_to_all` splits, ragged `all_gather`), or a rank that
    takes `max_time_ratio` times longer than the median rank after every rank has arrived
    (its active time: duration minus wait). One finding per process group and collective.

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
        pl.col("bytes").min().alias("min_bytes"),
        pl.col("bytes").max().alias("max_bytes"),
        pl.col("active_ns").max().alias("max_active"),
        pl.col("active_ns").min().alias("min_active"),
        pl.col("active_ns").median().alias("median_active"),
        pl.col("transfer_ns").first().alias("transfer"),
        pl.col("rank").sort_by("active_ns").last().alias("slowest"),
        pl.col("event").sort_by("active_ns").last().alias("event"),
    )
    imbalanced = per_instance.filter(
        (pl.col("max_bytes") > pl.col("min_bytes"))
        | (
            pl.col("max_active")
            > opts["max_time_ratio"] * pl.col("median_active").clip(lower_bound=1)
        )
    ).with_columns(
        pl.max_horizontal(
            pl.col("max_active") - pl.col("median_active"),
            (pl.col("transfer") * (1 - pl.col("min_bytes") / pl.col("max_bytes"))).fill_null(0),
        ).alias("excess_ns")
    )
    groups = imbalanced.group_by("pg", "collective").agg(
        pl.len().alias("n"),
        pl.col("excess_ns").sum(),
        pl.col("max_active").sum().alias("time_ns"),
        (pl.col("max_bytes") > pl.col("min_bytes")).sum().alias("by_size"),
        pl.col("slowest").mode().first().alias("slowest"),
        pl.col("slowest").alias("slowest_ranks"),
        pl.col("step"),
        pl.col("seq"),
        pl.col("event"),
    )
    for row in groups.sort("excess_ns", descending=True).iter_rows(named=True):
        saving = row["excess_ns"] / US
        if saving < opts["min_saving_us"]:
            continue
        events: dict[int, list[int]] = {}
        for rank, event in zip(row["slowest_ranks"], row["event"], strict=True):
            events.setdefault(int(rank), []).append(int(event))
        kind = "message sizes" if row["by_size"] else "time after all ranks arrived"
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
                "imbalanced_by_size": row["by_size"],
                "events": events,
            },
        )


RULE = imbalanced_collective
