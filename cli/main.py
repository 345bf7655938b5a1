"""Entry point: the `traceq` group, and one-line errors with exit 2 for bad input."""

from __future__ import annotations

import sys

import click

from cli.info import info
from cli.query import query
from traceq import TraceError, __version__


class Group(click.Group):
    """Turns every `TraceError` into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TraceError as exc:
            click.echo(f"traceq: error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=Group)
@click.version_option(__version__, prog_name="traceq")
def main() -> None:
    """Read PyTorch profiler traces: what to fuse, what it saves, and proof of the fix."""


main.add_command(info)
main.add_command(query)
