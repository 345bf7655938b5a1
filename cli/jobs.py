"""The job side of the commands that take a TRACE: a directory, a glob or several files.

Each command keeps its single-trace path; when its TRACE arguments name a job
(`is_job`), it hands over to the function here of the same name, which loads the job,
runs the library's map and reduce, and renders. Where the per-rank work runs comes from
the command's `--engine`, `--address` and `--workers` (`common.job_options`) as one
`JobEngine`.
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path
from typing import Any

import click
import polars as pl
from rich.table import Table
from traceq.cli.common import JobEngine, cache_choice, echo_json, output_console, progress, writing

from traceq.job import Job, load_job
from traceq.relations.causes import CAUSE_LABELS


def is_job(paths: tuple[str, ...]) -> bool:
    """Several paths, a directory, or a glob pattern: a job, not one trace."""
    return len(paths) > 1 or any(Path(p).is_dir() or glob.has_magic(p) for p in paths)


def open_job(paths: tuple[str, ...], engine: JobEngine) -> Job:
    source: Any = list(paths) if len(paths) > 1 else paths[0]
    return load_job(
        source,
        engine=engine.name,
        address=engine.address,
        workers=engine.workers,
        cache=cache_choice(),
    )


def _span(ranks: list[int]) -> str:
    """`ranks 0..127` for a contiguous run, else the list (cut after 16)."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}..{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else "")


def _us(ns: float | None) -> str:
    return f"{(ns or 0) / 1e3:,.1f}"


