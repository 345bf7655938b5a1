"""TQ402 exposed-comm: communication no compute ran beside, per rank."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.relations.collectives import step_waits
from traceq.rules.base import JobContext, rule
from traceq.rules.common import US
from traceq.rules.finding import Finding


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

    Savings model: the overlap achievable per step (`hideable_comm_ns` of the breakdown,
    `traceq.relations.overlap`): each stretch of exposed communication can be hidden only
    by compute *independent* of the collective, with no communication beside it, each
    nanosecond of compute hiding one of communication. In backward (from the first to the
    last autograd node) that is backward compute *after* the stretch: the compute before a
    gradient collective produced the gradients it reduces, and the optimizer after
    backward consumes them. In forward it is earlier forward compute for parameter
    collectives (FSDP all-gather: prefetch), and nothing for activation collectives
    (tensor-parallel all-reduce, reduce-scatter, all-to-all: the op before produces their
    input, the op after consumes their output; on the critical path by construction). At
    most the exposed time minus the time the rank only waited for a later rank: that part
    is straggler wait (TQ401's), named in the message with the rank waited for; overlap
    cannot remove it. Summed over the steps.

    Not seen: data flow itself (phases stand in for it: a backward collective whose input
    was ready early, or forward compute independent of a TP all-reduce in another branch,
    is not credited), collectives on streams the trace does not tie to a step, and
    overlap that needs a different schedule than the one recorded.

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
    by_culprit = (
        step_waits(calls)
        if calls.height
        else pl.DataFrame(
            schema={"rank": pl.Int64, "step": pl.Int64, "last_rank": pl.Int64, "wait_ns": pl.Int64}
        )
    )
    waits = by_culprit.group_by("rank", "step").agg(pl.col("wait_ns").sum())
    # Whom each rank waited for most: the straggler wait is TQ401's, not overlap's to remove.
    culprits = (
        by_culprit.group_by("rank", "last_rank")
        .agg(pl.col("wait_ns").sum())
        .sort("wait_ns", "last_rank", descending=[True, False])
        .group_by("rank", maintain_order=True)
        .first()
        .select("rank", pl.col("last_rank").alias("waited_for"))
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
    per_rank = per_rank.join(culprits, on="rank", how="left")
    for row in per_rank.sort("rank").iter_rows(named=True):
        share = row["exposed_comm_ns"] / row["span_ns"] if row["span_ns"] else 0.0
        saving = row["achievable_ns"] / US
        if share < opts["min_share"] or saving < opts["min_saving_us"]:
            continue
        n = len(row["step"])
        events = (
            calls.filter(pl.col("rank") == row["rank"])["event"].to_list() if calls.height else []
        )
        wait_us = min(row["wait_ns"], row["exposed_comm_ns"]) / US
        straggler = (
            f"; {wait_us / n:,.0f} µs of it is waiting for rank {row['waited_for']} to arrive "
            "(straggler wait, TQ401's: overlap cannot remove it)"
            if wait_us >= 0.05 * row["exposed_comm_ns"] / US and row["waited_for"] is not None
            else ""
        )
        yield ctx.finding(
            message=(
                f"rank {row['rank']}: {row['exposed_comm_ns'] / US / n:,.0f} µs of communication "
                f"per step runs with no compute beside it ({share:.0%} of the step){straggler}; "
                f"{saving / n:,.0f} µs could overlap compute independent of it"
            ),
            time_us=row["exposed_comm_ns"] / US,
            est_saving_us=saving,
            saving_model=(
                "Σ over steps of min(exposed comm − wait for later ranks, exposed comm that "
                "independent compute could hide: in backward, backward compute after the "
                "collective (not the gradients' producers before it, not the optimizer after "
                "backward); in forward, earlier forward compute for parameter collectives, "
                f"none for activation all-reduce / reduce-scatter / all-to-all) on the "
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
                "straggler_wait_us": wait_us,
                "waited_for": row["waited_for"],
                "hideable_us": row["hideable_comm_ns"] / US,
                "events": {row["rank"]: events[:50]},
            },
        )


RULE = exposed_comm
