"""`traceq critical-path TRACE`: the chain of work that sets a region's length, by cause."""

from __future__ import annotations

import click
from rich.table import Table
from traceq.cli import jobs
from traceq.cli.common import (
    JobEngine,
    echo_json,
    format_option,
    job_options,
    load,
    output_console,
    region_options,
    traces_argument,
)

from traceq.relations import critical_path as paths
from traceq.relations.causes import CAUSE_LABELS
from traceq.relations.critical_path import Region
from traceq.reports import replays

NAME_WIDTH = 70


@click.command("critical-path")
@traces_argument
@region_options
@click.option("--top", "top_n", type=int, default=10, show_default=True)
@format_option()
@job_options
def critical_path(
    trace: tuple[str, ...], region: Region, top_n: int, fmt: str, engine: JobEngine
) -> None:
    """Show the critical path of TRACE (the whole trace, a step, an annotation or a
    window): its length, what it is made of, and the events with most time on it.

    TRACE may be a job (a directory, a glob, several files): one path per rank."""
    if jobs.is_job(trace):
        return jobs.critical_path(trace, region, top_n, fmt, engine)
    loaded = load(trace[0])
    path = paths.critical_path(loaded, region)
    data = path.to_dict(top=top_n)
    found = replays.facts(loaded)  # graph replays and kernels without a launch, once
    data.update({key: value for key, value in found.items() if value})
    if fmt == "json":
        echo_json(data)
        return
    from traceq.reports.safe_text import LINE_CHARS, terminal

    console = output_console()
    start, end = path.region
    console.print(
        f"[bold]critical path[/] {data['length_us']:,.1f} µs of a {(end - start) / 1e3:,.1f} µs "
        f"region ({data['nodes']:,} points, {data['events']:,} events)"
    )
    causes = Table(show_header=True, title_justify="left")
    causes.add_column("cause")
    causes.add_column("µs", justify="right")
    causes.add_column("%", justify="right")
    for cause, pct in sorted(data["breakdown_pct"].items(), key=lambda kv: -kv[1]):
        causes.add_row(CAUSE_LABELS[cause], f"{data['breakdown_us'][cause]:,.1f}", f"{pct:.1f}")
    for label, text in replays.lines(found):  # names from the trace: never as markup
        console.print(terminal(f"{label.strip()}: {text}", LINE_CHARS))
    console.print(causes)
    heaviest = Table(title="heaviest on the path, by name", title_justify="left")
    heaviest.add_column("kind", no_wrap=True, min_width=7)
    heaviest.add_column("name", overflow="ellipsis", no_wrap=True)
    heaviest.add_column("events", justify="right", no_wrap=True, min_width=6)
    heaviest.add_column("µs", justify="right", no_wrap=True, min_width=8)
    heaviest.add_column("%", justify="right", no_wrap=True, min_width=5)
    for row in data["top_names"]:  # the same kernel in 24 layers: one row
        width = max(16, min(NAME_WIDTH, console.width - 46))
        name = row["name"] or "?"
        name = name if len(name) <= width else name[: width - 1] + "…"
        heaviest.add_row(
            row["kind"],
            terminal(name, None),  # the trace's name as it is, never as markup
            f"{row['events']:,}",
            f"{row['time_us']:,.1f}",
            f"{row['pct']:.1f}",
        )
    console.print(heaviest)
