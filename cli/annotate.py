"""`traceq annotate TRACE -o OUT.json`: a copy of the trace that shows the critical path and
the findings of `traceq analyze` in Perfetto."""

from __future__ import annotations

import click
from traceq.cli.common import load, output_path, split_codes, trace_argument, writing
from traceq.cli.critical_path import region_of

from traceq import analyze
from traceq.reports import annotate as marking


@click.command()
@trace_argument
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(),
    callback=output_path,
    help="Where to write the copy (.json, or .json.gz to gzip it).",
)
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
@click.option("--select", multiple=True, help="Rule codes or prefixes to run (as in analyze).")
@click.option("--ignore", multiple=True, help="Rule codes or prefixes to skip.")
@click.option("--step", type=int, help="Critical path of this ProfilerStep only.")
@click.option("--annotation", help="Critical path of this annotation only.")
@click.option("--instance", type=int, default=0, show_default=True)
@click.option("--window", nargs=2, type=int, metavar="START_NS END_NS")
def annotate(
    trace: str,
    out: str,
    with_path: bool,
    with_findings: bool,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    step: int | None,
    annotation: str | None,
    instance: int,
    window: tuple[int, int] | None,
) -> None:
    """Write a copy of TRACE for Perfetto UI / chrome://tracing with the critical path drawn
    as flows (category critical_path), `args.critical` set on its events, and each finding's
    events marked with `args.traceq_findings` and an instant marker."""
    region = region_of(step, annotation, instance, window)
    loaded = load(trace)
    findings = (
        analyze(loaded, select=split_codes(select) or None, ignore=split_codes(ignore) or None)
        if with_findings
        else []
    )
    with writing(out):
        written = marking.annotate(
            loaded, out, critical_path=with_path, findings=findings, region=region
        )
    click.echo(f"wrote {written} ({len(findings)} findings marked)")
