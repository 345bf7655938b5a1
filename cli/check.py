"""`traceq check TRACE --baseline BASE.json`: the CI gate; exit 0 pass, 1 regressed, 2 bad input."""

from __future__ import annotations

import sys

import click
from traceq.cli import jobs
from traceq.cli.common import cache_choice, format_option, progress, trace_argument

from traceq.regression.check import check as run_check
from traceq.regression.check import parse_ratio
from traceq.regression.render import FORMATS, render_check


@click.command()
@trace_argument
@click.option(
    "--baseline",
    "baseline_path",
    type=click.Path(),
    required=True,
    help="a baseline from `traceq baseline save`, or a full trace",
)
@click.option(
    "--max-regress",
    default="5%",
    show_default=True,
    help="largest allowed slowdown per metric, e.g. 5% or 0.05",
)
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    metavar="SPEC",
    help="step | gpu | kernel:NAME | op:NAME | module:PATH (NAME may use * and ?); "
    "repeat for several. Default: step, gpu and every group with >= 1% of the time",
)
@click.option("--fail-on-new-findings", is_flag=True, help="also fail when a finding appears")
@format_option(FORMATS)
def check(
    trace: str,
    baseline_path: str,
    max_regress: str,
    metrics: tuple[str, ...],
    fail_on_new_findings: bool,
    fmt: str,
) -> None:
    """Check TRACE against a baseline; exit 1 when a metric regressed beyond noise.

    With too few steps to judge the noise (fewer than 4 a side), exit 1 only when a metric
    is slower by more than --max-regress on every step pair; otherwise exit 0 and say on
    stderr that there were too few steps to judge.
    """
    limit = parse_ratio(max_regress)  # bad syntax fails before the load
    if jobs.is_job_source(trace) or jobs.is_job_source(baseline_path):
        return jobs.check(trace, baseline_path, limit, list(metrics) or None, fmt)
    with progress(f"Checking {trace} ..."):
        result = run_check(
            trace,
            baseline_path,
            max_regress=max_regress,
            metrics=list(metrics) or None,
            fail_on_new_findings=fail_on_new_findings,
            cache=cache_choice(),
        )
    click.echo(render_check(result, fmt), nl=False)
    too_few = result.too_few_line()
    if too_few:  # on stderr too, where a CI log shows it beside the exit status
        click.echo(f"traceq check: {too_few}", err=True)
    if result.failed:
        sys.exit(1)
