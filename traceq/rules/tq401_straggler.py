"""TQ401 straggler: one rank the others wait for in their collectives, step after step."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.relations.collectives import step_waits
from traceq.rules.base import JobContext, rule
from traceq.rules.common import US
from traceq.rules.finding import Finding

DATA_LOADING = r"(?i)dataloader|_next_data|enumerate\("
HOST_SYNC = (
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize)$"
    r"|^aten::(item|_local_scalar_dense)$"
)


@rule(
    "TQ401",
    "straggler",
    "warning",
    scope="job",
    defaults={"min_wait_us": 1000.0, "min_step_share": 0.05, "min_steps_share": 0.75},
)
def straggler(ctx: JobContext) -> Iterator[Finding]:
    """## What it does
    Finds a rank that the other ranks of the job wait for in their collectives, step after
    step, names it, and says where its extra time goes.

    For every collective matched across ranks (same process group, sequence number and
    step), the rank that arrived last caused the others' wait: each other rank's time in
    the collective before the last one arrived. Per step, the rank that caused the most
    wait is that step's straggler. A rank is reported when it is the straggler in at least
    `min_steps_share` of the steps (and in at least two, when there are two), and the wait
    it causes averages at least `min_wait_us` per step and `min_step_share` of the job's
    step time.

    Where its extra time goes: the straggler's host time per range (ops and
    `record_function` ranges on its step thread, at any depth, plus `(untraced)` time in no
    range) against the median of the other ranks, and its GPU compute time per step
    against theirs; the largest excesses are named and classed as data loading, host syncs,
    a slow GPU, untraced host time (Python, sleeps) or host compute.

    Savings model: the mean wait the others spend per step on this rank, times the steps:
    what the job's step time loses to it (the step ends when the slowest rank ends).

    A job whose traces have no `ProfilerStep` is one window per rank: the unit is then the
    collective (the rank arrives last in at least `min_steps_share` of the matched
    collectives), and the wait is the window's total. Not seen: waits in collectives only
    one rank's trace holds (sampled ranks), a straggler whose lateness the clock alignment
    absorbed (ranks without shared collectives to align on), and point-to-point waits.

    ## Why is this bad?
    Synchronous data parallelism runs at the speed of its slowest rank: every rank blocks in
    the gradient all-reduce until the last one arrives, so one slow host, data loader or GPU
    costs the whole job that much every step.

    ## Example
    ```python
    for batch in loader:            # rank 5's loader decodes images on 2 workers
        loss = model(batch).loss    # ranks 0-4, 6-7 then wait for it in backward
        loss.backward()
    ```

    ## Use instead
    Remove the rank's extra work (more DataLoader workers, pinned memory, no host sync in
    its step), or replace the slow host or GPU; balance uneven shards.

    ## References
    - [Holistic Trace Analysis: temporal breakdown and stragglers](https://hta.readthedocs.io/en/latest/)
    - [PyTorch DDP: how the reducer waits for all ranks](https://pytorch.org/docs/stable/notes/ddp.html)
    """
    opts = ctx.options
    calls = ctx.job.collectives.filter(pl.col("ranks_seen") > 1)
    if calls.height == 0:
        return
    # Without `ProfilerStep`s a rank is one window: "step after step" becomes "collective
    # after collective" (each matched collective is a unit), and the wait is the window's.
    windowed = calls["step"].null_count() == calls.height
    if windowed:
        calls = calls.with_columns(pl.col("instance").alias("step"))
    waits = step_waits(calls)
    ranks = calls.group_by("step").agg(pl.col("rank").n_unique().alias("_ranks"))
    last_events = (
        calls.filter(pl.col("rank") == pl.col("last_rank"))
        .group_by("step", "last_rank")
        .agg(pl.col("event"), pl.col("seq"), pl.col("pg").first())
    )
    # Per step and culprit: the wait of each other rank (0 for ranks that did not wait), averaged.
    by_rank_step = (
        waits.group_by("step", "last_rank")
        .agg(pl.col("wait_ns").sum())
        .join(ranks, on="step", how="left", nulls_equal=True)
        .with_columns((pl.col("wait_ns") / (pl.col("_ranks") - 1)).alias("caused_ns"))
        .join(last_events, on=["step", "last_rank"], how="left", nulls_equal=True)
    )
    worst = by_rank_step.sort("caused_ns", descending=True).group_by("step").first()
    steps = worst.height
    step_time = ctx.job.step_time
    median_step_ns = step_time["dur_ns"].median() if step_time.height else None
    for (rank,), rows in worst.sort("step").group_by("last_rank", maintain_order=True):
        rows = rows.sort("step")
        mean_ns = (rows["caused_ns"].sum() if windowed else rows["caused_ns"].mean()) or 0.0
        enough_steps = rows.height >= opts["min_steps_share"] * steps and (
            rows.height >= 2 or steps < 2
        )
        share = mean_ns / median_step_ns if median_step_ns else 1.0
        if not enough_steps or mean_ns / US < opts["min_wait_us"] or share < opts["min_step_share"]:
            continue
        where = _extra_time(ctx, int(rank), [None] if windowed else rows["step"].to_list())
        total_us = float(rows["caused_ns"].sum()) / US
        top = _most_specific(where)
        reason = (
            f"; its extra time goes to {top['kind']} "
            f"({top['name']}: +{top['extra_us']:,.0f} µs per step)"
            if top
            else ""
        )
        unit, per = ("collectives", "in the window") if windowed else ("steps", "per step")
        yield ctx.finding(
            message=(
                f"rank {rank} is the last to arrive in {rows.height} of {steps} {unit}: the "
                f"other ranks wait {mean_ns / US:,.0f} µs {per} for it ({share:.0%} of the "
                f"{'window' if windowed else 'step'}){reason}"
            ),
            time_us=total_us,
            est_saving_us=total_us,
            saving_model=(
                f"the other ranks' wait in the {rows.height} collectives it arrived last at, "
                "in the trace's one window (no ProfilerStep)"
                if windowed
                else f"mean wait of the other ranks, {mean_ns / US:,.0f} µs per step × "
                f"{rows.height} steps"
            ),
            fix=(
                "Remove the straggler's extra work (data loading, host syncs, extra compute) or "
                "replace its slow host/GPU; the job runs at its slowest rank's speed."
            ),
            evidence={
                "rank": int(rank),
                "steps": [None] if windowed else rows["step"].to_list(),
                "wait_us_per_step": [round(v / US, 1) for v in rows["caused_ns"].to_list()],
                "process_group": rows["pg"].to_list()[0],
                "seq": rows["seq"].to_list(),
                "events": {int(rank): sorted({e for ids in rows["event"].to_list() for e in ids})},
                "extra_time": where,
                "step_time_us": (median_step_ns or 0) / US,
            },
        )


def _extra_time(ctx: JobContext, rank: int, steps: list[int]) -> list[dict]:
    """The straggler's excess over the other ranks' median, per step, by host range name
    and by GPU compute: the largest first."""
    ranges = ctx.job.ranges
    found: list[dict] = []
    if ranges.height:
        mine = ranges.filter(_in(steps))
        per_rank = mine.group_by("rank", "name").agg(
            (pl.col("dur_ns").sum() / len(steps)).alias("ns")
        )
        others = (
            per_rank.filter(pl.col("rank") != rank)
            .group_by("name")
            .agg(pl.col("ns").median().alias("others"))
        )
        extra = (
            per_rank.filter(pl.col("rank") == rank)
            .join(others, on="name", how="left")
            .with_columns((pl.col("ns") - pl.col("others").fill_null(0)).alias("extra"))
            .sort("extra", descending=True)
            .head(3)
        )
        for _, name, ns, other, more in extra.iter_rows():
            if more > 0:
                found.append(
                    {
                        "name": name,
                        "kind": _kind(name),
                        "extra_us": more / US,
                        "rank_us": ns / US,
                        "others_us": (other or 0) / US,
                    }
                )
    breakdown = ctx.job.breakdown
    if breakdown.height and (breakdown["on"] == "gpu").any():
        gpu = breakdown.filter(_in(steps)).group_by("rank").agg(pl.col("compute_ns").mean())
        mine_gpu = gpu.filter(pl.col("rank") == rank)["compute_ns"]
        others_gpu = gpu.filter(pl.col("rank") != rank)["compute_ns"].median()
        if mine_gpu.len() and others_gpu is not None and mine_gpu[0] > others_gpu:
            found.append(
                {
                    "name": "GPU compute kernels",
                    "kind": "a slow GPU or more GPU work",
                    "extra_us": (mine_gpu[0] - others_gpu) / US,
                    "rank_us": mine_gpu[0] / US,
                    "others_us": others_gpu / US,
                }
            )
    return sorted(found, key=lambda f: -f["extra_us"])


def _in(steps: list[int | None]) -> pl.Expr:
    """The rows of `steps`; `[None]`: the one window of a trace without steps."""
    return pl.col("step").is_null() if steps == [None] else pl.col("step").is_in(steps)


def _most_specific(where: list[dict]) -> dict | None:
    """Of the excesses within 20% of the largest, the one in the shortest range: a sleep
    nested in `forward` explains the excess better than `forward` itself."""
    if not where:
        return None
    best = where[0]["extra_us"]
    close = [w for w in where if w["extra_us"] >= 0.8 * best]
    return min(close, key=lambda w: w["rank_us"])


def _kind(name: str) -> str:
    import re

    if name == "(untraced)":
        return "untraced host time (Python, sleeps)"
    if re.search(DATA_LOADING, name):
        return "data loading"
    if re.search(HOST_SYNC, name):
        return "host syncs"
    return "host compute"


RULE = straggler
