"""`traceq analyze TRACE`: findings with evidence and estimated savings, in four formats.

`--check-fixes` also proves each fusion finding's fix with the kernel zoo (`traceq.zoo.verify`):
the zoo, and torch with it, is imported only then.

Exit status: 0, or 1 when a finding is at or above `--fail-on`, or 2 on bad input.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from traceq.cli import jobs
from traceq.cli.common import (
    PIPE_WIDTH,
    JobEngine,
    format_option,
    job_options,
    load,
    output_option,
    output_width,
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
@click.option(
    "--top",
    "top_n",
    type=click.IntRange(min=1),
    default=None,
    help="text, markdown: show the N groups with the largest saving  [default: 30]",
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
@click.option(
    "--source-root",
    type=click.Path(file_okay=False),
    default=None,
    help="SARIF: the checkout that source files are relative to, so code scanning marks "
    "the line that issued a finding's ops (traces recorded with_stack=True; default: the "
    "working directory)",
)
@job_options
def analyze(
    trace: tuple[str, ...],
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    options: tuple[str, ...],
    fmt: str,
    fail_on: str | None,
    top_n: int | None,
    output: str | None,
    config_path: str | None,
    no_config: bool,
    check_fixes: bool,
    source_root: str | None,
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
            render_options=_render_options(fmt, output, source_root, top_n),
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
    report.notices.extend(job_rule_notices(select, ignore, config))
    if verify_groups is not None:
        attach_fix_checks(report, loaded, verify_groups)
    text = render(report, fmt, **_render_options(fmt, output, source_root, top_n))
    if output:
        with writing(output):
            Path(output).write_text(text, encoding="utf-8")
    else:
        click.echo(text, nl=not text.endswith("\n"))
    _fail_on(report.findings, fail_on or config.fail_on)


def job_rule_notices(select: tuple[str, ...], ignore: tuple[str, ...], config: Config) -> list[str]:
    """One trace, and `--select` names job rules (TQ4xx): they need every rank's trace, so
    say so rather than let "No findings" read as "no straggler"."""
    if not select:
        return []
    from traceq.rules.config import selected
    from traceq.rules.engine import discover

    chosen = selected(
        discover().rules, config.merged(select=split_codes(select), ignore=split_codes(ignore))
    )
    codes = [r.code for r in chosen if r.scope == "job"]
    if not codes:
        return []
    need = "needs a job" if len(codes) == 1 else "need a job"
    return [f"{', '.join(codes)} {need} (a folder of rank traces, one per rank), not one trace"]


def _fail_on(findings: list[Any], threshold: str | None) -> None:
    """Exit 1 when a finding is at or above `threshold`."""
    if threshold is not None:
        if threshold not in SEVERITIES:
            raise ConfigError(f"fail-on must be one of {', '.join(SEVERITIES)}, not {threshold!r}")
        worst = SEVERITIES.index(threshold)
        failing = [f for f in findings if f.severity_rank >= worst]
        if failing:
            click.echo(f"traceq: {fail_reason(failing, threshold)}: exit 1", err=True)
            sys.exit(1)


def fail_reason(failing: list[Any], threshold: str) -> str:
    """Why `--fail-on` fails: "3 findings at or above warning (TQ103 ×2, TQ105)"."""
    counts = Counter(f.rule for f in failing)
    rules = ", ".join(code if n == 1 else f"{code} ×{n}" for code, n in sorted(counts.items()))
    noun = "finding" if len(failing) == 1 else "findings"
    return f"{len(failing)} {noun} at or above {threshold} ({rules})"


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


def _render_options(
    fmt: str, output: str | None, source_root: str | None = None, top_n: int | None = None
) -> dict[str, object]:
    if fmt == "sarif":
        return {"source_root": source_root}
    shown: dict[str, object] = {} if top_n is None else {"max_groups": top_n}
    if fmt == "markdown":
        return shown
    if fmt != "text":
        return {}
    tty = output is None and sys.stdout.isatty()
    width = click.get_terminal_size()[0] if tty else (output_width() or PIPE_WIDTH)
    return {"color": tty, "width": max(60, width), **shown}
