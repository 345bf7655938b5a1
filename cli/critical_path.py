"""`traceq critical-path TRACE`: the chain of work that sets a region's length, by cause."""

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
    region_options,
    traces_argument,
)

from traceq.relations import critical_path as paths
from traceq.relations.critical_path import Region

NAME_WIDTH = 70
LABELS = {
    "cpu_bound": "CPU-bound",
    "gpu_compute": "GPU compute",
    "gpu_communication": "GPU communication",
    "launch_overhead": "launch overhead",
    "kernel_to_kernel_overhead": "kernel-to-kernel overhead",
    "sync_wait": "sync wait",
    "idle": "idle",
}


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
    path = paths.critical_path(load(trace[0]), region)
    data = path.to_dict(top=top_n)
    if fmt == "json":
        echo_json(data)
        return
    console = Console()
    start, end = path.region
    console.print(
        f"[bold]critical path[/] {data['length_us']:,.1f} us of a {(end - start) / 1e3:,.1f} us "
        f"region ({data['nodes']:,} points, {data['events']:,} events)"
    )
    causes = Table(show_header=True, title_justify="left")
    causes.add_column("cause")
    causes.add_column("us", justify="right")
    causes.add_column("%", justify="right")
    for cause, pct in sorted(data["breakdown_pct"].items(), key=lambda kv: -kv[1]):
        causes.add_row(LABELS[cause], f"{data['breakdown_us'][cause]:,.1f}", f"{pct:.1f}")
    console.print(causes)
    heaviest = Table(title="heaviest on the path", title_justify="left")
    heaviest.add_column("event", justify="right", no_wrap=True, min_width=6)
    heaviest.add_column("kind", no_wrap=True, min_width=7)
    heaviest.add_column("name", overflow="ellipsis", no_wrap=True)
    heaviest.add_column("us", justify="right", no_wrap=True, min_width=8)
    heaviest.add_column("%", justify="right", no_wrap=True, min_width=5)
    for row in data["top"]:
        width = max(16, min(NAME_WIDTH, console.width - 46))
        name = row["name"] if len(row["name"]) <= width else row["name"][: width - 1] + "…"
        heaviest.add_row(
            str(row["event"]),
            row["kind"],
            name,
            f"{row['time_us']:,.1f}",
            f"{row['pct']:.1f}",
        )
    console.print(heaviest)