def info(paths: tuple[str, ...], fmt: str, engine: JobEngine) -> None:
    """`traceq info DIR`: ranks, world size, process groups, per-rank step breakdown,
    collectives, clock alignment, and every oddity of the job."""
    job = open_job(paths, engine)
    with progress(f"Loading {len(job.files)} ranks ..."):
        frames = job.frames
    per_rank = (
        frames.breakdown.group_by("rank")
        .agg(
            pl.len().alias("steps"),
            *(
                pl.col(c).mean()
                for c in ("span_ns", "compute_ns", "comm_ns", "memcpy_ns", "idle_ns")
            ),
            pl.col("exposed_comm_ns").mean(),
            pl.col("on").first(),
        )
        .sort("rank")
        if frames.breakdown.height
        else pl.DataFrame()
    )
    calls = frames.collectives
    data = {
        "ranks": frames.ranks.to_dicts(),
        "world_size": job.world_size,
        "missing_ranks": job.missing_ranks,
        "process_groups": job.process_groups.to_dicts(),
        "breakdown_per_step": per_rank.to_dicts(),
        "collectives": calls["instance"].n_unique() if calls.height else 0,
        "collective_calls": calls.height,
        "alignment": frames.alignment.to_dicts(),
        "step_time": frames.step_time.to_dicts() if frames.step_ns.height else [],
        "notes": job.notes(),
    }
    if fmt == "json":
        echo_json(data)
        return
    from traceq.reports.safe_text import LINE_CHARS, terminal

    console = output_console()
    shown = job.paths[0] if len(job.paths) == 1 else f"{len(job.paths)} files"
    head = terminal("job", style="bold")
    head.append_text(
        terminal(
            f" {paths[0] if len(paths) == 1 else shown}: {len(job.files)} ranks of "
            f"{job.world_size}; {data['collectives']:,} collectives matched "
            f"({data['collective_calls']:,} calls)",
            LINE_CHARS,
        )
    )
    console.print(head)
    for pg in data["process_groups"]:
        line = f"process group {pg['pg']} ({pg['desc'] or '?'}): {_span(pg['ranks'])}"
        console.print(terminal(line, LINE_CHARS))
    table = Table(title="per rank, mean per step (µs)", title_justify="left")
    for name in ("rank", "from", "on", "steps", "step", "compute", "comm", "exposed", "memcpy"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("idle", justify="right", no_wrap=True)
    table.add_column("offset", justify="right", no_wrap=True)
    sources = job.rank_sources
    offsets = dict(
        zip(
            frames.alignment["rank"].to_list(),
            frames.alignment["applied_ns"].to_list(),
            strict=True,
        )
    )
    for row in per_rank.iter_rows(named=True):
        table.add_row(
            str(row["rank"]),
            terminal(sources.get(row["rank"], "?")),
            terminal(row["on"]),
            str(row["steps"]),
            _us(row["span_ns"]),
            _us(row["compute_ns"]),
            _us(row["comm_ns"]),
            _us(row["exposed_comm_ns"]),
            _us(row["memcpy_ns"]),
            _us(row["idle_ns"]),
            _us(offsets.get(row["rank"], 0)),
        )
    console.print(table)
    for note in data["notes"]:
        console.print(terminal(f"note: {note}", LINE_CHARS), highlight=False)


def analyze(
    paths: tuple[str, ...],
    *,
    select: list[str] | None,
    ignore: list[str],
    config: Any,
    options: dict[str, dict[str, Any]],
    fmt: str,
    output: str | None,
    render_options: dict[str, object],
    engine: JobEngine,
) -> list[Any]:
    """`traceq analyze DIR`: per-rank rules (mapped) and TQ4xx across ranks, one report.
    Returns the findings (the caller applies --fail-on)."""
    from traceq.job_analysis import analyze_job
    from traceq.reports import render
    from traceq.reports.model import job_report

    job = open_job(paths, engine)
    with progress(f"Analyzing {len(job.files)} ranks ..."):
        result = analyze_job(job, select=select, ignore=ignore, config=config, options=options)
    source = str(paths[0]) if len(paths) == 1 else ", ".join(paths)
    report = job_report(result, job, source)
    text = render(report, fmt, **render_options)
    if output:
        with writing(output):
            Path(output).write_text(text, encoding="utf-8")
    else:
        click.echo(text, nl=not text.endswith("\n"))
    return result.findings


def _critical_path_task(task: Any, region: Any, top: int) -> dict[str, Any]:
    from traceq.pipeline import load
    from traceq.relations.critical_path import critical_path

    return critical_path(load(task.path, cache=task.cache), region).to_dict(top=top)


def critical_path(
    paths: tuple[str, ...],
    region: Any,
    top_n: int,
    fmt: str,
    engine: JobEngine,
) -> None:
    """`traceq critical-path DIR`: each rank's critical path (mapped), longest first."""
    job = open_job(paths, engine)
    with progress(f"Critical paths of {len(job.files)} ranks ..."):
        outcomes = job.map(_critical_path_task, region, top_n)
    per_rank = {o.rank: o.value for o in outcomes if o.error is None}
    if fmt == "json":
        echo_json({"ranks": per_rank, "notes": job.notes()})
        return

    from traceq.reports.safe_text import LINE_CHARS, terminal

    console = output_console()
    table = Table(title="critical path per rank", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("length µs", justify="right")
    table.add_column("main causes")
    for rank, data in sorted(per_rank.items(), key=lambda kv: -kv[1]["length_us"]):
        causes = sorted(data["breakdown_pct"].items(), key=lambda kv: -kv[1])[:3]
        table.add_row(
            str(rank),
            f"{data['length_us']:,.1f}",
            ", ".join(f"{CAUSE_LABELS.get(c, c)} {p:.0f}%" for c, p in causes),
        )
    console.print(table)
    for note in job.notes():
        console.print(terminal(f"note: {note}", LINE_CHARS), highlight=False)
    if not per_rank:
        sys.exit(2)


def is_job_source(path: str) -> bool:
    """A job (directory, glob) or a job baseline file."""
    from traceq.regression.jobs import is_job_baseline

    return is_job((path,)) or (Path(path).is_file() and is_job_baseline(path))


def _pct(change: float | None) -> str:
    return "n/a" if change is None else f"{change:+.1%}"


def diff(base: str, new: str, fmt: str) -> None:
    """`traceq diff JOB JOB`: rank by rank, the worst rank, and the job's step time."""
    from traceq.regression.jobs import diff_jobs

    with progress(f"Reading {base} and {new} ..."):
        result = diff_jobs(base, new)
    if fmt == "json":
        echo_json(result.to_dict())
        return
    from traceq.reports.safe_text import LINE_CHARS, terminal

    console = output_console()
    job = result.job
    console.print(
        f"[bold]job step time[/] {_us(job['base_step_ns'])} -> {_us(job['new_step_ns'])} µs "
        f"({_pct(job['change'])}); worst rank: {result.worst_rank}"
    )
    table = Table(title="median step wall time per rank (µs)", title_justify="left")
    for name in ("rank", "base", "new", "change"):
        table.add_column(name, justify="right")
    for row in sorted(result.rows, key=lambda r: -(r["change"] or 0)):
        table.add_row(
            str(row["rank"]), _us(row["base_step_ns"]), _us(row["new_step_ns"]), _pct(row["change"])
        )
    console.print(table)
    for note in result.notes:
        console.print(terminal(f"note: {note}", LINE_CHARS), highlight=False)


def baseline_save(paths: str, output: str, findings: bool | None) -> None:
    from traceq.regression.jobs import save_job_baseline

    with progress(f"Summarizing {paths} ..."):
        summaries = save_job_baseline(load_job(paths, cache=cache_choice()), output, findings)
    click.echo(
        f"wrote {output}: job baseline of {len(summaries.ranks)} ranks, "
        f"{len(summaries.steps)} common steps"
    )


def check(trace: str, baseline: str, limit: float, metrics: list[str] | None, fmt: str) -> None:
    """`traceq check JOB --baseline JOB.json`: exit 1 when a rank or the job step regressed."""
    from traceq.regression.check import TOO_FEW
    from traceq.regression.jobs import check_job

    with progress(f"Checking {trace} ..."):
        result = check_job(trace, baseline, limit, metrics, cache=cache_choice())
    if fmt == "json":
        echo_json(result.to_dict())
    else:
        from traceq.reports.safe_text import LINE_CHARS, clip, printable

        step = result.job_step
        said = step["judgement"] if step["verdict"] == TOO_FEW else step["verdict"]
        click.echo(
            f"job step time: {said}"
            + (f" ({step['rel']:+.1%})" if step.get("rel") is not None else "")
        )
        for rank, res in sorted(result.ranks.items()):
            bad = ", ".join(m.spec for m in res.regressions)
            line = f"rank {rank}: " + (f"regressed: {bad}" if bad else "ok")
            click.echo(printable(clip(line, LINE_CHARS)))
        for note in result.notes:
            click.echo(printable(clip(f"note: {note}", LINE_CHARS)))
    if result.too_few:
        click.echo(
            f"traceq check: {result.too_few}: only a metric slower by more than {limit:.1%} "
            "on every step pair fails",
            err=True,
        )
    if result.failed:
        sys.exit(1)
