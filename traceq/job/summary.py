"""One rank reduced to compact frames: the map step of a job.

A `RankSummary` holds what the cross-rank analysis needs and nothing more — per-step time
breakdown, kernel types, the collective calls, the host ranges per step by name — so a
driver combining 1,000 ranks holds 1,000 small frames, never 1,000 traces. It pickles,
so it crosses process and Ray boundaries as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceq.relations.breakdown import kernel_breakdown, step_breakdown, step_ranges
from traceq.relations.collectives import rank_collectives
from traceq.trace import Trace

UNREAD = {"ph": pl.String, "cat": pl.String, "events": pl.Int64}


@dataclass
class RankSummary:
    """One rank's compact frames (each with a `rank` column) and its metadata."""

    rank: int
    path: str
    rank_source: str
    schema: str
    has_gpu: bool
    distributed: dict[str, Any]
    events: int
    steps: list[int]
    step_ns: pl.DataFrame  # step, dur_ns: the ProfilerStep windows
    breakdown: pl.DataFrame
    kernel_types: pl.DataFrame
    collectives: pl.DataFrame
    ranges: pl.DataFrame
    problems: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # ph, cat, events: what the map's load did not read, counted (`RankTrace.unread`);
    # empty when it read every event
    unread: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=UNREAD))


def summarize(trace: Trace, rank: int, rank_source: str) -> RankSummary:
    """The map step: `trace` (rank `rank`) -> its `RankSummary`."""
    problems = []
    own = trace.rank
    if rank_source != "distributedInfo" and own is not None and own != rank:
        problems.append(f"{trace.source}: distributedInfo says rank {own}, job uses {rank}")
    has_gpu = trace.kernels.height > 0
    tag = pl.lit(rank, pl.Int64).alias("rank")
    return RankSummary(
        rank=rank,
        path=trace.source,
        rank_source=rank_source,
        schema=trace.schema,
        has_gpu=has_gpu,
        distributed=trace.distributed,
        events=trace.select("events", "event").height,
        steps=trace.steps["step"].to_list(),
        step_ns=trace.steps.select(tag, "step", "dur_ns"),
        breakdown=step_breakdown(trace).with_columns(tag),
        kernel_types=kernel_breakdown(trace).with_columns(tag),
        collectives=rank_collectives(trace, rank),
        ranges=step_ranges(trace).with_columns(tag),
        problems=problems,
        unread=_unread(trace),
    )


def _unread(trace: Trace) -> pl.DataFrame:
    """The events the load left unread, counted (a lean `RankTrace`), else none."""
    from traceq.job.rankload import RankTrace

    if isinstance(trace, RankTrace):
        return trace.unread.cast(UNREAD)
    return pl.DataFrame(schema=UNREAD)
