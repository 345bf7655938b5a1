"""`traceq rules` lists the catalogue; `traceq explain CODE` prints a rule's documentation."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from traceq.cli.common import echo_json, format_option

from traceq.rules.config import ConfigError
from traceq.rules.engine import discover


@click.command()
@format_option()
def rules(fmt: str) -> None:
    """List every rule: built-in and from installed plugins, with its options."""
    ruleset = discover()
    if fmt == "json":
        echo_json(
            {
                "rules": [
                    {
                        "code": r.code,
                        "name": r.name,
                        "severity": r.severity,
                        "summary": r.summary,
                        "options": dict(r.defaults),
                        "zoo": list(r.zoo),
                        "origin": ruleset.origin.get(r.code, "builtin"),
                    }
                    for r in ruleset.rules
                ],
                "problems": [str(p) for p in ruleset.problems],
            }
        )
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("code", "name", "severity", "what it finds"):
        table.add_column(column, overflow="fold")
    for r in ruleset.rules:
        origin = ruleset.origin.get(r.code, "builtin")
        summary = r.summary if origin == "builtin" else f"{r.summary} [{origin}]"
        table.add_row(r.code, r.name, r.severity, summary)
    Console(width=120, soft_wrap=False).print(table)
    for problem in ruleset.problems:
        click.echo(f"traceq: warning: {problem}", err=True)


@click.command()
@click.argument("code")
def explain(code: str) -> None:
    """Print the documentation of rule CODE (a code such as TQ102, or its name)."""
    ruleset = discover()
    found = ruleset.get(code)
    if found is None:
        known = ", ".join(r.code for r in ruleset.rules)
        raise ConfigError(f"unknown rule {code!r}; known rules: {known}")
    click.echo(f"# {found.code} {found.name} ({found.severity})\n")
    click.echo(found.doc)
    if found.defaults:
        click.echo("\n## Options")
        for key, value in found.defaults.items():
            click.echo(f"- `{key}` = {value!r}  (e.g. --option {found.code}.{key}={value})")
    if found.zoo:
        click.echo(f"\n## Zoo patterns\n{', '.join(found.zoo)}")
