"""`traceq diff BASE NEW`: what changed between two traces (or a baseline and a trace)."""

from __future__ import annotations

import click
from traceq.cli import jobs
from traceq.cli.common import format_option, progress

from traceq.regression.baseline import load_summary
from traceq.regression.diff import BY
from traceq.regression.diff import diff as diff_summaries
from traceq.regression.render import FORMATS, TOP, render_diff


@click.command()
@click.argument("base", type=click.Path())
@click.argument("new", type=click.Path())
@click.option(
    "--by",
    type=click.Choice(BY),
    default="op",
    show_default=True,
    help="group by op (works across devices), kernel name, module path, or step",
)
@format_option(FORMATS)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=TOP,
    show_default=True,
    help="groups and dispatch changes to show (text, markdown)",
)
@click.option(
    "--findings/--no-findings",
    default=None,
    help="diff the analyzer's findings (default: yes)",
)
def diff(base: str, new: str, by: str, fmt: str, top: int, findings: bool | None) -> None:
    """Compare NEW with BASE: per-group time and counts, fusions, dispatch changes, findings.

    BASE and NEW are traces or baselines written by `traceq baseline save`, or jobs
    (directories, globs, job baselines): compared rank by rank, with the worst rank and the
    job's step time.
    """
    if jobs.is_job_source(base) or jobs.is_job_source(new):
        return jobs.diff(base, new, "json" if fmt == "json" else "text")
    with progress(f"Reading {base} and {new} ..."):
        result = diff_summaries(
            load_summary(base, findings), load_summary(new, findings), by=by, findings=findings
        )
    click.echo(render_diff(result, fmt, top=top), nl=False)
