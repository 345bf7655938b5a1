"""`traceq cache info|clear`: the columnar cache of loaded traces (`traceq.loader.cache`)."""

from __future__ import annotations

import click

from traceq.loader import cache as C


@click.group()
def cache() -> None:
    """The cache of loaded traces: a second load of a file reads its frames, not its JSON."""


@cache.command()
def info() -> None:
    """Where the cache is, whether it is on, how many traces it holds and its size."""
    for label, value in C.describe():
        click.echo(f"{label + ':':<9} {value}")


@cache.command()
def clear() -> None:
    """Remove every cached trace (they are rebuilt on their next load)."""
    count, size = C.clear()
    click.echo(f"removed {count} cached trace{'s' if count != 1 else ''} ({C.size_text(size)})")
