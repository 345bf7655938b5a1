"""`traceq analyze TRACE`: findings with evidence and estimated savings, in four formats.

`--check-fixes` also proves each fusion finding's fix with the kernel zoo (`traceq.zoo.verify`):
the zoo, and torch with it, is imported only then.

Exit status: 0, or 1 when a finding is at or above `--fail-on`, or 2 on bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from traceq.cli import jobs
from traceq.cli.common import (
    JobEngine,
    format_option,
    job_options,
    load,
    output_option,
    progress,
    rule_options,
    split_codes,
    traces_argument,
    writing,
)

from traceq.analyze import analysis
from traceq.reports import FORMATS, Report, build_report, render
from traceq.rules.config import Config, ConfigError, find_config, load_config, parse_options
from traceq.rules.finding import SEVERITIES

if TYPE_CHECKING:
    from collections.abc import Callable

    from traceq import Trace


@click.command()
@traces_argument
@rule_options
@format_option(FORMATS)
@click.option(
    "--fail-on",
    type=click.Choice(SEVERITIES),
    default=None,
    help="exit 1 when a finding has this severity or higher",
)
@output_option("write here, not stdout")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="traceq.toml or pyproject.toml (default: the nearest one above TRACE)",
)
@click.option("--no-config", is_flag=True, help="ignore configuration files")
@click.option(
    "--check-fixes",
    is_flag=True,
    help="prove each fusion finding's fix: record the split and the zoo's fused version at "
    "its shapes and show the rule is gone (needs torch; slow on a CPU)",
)
@job_options
def analyze(
    trace: tuple[str, ...],
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    options: tuple[str, ...],
    fmt: str,
    fail_on: str | None,
    output: str | None,
    config_path: str | None,
    no_config: bool,
    check_fixes: bool,
    engine: JobEngine,
) -> None:
    """Find fusion opportunities and overhead in TRACE, with evidence and estimated savings.

    Rules and thresholds come from `[tool.traceq]` in the nearest pyproject.toml (or a
    traceq.toml) above TRACE, then from the command line. See `traceq rules`.

    TRACE may be a job (a directory, a glob, several files): each rank's rules run per
    rank, and the cross-rank rules (TQ4xx: stragglers, exposed and slow collectives) once.
    """
    config = _config(trace[0], config_path, no_config)
    parsed = parse_options(options)  # bad syntax fails before the (slow) load
    if jobs.is_job(trace):
        if check_fixes:
            click.echo("traceq: error: --check-fixes takes one trace, not a job", err=True)
            sys.exit(2)
        found = jobs.analyze(
            trace,
            select=split_codes(select) or None,
            ignore=split_codes(ignore),
            config=config,
            options=parsed,
            fmt=fmt,
            output=output,
            render_options=_render_options(fmt, output),
            engine=engine,
        )
        _fail_on(found, fail_on or config.fail_on)
        return
    verify_groups = _fix_checker() if check_fixes else None
    loaded = load(trace[0])
    with progress("Analyzing ..."):
        result = analysis(
            loaded,
            select=split_codes(select) or None,
            ignore=split_codes(ignore),
            config=config,
            options=parsed,
        )
    report = build_report(result, loaded)
    if verify_groups is not None:
        attach_fix_checks(report, loaded, verify_groups)
    text = render(report, fmt, **_render_options(fmt, output))
    if output:
        with writing(output):
            Path(output).write_text(text, encoding="utf-8")
    else:
        click.echo(text, nl=not text.endswith("\n"))
    _fail_on(report.findings, fail_on or config.fail_on)


def _fail_on(findings: list[Any], threshold: str | None) -> None:
    """Exit 1 when a finding is at or above `threshold`."""
    if threshold is not None:
        if threshold not in SEVERITIES:
            raise ConfigError(f"fail-on must be one of {', '.join(SEVERITIES)}, not {threshold!r}")
        worst = SEVERITIES.index(threshold)
        if any(f.severity_rank >= worst for f in findings):
            sys.exit(1)


def _fix_checker() -> Callable[..., dict[str, dict[str, Any]]]:
    """`traceq.zoo.verify.check_fixes`, or one line and exit 2 when the zoo cannot be imported
    (torch missing); asked before the load, so a missing dependency fails fast."""
    try:
        from traceq.zoo.verify import check_fixes
    except ImportError as error:
        click.echo(
            f"traceq: error: --check-fixes needs the zoo (pip install 'traceq[zoo]'): {error}",
            err=True,
        )
        sys.exit(2)
    return check_fixes


def attach_fix_checks(
    report: Report, trace: Trace, check_fixes: Callable[..., dict[str, dict[str, Any]]]
) -> None:
    """`--check-fixes`: one zoo verification per finding group, attached to the group
    (`report.attach_fix_check`); every renderer shows a group's `fix_check`."""
    with progress("Checking fixes with the zoo ..."):
        results = check_fixes(report.findings, trace=trace)
    for key, result in results.items():
        report.attach_fix_check(key, result)


def _config(trace: str, path: str | None, no_config: bool) -> Config:
    if no_config:
        return Config()
    if path is not None:
        return load_config(path)
    found = find_config(Path(trace).parent if Path(trace).parent.exists() else Path.cwd())
    return load_config(found) if found else Config()


def _render_options(fmt: str, output: str | None) -> dict[str, object]:
    if fmt != "text":
        return {}
    tty = output is None and sys.stdout.isatty()
    width = click.get_terminal_size()[0] if tty else 100
    return {"color": tty, "width": max(60, width)}
