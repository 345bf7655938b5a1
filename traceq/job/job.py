"""`Job`: the traces of one distributed run, one per rank, and what holds across ranks.

Listing a job reads only the head of each file (`traceq.job.ranks`); a rank's `Trace` is
loaded when asked for (`job.trace(rank)`). Cross-rank frames come from a map over the
ranks (`summarize`, in worker processes or on Ray) and a reduce over the compact frames
it returns (`JobFrames`), so the driver never holds the ranks' full frames.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import polars as pl

from traceq.job.engine import Outcome, Task, map_ranks
from traceq.job.ranks import RankFile, rank_files, trace_paths
from traceq.job.summary import RankSummary, summarize
from traceq.relations.collectives import COLUMNS, clock_offsets, match_collectives
from traceq.trace import Trace

ALIGN = ("auto", "collectives", "none")
# Ranks a job ever enumerates from its stated world size (missing ranks, the default process
# group's members): more than any real job has, and a bound on what a file's claim can cost.
MISSING_LISTED = 1 << 17
INT64_MAX = (1 << 63) - 1
# An offset is applied under "auto" only when the clocks measurably disagree: the ranks'
# collective ends differ by more than this many times their own spread.
ALIGN_SIGNIFICANCE = 3.0

JobSource = str | os.PathLike[str] | list[str | os.PathLike[str]]


def summarize_task(task: Task) -> RankSummary:
    """Map step of `Job.frames`: load one rank and reduce it to its `RankSummary`."""
    from traceq.job.rankload import load_for_map

    trace = load_for_map(task.path, rules=False, cache=task.cache)
    return summarize(trace, task.rank, task.rank_source)


@dataclass
class JobFrames:
    """The reduce: every rank's compact frames side by side (each with `rank`), the
    collectives matched across ranks, and the clock alignment used."""

    ranks: pl.DataFrame
    breakdown: pl.DataFrame
    kernel_types: pl.DataFrame
    collectives: pl.DataFrame
    alignment: pl.DataFrame
    ranges: pl.DataFrame
    step_ns: pl.DataFrame
    problems: list[str] = field(default_factory=list)

    @property
    def step_time(self) -> pl.DataFrame:
        """The job's step time: per step, the slowest rank's `ProfilerStep` window. A rank
        without `ProfilerStep`s is one window (step null): its breakdown's span, the time
        from its first to its last activity, as the breakdown measures it."""
        return (
            self.windows.group_by("step")
            .agg(pl.col("dur_ns").max(), pl.col("rank").sort_by("dur_ns").last().alias("slowest"))
            .sort("step")
        )

    @property
    def windows(self) -> pl.DataFrame:
        """`rank, step, dur_ns`: every rank's `ProfilerStep` windows, and one window (step
        null, its breakdown's `span_ns`) for each rank that has none."""
        schema = {"rank": pl.Int64, "step": pl.Int64, "dur_ns": pl.Int64}
        stepped = (
            self.step_ns.select(list(schema)).cast(schema)
            if "step" in self.step_ns.columns
            else pl.DataFrame(schema=schema)
        )
        if self.breakdown.height == 0:
            return stepped
        whole = (
            self.breakdown.join(stepped.select("rank").unique(), on="rank", how="anti")
            .filter(pl.col("step").is_null())
            .select("rank", "step", pl.col("span_ns").alias("dur_ns"))
            .cast(schema)
        )
        return pl.concat([stepped, whole])


def reduce_summaries(summaries: list[RankSummary], align: str = "auto") -> JobFrames:
    """Cross-rank frames from per-rank summaries (the reduce of the map)."""
    if align not in ALIGN:
        raise ValueError(f"align must be one of {', '.join(ALIGN)}, not {align!r}")
    problems = [p for s in summaries for p in s.problems]
    ranks = pl.DataFrame(
        {
            "rank": [s.rank for s in summaries],
            "path": [s.path for s in summaries],
            "rank_source": [s.rank_source for s in summaries],
            "schema": [s.schema for s in summaries],
            "has_gpu": [s.has_gpu for s in summaries],
            "events": [s.events for s in summaries],
            # the rest (flows, metadata, Python frames, ...) counted in each summary's `unread`
            "events_read": [s.events - int(s.unread["events"].sum()) for s in summaries],
            "steps": [len(s.steps) for s in summaries],
            "collectives": [s.collectives.height for s in summaries],
        },
        schema_overrides={"rank": pl.Int64},
    )
    hostonly = ranks.filter(~pl.col("has_gpu"))["rank"].to_list()
    if hostonly:
        which = "every rank" if len(hostonly) == ranks.height else _ranks_text(hostonly)
        problems.append(f"no GPU activity in {which}: measured on the host")
    schemas = sorted(set(ranks["schema"].to_list()))
    if len(schemas) > 1:
        problems.append(f"mixed schemas across ranks: {', '.join(schemas)}")

    def stack(name: str) -> pl.DataFrame:
        frames = [getattr(s, name) for s in summaries if getattr(s, name).height]
        return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()

    calls = stack("collectives")
    if calls.height == 0:
        calls = pl.DataFrame(schema=COLUMNS)
    alignment = _alignment(calls, ranks, align)
    shifted = alignment.filter(pl.col("applied_ns") != 0)
    if shifted.height:
        largest = shifted["applied_ns"].abs().max() / 1e3
        which = _ranks_text(shifted["rank"].to_list())
        problems.append(
            f"clocks aligned by the ends of shared collectives: {which} shifted, by up to "
            f"{largest:,.1f} µs (frames.alignment)"
        )
    applied = alignment.select("rank", pl.col("applied_ns").alias("offset_ns"))
    return JobFrames(
        ranks=ranks,
        breakdown=stack("breakdown"),
        kernel_types=stack("kernel_types"),
        collectives=match_collectives(calls, applied),
        alignment=alignment,
        ranges=stack("ranges"),
        step_ns=stack("step_ns"),
        problems=problems,
    )


