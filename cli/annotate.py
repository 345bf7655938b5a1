"""`traceq annotate TRACE -o OUT.json`: a copy of the trace that shows the critical path."""

from __future__ import annotations

import click

from cli.common import load, trace_argument
from cli.critical_path import _region
from traceq import annotate as marking


@click.command()
@trace_argument
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="Where to write the copy (.json, or .json.gz to gzip it).",
)
@click.option(
    "--critical-path/--no-critical-path",
    "with_path",
    default=True,
    show_default=True,
    help="Mark the critical path (flows and args.critical on its events).",
)
@click.option("--step", type=int, help="Critical path of this ProfilerStep only.")
@click.option("--annotation", help="Critical path of this annotation only.")
@click.option("--instance", type=int, default=0, show_default=True)
@click.option("--window", nargs=2, type=int, metavar="START_NS END_NS")
def annotate(
    trace: str,
    out: str,
    with_path: bool,
    step: int | None,
    annotation: str | None,
    instance: int,
    window: tuple[int, int] | None,
) -> None:
    """Write a copy of TRACE for Perfetto UI / chrome://tracing with the critical path drawn
    as flows (category critical_path) and `args.critical` set on its events."""
    region = _region(step, annotation, instance, window)
    written = marking.annotate(load(trace), out, critical_path=with_path, region=region)
    click.echo(f"wrote {written}")
