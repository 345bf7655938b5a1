"""`traceq baseline save TRACE -o BASE.json`: a compact summary of a trace to commit."""

from __future__ import annotations

import click
from traceq.cli.common import load, trace_argument

from traceq.regression.baseline import save_baseline


@click.group()
def baseline() -> None:
    """Save baselines for `traceq check` and `traceq diff`."""


@baseline.command()
@trace_argument
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    required=True,
    help="where to write the baseline JSON",
)
@click.option(
    "--findings/--no-findings",
    default=None,
    help="store the analyzer's findings (default: yes)",
)
def save(trace: str, output: str, findings: bool | None) -> None:
    """Write a versioned JSON baseline of TRACE: per-step times, per-kernel/op/module
    samples, dispatch, findings, device and versions (never host, user or environment)."""
    summary = save_baseline(load(trace), output, findings=findings)
    groups = summary.groups["group"].n_unique()
    steps = f"{len(summary.steps)} steps" if summary.steps else "no steps"
    click.echo(f"wrote {output}: {steps}, {groups} groups, {summary.dispatch.height} dispatch rows")
