"""`traceq info TRACE`: what a trace holds."""

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
    traces_argument,
)

from traceq.reports import replays
from traceq.reports.safe_text import LINE_CHARS, clip, terminal
from traceq.reports.summary import summary
from traceq.rules.recorded import notices


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
    loaded = load(trace[0])
    data = summary(loaded)
    data["notices"] = [{"kind": n.kind, "message": n.message} for n in notices(loaded)]
    if fmt == "json":
        echo_json(data)
        return
    console = output_console()
    table = Table(title=terminal(trace[0], LINE_CHARS), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("schema", f"{data['schema']} (schemaVersion {data['schema_version']})"),
        ("events", f"{data['events']:,}"),
        ("duration", f"{data['duration_us']:,.1f} µs"),
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
                f"{clip(dev['name'] or '?')}: {dev['kernels']:,} kernels on streams "
                f"{dev['streams']}, busy {dev['busy_us']:,.1f} µs ({util:.0%} of its span)",
            )
        )
    top = ", ".join(f"{clip(k)} {v:,}" for k, v in list(data["by_category"].items())[:8])
    rows.append(("by category", top))
    unlinked = ", ".join(f"{k} {v:,}" for k, v in data["unlinked"].items()) or "none"
    rows.append(("not linked", unlinked))
    rows.extend(replays.lines(data))  # graph replays, kernels without a launch
    for i, notice in enumerate(data["notices"]):  # what the trace lacks, what that costs
        rows.append(("not recorded" if i == 0 else "", notice["message"]))
    for key, value in rows:  # names from the trace: as they are, never as markup
        table.add_row(terminal(key), terminal(value, LINE_CHARS))
    console.print(table)
