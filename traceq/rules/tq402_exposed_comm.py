"""TQ402 exposed-comm: communication no compute ran beside, per rank."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.relations.collectives import step_waits
from traceq.rules.base import rule
from traceq.rules.common import US
from traceq.rules.finding import Finding
from traceq.rules.jobs import JobContext


@rule(
    "TQ402",
    "exposed-comm",
    "warning",
    scope="job",
    defaults={"min_share": 0.10, "min_saving_us": 100.0},
)
def exposed_comm(ctx: JobContext) -> Iterator[Finding]:
    """## What it does
    Finds ranks whose communication is exposed: time in collectives while no compute ran
    beside them (|COMM ∪ COMP| − |COMP| per step, on the GPU; on the host for gloo ranks),
    when it reaches `min_share` of the rank's step.

    Savings model: the overlap achievable per step (`hideable_comm_ns` of the breakdown):
    each stretch of exposed communication can be hidden only by compute that ran earlier in
    the same phase of the step (forward, or backward from the first autograd node) with no
    communication beside it, each nanosecond of compute hiding one of communication —
    compute after a collective is taken to depend on it (the optimizer step consumes the
    reduced gradients), and forward compute cannot hide gradient collectives. At most the
    exposed time minus the time the rank only waited for a later rank (TQ401's part:
    overlap cannot remove it); summed over the steps.

    ## Why is this bad?
    Exposed communication adds straight to the step time. DDP and FSDP overlap gradient
    reduction with backward and prefetch parameters during forward; when buckets are too
    large, the collective is issued only after the last layer, or a host sync serializes
    the streams, the GPU sits idle while the network works.

    ## Example
    ```python
    model = DDP(model, bucket_cap_mb=1024)  # one bucket: all-reduce starts after backward
    ```

    ## Use instead
    ```python
    model = DDP(model, bucket_cap_mb=25, gradient_as_bucket_view=True)
    # FSDP: forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE
    ```

    ## References
    - [Holistic Trace Analysis: communication-computation overlap](https://hta.readthedocs.io/en/latest/)
    - [PyTorch DDP design: gradient bucketing](https://pytorch.org/docs/stable/notes/ddp.html)
    """
    opts = ctx.options
    breakdown = ctx.job.breakdown
    if breakdown.height == 0:
        return
    calls = ctx.job.collectives
    waits = (
        step_waits(calls).group_by("rank", "step").agg(pl.col("wait_ns").sum())
        if calls.height
        else pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "wait_ns": pl.Int64})
    )
    steps = (
        breakdown.join(waits, on=["rank", "step"], how="left", nulls_equal=True)
        .with_columns(
            pl.col("wait_ns").fill_null(0),
        )
        .with_columns(
            pl.min_horizontal(
                (pl.col("exposed_comm_ns") - pl.col("wait_ns")).clip(lower_bound=0),
                "hideable_comm_ns",
            ).alias("achievable_ns")
        )
    )
    per_rank = steps.group_by("rank").agg(
        pl.col("exposed_comm_ns").sum(),
        pl.col("comm_ns").sum(),
        pl.col("span_ns").sum(),
        pl.col("achievable_ns").sum(),
        pl.col("hideable_comm_ns").sum(),
        pl.col("wait_ns").sum(),
        pl.col("step"),
        pl.col("on").first(),
    )
    for row in per_rank.sort("rank").iter_rows(named=True):
        share = row["exposed_comm_ns"] / row["span_ns"] if row["span_ns"] else 0.0
        saving = row["achievable_ns"] / US
        if share < opts["min_share"] or saving < opts["min_saving_us"]:
            continue
        n = len(row["step"])
        events = (
            calls.filter(pl.col("rank") == row["rank"])["event"].to_list() if calls.height else []
        )
        yield ctx.finding(
            message=(
                f"rank {row['rank']}: {row['exposed_comm_ns'] / US / n:,.0f} µs of communication "
                f"per step runs with no compute beside it ({share:.0%} of the step); "
                f"{saving / n:,.0f} µs of it could overlap"
            ),
            time_us=row["exposed_comm_ns"] / US,
            est_saving_us=saving,
            saving_model=(
                "Σ over steps of min(exposed comm − wait for later ranks, exposed comm that idle "
                "compute earlier in the same phase (forward / backward) could hide) on the "
                f"{row['on'].upper()}"
            ),
            fix=(
                "Overlap communication with compute: smaller DDP buckets, FSDP prefetch, async "
                "collectives issued early and waited on late; no host sync between them."
            ),
            evidence={
                "rank": row["rank"],
                "steps": row["step"],
                "exposed_us": row["exposed_comm_ns"] / US,
                "comm_us": row["comm_ns"] / US,
                "wait_us": row["wait_ns"] / US,
                "hideable_us": row["hideable_comm_ns"] / US,
                "events": {row["rank"]: events[:50]},
            },
        )


RULE = exposed_comm
