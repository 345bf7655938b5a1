"""`traceq annotate TRACE -o OUT.json`: a copy of the trace that shows the critical path and
the findings of `traceq analyze` in Perfetto."""

from __future__ import annotations

import click
from traceq.cli.common import (
    load,
    output_option,
    region_options,
    rule_selection,
    split_codes,
    trace_argument,
    writing,
)

from traceq import analyze
from traceq.relations.critical_path import Region
from traceq.reports import annotate as marking


@click.command()
@trace_argument
@output_option("Where to write the copy (.json, or .json.gz to gzip it).", required=True)
@click.option(
    "--critical-path/--no-critical-path",
    "with_path",
    default=True,
    show_default=True,
    help="Mark the critical path (flows and args.critical on its events).",
)
@click.option(
    "--findings/--no-findings",
    "with_findings",
    default=True,
    show_default=True,
    help="Mark each finding's ops and kernels (args.traceq_findings) with an instant marker.",
)
@rule_selection
@region_options
def annotate(
    trace: str,
    output: str,
    with_path: bool,
    with_findings: bool,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    region: Region,
) -> None:
    """Write a copy of TRACE for Perfetto UI / chrome://tracing with the critical path drawn
    as flows (category critical_path), `args.critical` set on its events, and each finding's
    events marked with `args.traceq_findings` and an instant marker."""
    loaded = load(trace)
    findings = (
        analyze(loaded, select=split_codes(select) or None, ignore=split_codes(ignore) or None)
        if with_findings
        else []
    )
    with writing(output):
        written = marking.annotate(
            loaded, output, critical_path=with_path, findings=findings, region=region
        )
    click.echo(f"wrote {written} ({len(findings)} findings marked)")
