"""`traceq report TRACE|DIR -o report.html`: one self-contained HTML page with charts.

A directory, a glob or several files are a job (`traceq.load_job`): the page shows the job's
cross-rank frames (per-rank breakdown, stragglers, collectives), the job's findings
(each rank's and TQ4xx), then the lowest rank's time. Needs plotly (the `report`
extra); without it, one line and exit 2 (`PlotlyMissing`, a `TraceError`).

Exit status: 0, or 2 on bad input or an unwritable output path (checked before the load).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from traceq.cli import jobs
from traceq.cli.common import (
    JobEngine,
    cache_choice,
    job_options,
    output_option,
    progress,
    rule_options,
    split_codes,
    traces_argument,
    writing,
)

from traceq.errors import TraceFileError
from traceq.rules.config import parse_options


@click.command()
@traces_argument
@output_option("the HTML file to write", default="report.html", show_default=True)
@rule_options
@job_options
def report(
    trace: tuple[str, ...],
    output: str,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    options: tuple[str, ...],
    engine: JobEngine,
) -> None:
    """Write an HTML report of TRACE (a trace file, or a job: a directory of rank traces,
    a glob, several files)."""
    from traceq.reports.html import report as write_report

    parsed = parse_options(options)
    source: Any = trace[0]
    if jobs.is_job(trace):
        source = jobs.open_job(trace, engine)  # lists ranks: errors now
    elif not Path(source).exists():
        raise TraceFileError(f"{source}: no such file or directory")
    start = time.perf_counter()
    with progress(f"Reporting {', '.join(trace)} ..."), writing(output):
        path = write_report(
            source,
            output,
            select=split_codes(select) or None,
            ignore=split_codes(ignore),
            options=parsed,
            cache=cache_choice(),
        )
    size = path.stat().st_size / 1e6
    click.echo(f"wrote {path} ({size:.1f} MB, {time.perf_counter() - start:.1f} s)", err=True)
