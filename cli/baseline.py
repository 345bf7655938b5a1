"""`traceq baseline save TRACE -o BASE.json`: a compact summary of a trace to commit."""

from __future__ import annotations

import click
from traceq.cli import jobs
from traceq.cli.common import load, output_option, trace_argument, writing

from traceq.regression.baseline import save_baseline
from traceq.regression.summary import summarize


@click.group()
def baseline() -> None:
    """Save baselines for `traceq check` and `traceq diff`."""


@baseline.command()
@trace_argument
@output_option("where to write the baseline JSON", required=True)
@click.option(
    "--findings/--no-findings",
    default=None,
    help="store the analyzer's findings (default: yes)",
)
def save(trace: str, output: str, findings: bool | None) -> None:
    """Write a versioned JSON baseline of TRACE: per-step times, per-kernel/op/module
    samples, dispatch, findings, device and versions (never host, user or environment).

    TRACE may be a job (a directory or a glob): every rank's baseline and the job's step
    time (the slowest rank's, per step) in one file."""
    if jobs.is_job((trace,)):
        return jobs.baseline_save(trace, output, findings)
    summary = summarize(load(trace), findings=findings)
    with writing(output):
        save_baseline(summary, output)
    groups = summary.groups["group"].n_unique()
    steps = f"{len(summary.steps)} steps" if summary.steps else "no steps"
    click.echo(f"wrote {output}: {steps}, {groups} groups, {summary.dispatch.height} dispatch rows")