def _representable(files: list[RankFile], problems: list[str]) -> tuple[list[RankFile], list[str]]:
    """The files whose rank fits the frames' 64-bit `rank` column; the others are left out,
    each with a note (a rank of 2**70 is no rank of a real job)."""
    kept = [f for f in files if -INT64_MAX - 1 <= f.rank <= INT64_MAX]
    problems = problems + [
        f"{f.path}: rank {f.rank} does not fit 64 bits; the file is left out"
        for f in files
        if f not in kept
    ]
    return kept, problems


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def _alignment(calls: pl.DataFrame, ranks: pl.DataFrame, align: str) -> pl.DataFrame:
    """Per rank: measured offset to the lowest rank's clock, its spread, how many
    collectives it rests on, and the offset applied (`align`: auto / collectives / none)."""
    reference = ranks["rank"].min() if ranks.height else 0
    offsets = (
        clock_offsets(calls, reference)
        if calls.height
        else pl.DataFrame(
            schema={
                "rank": pl.Int64,
                "offset_ns": pl.Int64,
                "matched": pl.UInt32,
                "spread_ns": pl.Float64,
            }
        )
    )
    frame = (
        ranks.select("rank")
        .join(offsets, on="rank", how="left")
        .with_columns(pl.col("offset_ns").fill_null(0), pl.col("matched").fill_null(0))
    )
    significant = pl.col("offset_ns").abs() > ALIGN_SIGNIFICANCE * pl.col("spread_ns").fill_null(0)
    applied = {
        "none": pl.lit(0, pl.Int64),
        "collectives": pl.col("offset_ns"),
        "auto": pl.when(significant & (pl.col("matched") > 0)).then("offset_ns").otherwise(0),
    }[align]
    return frame.with_columns(
        applied.cast(pl.Int64).alias("applied_ns"), pl.lit(int(reference)).alias("reference")
    ).sort("rank")


