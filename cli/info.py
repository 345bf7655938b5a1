"""`traceq info TRACE`: what a trace holds."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from traceq.cli import jobs
from traceq.cli.common import (
    JobEngine,
    echo_json,
    format_option,
    job_options,
    load,
    traces_argument,
)

from traceq.reports.summary import summary


@click.command()
@traces_argument
@format_option()
@job_options
def info(trace: tuple[str, ...], fmt: str, engine: JobEngine) -> None:
    """Show what TRACE holds: events by category, ops, kernels, steps, devices, links.

    TRACE may be a job (a directory, a glob, several files): ranks, process groups, the
    per-rank step breakdown, collectives and clock alignment."""
    if jobs.is_job(trace):
        return jobs.info(trace, fmt, engine)
    data = summary(load(trace[0]))
    if fmt == "json":
        echo_json(data)
        return
    console = Console()
    table = Table(title=trace[0], show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("schema", f"{data['schema']} (schemaVersion {data['schema_version']})"),
        ("events", f"{data['events']:,}"),
        ("duration", f"{data['duration_us']:,.1f} us"),
        ("ops", f"{data['ops']:,}"),
        ("kernels", f"{data['kernels']:,} (+ {data['memcpy']} memcpy, {data['memset']} memset)"),
        ("runtime calls", f"{data['runtime']:,}"),
        ("steps", ", ".join(map(str, data["steps"])) or "none"),
        ("modules", f"{data['modules']:,}"),
    ]
    if data["rank"] is not None:
        rows.append(("rank", f"{data['rank']} of {data['world_size']}"))
    for dev in data["devices"]:
        util = data["gpu_utilization"].get(dev["device"], 0.0)
        rows.append(
            (
                f"device {dev['device']}",
                f"{dev['name'] or '?'}: {dev['kernels']:,} kernels on streams "
                f"{dev['streams']}, busy {dev['busy_us']:,.1f} us ({util:.0%} of its span)",
            )
        )
    top = ", ".join(f"{k} {v:,}" for k, v in list(data["by_category"].items())[:8])
    rows.append(("by category", top))
    unlinked = ", ".join(f"{k} {v:,}" for k, v in data["unlinked"].items()) or "none"
    rows.append(("not linked", unlinked))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
