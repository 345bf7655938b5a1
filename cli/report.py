"""`traceq report TRACE|DIR -o report.html`: one self-contained HTML page with charts.

A directory is a job: every `*.json`/`*.json.gz` in it is a rank trace; the page shows the
ranks side by side, then the lowest rank's findings and time. Needs plotly (the `report`
extra); without it, one line and exit 2 (`PlotlyMissing`, a `TraceError`).

Exit status: 0, or 2 on bad input or an unwritable output path (checked before the load).
"""

from __future__ import annotations

import time
from pathlib import Path

import click
from traceq.cli.common import output_path, progress, split_codes, trace_argument, writing

from traceq.errors import TraceFileError
from traceq.rules.config import parse_options


@click.command()
@trace_argument
@click.option(
    "-o",
    "--output",
    type=click.Path(),
    callback=output_path,
    default="report.html",
    show_default=True,
    help="the HTML file to write",
)
@click.option("--select", multiple=True, help="rule codes or prefixes to run (e.g. TQ1,TQ201)")
@click.option("--ignore", multiple=True, help="rule codes or prefixes to skip")
@click.option(
    "--option",
    "options",
    multiple=True,
    metavar="CODE.NAME=VALUE",
    help="a rule threshold, e.g. TQ201.min_gap_us=5 (repeatable)",
)
def report(
    trace: str,
    output: str,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    options: tuple[str, ...],
) -> None:
    """Write an HTML report of TRACE (a trace file, or a directory of rank traces)."""
    from traceq.reports.html import report as write_report

    parsed = parse_options(options)
    if not Path(trace).exists():
        raise TraceFileError(f"{trace}: no such file or directory")
    start = time.perf_counter()
    with progress(f"Reporting {trace} ..."), writing(output):
        path = write_report(
            trace,
            output,
            select=split_codes(select) or None,
            ignore=split_codes(ignore),
            options=parsed,
        )
    size = path.stat().st_size / 1e6
    click.echo(f"wrote {path} ({size:.1f} MB, {time.perf_counter() - start:.1f} s)", err=True)