class Job:
    """The traces of one distributed run. Build with `traceq.load_job`."""

    def __init__(
        self,
        src: JobSource,
        *,
        engine: str = "local",
        workers: int | None = None,
        address: str | None = None,
        align: str = "auto",
        cache: bool | None = None,
    ) -> None:
        self.source = ", ".join(map(str, src)) if isinstance(src, (list, tuple)) else str(src)
        self.paths = trace_paths(src)
        self.files, self.problems = _representable(*rank_files(self.paths))
        self.engine, self.workers, self.address, self.align = engine, workers, address, align
        self.cache = cache
        self._traces: dict[int, Trace] = {}
        self.worker_peak_rss_mb = 0.0
        self.map_cpu_s = 0.0  # CPU seconds of the last map, summed over ranks (all processes)
        self.failed: dict[int, str] = {}

    # -- what the heads say ---------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        return [f.rank for f in self.files]

    @property
    def rank_sources(self) -> dict[int, str]:
        """How each rank was found: 'distributedInfo', 'file name' or 'order'."""
        return {f.rank: f.rank_source for f in self.files}

    @property
    def world_size(self) -> int:
        """`distributedInfo.world_size` (the largest any rank states), else the ranks seen.

        Only a number the files state: nothing is ever sized by it (a rank may claim 2**40),
        see `missing_count` and `process_groups`."""
        stated = [f.distributed.get("world_size") for f in self.files]
        sizes = [s for s in stated if isinstance(s, int) and not isinstance(s, bool)]
        sizes = [s for s in sizes if 0 < s <= INT64_MAX]
        return max(sizes) if sizes else len(self.files)

    @property
    def missing_count(self) -> int:
        """How many ranks below the world size have no file (sampled jobs keep a few of
        many): counted, not listed, so a stated world size costs nothing."""
        present = {r for r in self.ranks if 0 <= r < self.world_size}
        return self.world_size - len(present)

    @property
    def missing_ranks(self) -> list[int]:
        """The first `MISSING_LISTED` ranks below the world size with no file, in order:
        all of them in any real job; `missing_count` says how many there are."""
        return self._first_missing(MISSING_LISTED)

    def _first_missing(self, most: int) -> list[int]:
        present = set(self.ranks)
        listed: list[int] = []
        rank, wanted = 0, min(most, self.missing_count)
        while len(listed) < wanted:
            if rank not in present:
                listed.append(rank)
            rank += 1
        return listed

    @property
    def process_groups(self) -> pl.DataFrame:
        """`distributedInfo.pg_config` merged over ranks: pg, desc, backend, size, ranks."""
        rows: dict[str, dict[str, Any]] = {}
        for f in self.files:
            for pg in f.distributed.get("pg_config") or []:
                if isinstance(pg, dict) and "pg_name" in pg:
                    rows.setdefault(str(pg["pg_name"]), pg)
        if not rows:  # the default group: every rank of the world, when it can be listed
            world = self.world_size
            members = range(world) if world <= MISSING_LISTED else sorted(self.ranks)
            rows["0"] = {"pg_desc": "default_pg", "pg_size": world, "ranks": list(members)}
        return pl.DataFrame(
            {
                "pg": list(rows),
                "desc": [r.get("pg_desc") for r in rows.values()],
                "backend": [r.get("backend_config") for r in rows.values()],
                "size": [r.get("pg_size") or len(r.get("ranks") or []) for r in rows.values()],
                "ranks": [[int(x) for x in r.get("ranks") or []] for r in rows.values()],
            },
            schema_overrides={"ranks": pl.List(pl.Int64), "size": pl.Int64},
        )

    def notes(self) -> list[str]:
        """Everything odd about the job, one line each: never silently dropped."""
        notes = list(self.problems)
        count = self.missing_count
        if count:
            missing = self._first_missing(8)
            shown = ", ".join(map(str, missing)) + (" ..." if count > len(missing) else "")
            notes.append(f"{count} of {self.world_size} ranks have no trace: {shown}")
        notes += [self.failed[r] for r in sorted(self.failed)]
        if "frames" in self.__dict__:
            notes += [p for p in self.frames.problems if p not in notes]
        return notes

    # -- per rank, lazily -------------------------------------------------------------------
    def path(self, rank: int) -> str:
        for f in self.files:
            if f.rank == rank:
                return f.path
        raise KeyError(f"no rank {rank} in this job (ranks: {self.ranks})")

    def trace(self, rank: int) -> Trace:
        """Rank `rank`'s full `Trace`, loaded on first use (and kept)."""
        if rank not in self._traces:
            from traceq.pipeline import load

            self._traces[rank] = load(self.path(rank), cache=self.cache)
        return self._traces[rank]

    @property
    def traces(self) -> list[Trace]:
        """Every rank's full `Trace`, in rank order (loads them all: for the HTML report's
        per-rank pages, `traceq.report(job, path)`; the cross-rank frames need none)."""
        return [self.trace(rank) for rank in self.ranks]

    def tasks(self) -> list[Task]:
        return [Task(f.path, f.rank, f.rank_source, f.size_bytes, self.cache) for f in self.files]

    def map(self, fn: Any, *args: Any) -> list[Outcome]:
        """`fn(task, *args)` per rank on this job's engine; failed ranks are noted."""
        outcomes = map_ranks(
            fn, self.tasks(), args, engine=self.engine, workers=self.workers, address=self.address
        )
        self.worker_peak_rss_mb = max((o.peak_rss_mb for o in outcomes), default=0.0)
        self.map_cpu_s = sum(o.cpu_s for o in outcomes)
        for outcome in outcomes:
            if outcome.error:
                self.failed[outcome.rank] = outcome.error
        return outcomes

    @cached_property
    def summaries(self) -> list[RankSummary]:
        return [o.value for o in self.map(summarize_task) if o.error is None]

    @cached_property
    def frames(self) -> JobFrames:
        """Cross-rank frames (breakdown, collectives, alignment, ...): map, then reduce."""
        return reduce_summaries(self.summaries, self.align)

    def __repr__(self) -> str:
        return f"Job({len(self.files)} ranks of {self.world_size}, engine={self.engine!r})"

    def _repr_html_(self) -> str:
        """A notebook's view: what the heads say (no rank is loaded, nothing is mapped)."""
        import html

        esc = html.escape
        rows = [
            ("source", self.source),
            ("ranks", f"{len(self.files):,} of {self.world_size:,}"),
            ("rank from", ", ".join(sorted(set(self.rank_sources.values()))) or "—"),
            ("engine", self.engine),
            ("notes", "; ".join(self.notes()) or "none"),
        ]
        body = "".join(
            f"<tr><th style='text-align:left'>{esc(k)}</th>"
            f"<td style='text-align:left'>{esc(str(v))}</td></tr>"
            for k, v in rows
        )
        return f"<div><b>Job</b><table>{body}</table></div>"


def load_job(src: JobSource, **options: Any) -> Job:
    """A `Job` from a directory, a glob pattern or a list of trace files (one per rank).

    Options: `engine` ('local' processes, 'serial', or 'ray'), `workers`, `address` (a Ray
    cluster), `align` ('auto': shift a rank's clock only when its collectives say it
    measurably differs; 'collectives': always; 'none'), `cache` (as `traceq.load`'s, for
    every rank's load, in whichever process it runs). Nothing is loaded until asked.
    """
    return Job(src, **options)
