"""`traceq rules` lists the catalogue; `traceq explain CODE` prints a rule's documentation."""

from __future__ import annotations

import click
from rich.table import Table
from traceq.cli.common import echo_json, format_option, output_console

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
    output_console().print(table)
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
    doc = found.doc.rstrip("\n")
    if found.defaults:
        key, value = next(iter(found.defaults.items()))
        how = (
            f"Set one with `--option {found.code}.NAME=VALUE`, "
            f"e.g. `--option {found.code}.{key}={value}`."
        )
        if "## Options" in doc:  # the doc's own section, once, with how to set them
            doc = _in_section(doc, "## Options", how)
        else:
            listed = "\n".join(f"- `{k}` ({v!r})" for k, v in found.defaults.items())
            doc += f"\n\n## Options\n{listed}\n\n{how}"
    if found.zoo and "## Zoo" not in doc:
        doc += f"\n\n## Zoo patterns\n{', '.join(found.zoo)}"
    click.echo(doc)


def _in_section(doc: str, heading: str, text: str) -> str:
    """`doc` with `text` as the last paragraph of its `heading` section."""
    start = doc.index(heading)
    end = doc.find("\n## ", start + len(heading))
    end = len(doc) if end < 0 else end
    return f"{doc[:end].rstrip()}\n\n{text}\n{doc[end:]}"
