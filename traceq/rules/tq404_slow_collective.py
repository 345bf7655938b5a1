"""TQ404 slow-collective: bus bandwidth far below what the same message size reaches
elsewhere in the job."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import JobContext, rule
from traceq.rules.common import US
from traceq.rules.finding import Finding


@rule(
    "TQ404",
    "slow-collective",
    "warning",
    scope="job",
    defaults={"max_ratio": 0.5, "min_samples": 3, "min_saving_us": 100.0},
)
def slow_collective(ctx: JobContext) -> Iterator[Finding]:
    """## What it does
    Finds collectives whose bus bandwidth (NCCL's formula: algbw = bytes / time, busbw =
    algbw × 2(n−1)/n for all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all,
    1 for broadcast, reduce and send/recv) is below `max_ratio` of the best the same
    collective reaches on messages of the same size (a power-of-two size class) elsewhere
    in the job, given at least `min_samples` calls of that class. The time is the transfer:
    from the last rank's arrival to the median rank's end, so waiting for a straggler (TQ401)
    does not count as slowness. One finding per collective and size class.

    Collectives without message sizes (older Kineto writes no `In msg nelems`) have no
    bandwidth and are not judged.

    Savings model: Σ transfer time × (1 − busbw / best busbw) over the slow calls.

    ## Why is this bad?
    The same message should move at the same speed; a call far slower than its peers ran
    on a congested link, a slower algorithm or protocol (ring vs tree, LL vs Simple),
    across a slow interconnect, or competed with other traffic.

    ## Example
    ```text
    allreduce 32 MB: 180 GB/s busbw in most steps, 20 GB/s in step 7 (a second job on the NIC)
    ```

    ## Use instead
    Check the algorithm and protocol NCCL chose (`NCCL_ALGO`, `NCCL_PROTO`), the topology
    (`NCCL_DEBUG=INFO`), and what else used the network at that time.

    ## References
    - [NCCL performance: algorithm and bus bandwidth](https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)
    """
    opts = ctx.options
    calls = ctx.job.collectives.filter(pl.col("busbw_gbs").is_not_null() & (pl.col("bytes") > 0))
    if calls.height == 0:
        return
    per_instance = (
        calls.group_by("instance")
        .agg(
            pl.col(
                "pg", "collective", "step", "seq", "bytes", "busbw_gbs", "transfer_ns", "algorithm"
            ).first(),
            pl.col("rank"),
            pl.col("event"),
        )
        .with_columns(pl.col("bytes").log(2).floor().cast(pl.Int64).alias("size_class"))
    )
    per_instance = per_instance.with_columns(
        pl.col("busbw_gbs").max().over("collective", "size_class").alias("best_gbs"),
        pl.len().over("collective", "size_class").alias("samples"),
    )
    slow = per_instance.filter(
        (pl.col("samples") >= opts["min_samples"])
        & (pl.col("busbw_gbs") < opts["max_ratio"] * pl.col("best_gbs"))
    ).with_columns(
        (pl.col("transfer_ns") * (1 - pl.col("busbw_gbs") / pl.col("best_gbs"))).alias("lost_ns")
    )
    groups = slow.group_by("collective", "size_class").agg(
        pl.len().alias("n"),
        pl.col("lost_ns").sum(),
        pl.col("transfer_ns").sum(),
        pl.col("busbw_gbs").median().alias("busbw"),
        pl.col("best_gbs").first().alias("best"),
        pl.col("bytes").median(),
        pl.col("step"),
        pl.col("seq"),
        pl.col("pg").first(),
        pl.col("algorithm").drop_nulls().unique(),
        pl.col("rank"),
        pl.col("event"),
    )
    for row in groups.sort("lost_ns", descending=True).iter_rows(named=True):
        saving = row["lost_ns"] / US
        if saving < opts["min_saving_us"]:
            continue
        events: dict[int, list[int]] = {}
        for ranks, ids in zip(row["rank"], row["event"], strict=True):
            for rank, event in zip(ranks, ids, strict=True):
                events.setdefault(int(rank), []).append(int(event))
        yield ctx.finding(
            message=(
                f"{row['n']} {row['collective']} calls of ~{row['bytes'] / 1e6:,.1f} MB reach "
                f"{row['busbw']:,.1f} GB/s bus bandwidth; the same size reaches {row['best']:,.1f} "
                "GB/s elsewhere in the job"
            ),
            time_us=row["transfer_ns"] / US,
            est_saving_us=saving,
            saving_model="Σ transfer time × (1 − busbw / best busbw of the size class)",
            fix="Check NCCL's algorithm/protocol and topology, and competing traffic then.",
            evidence={
                "process_group": row["pg"],
                "collective": row["collective"],
                "size_class_bytes": 1 << row["size_class"],
                "steps": row["step"],
                "seq": row["seq"],
                "algorithms": row["algorithm"],
                "busbw_gbs": row["busbw"],
                "best_busbw_gbs": row["best"],
                "ranks": sorted(events),
                "events": events,
            },
        )


RULE = slow_collective
