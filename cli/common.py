"""What every command shares: loading with a progress display, and output formats."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

import traceq
from traceq import Trace

FORMAT = click.Choice(["text", "json"])
# Any path: a directory or a missing file is the library's to report (one line, exit 2),
# where click would print a usage block.
trace_argument = click.argument("trace", type=click.Path())


def split_codes(values: tuple[str, ...]) -> list[str]:
    """`--select TQ1,TQ201 --select TQ3` -> ['TQ1', 'TQ201', 'TQ3']."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@contextlib.contextmanager
def progress(message: str, *, delay: float = 1.0) -> Iterator[None]:
    """A spinner on stderr, shown only on a TTY and only once work takes over `delay` s."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    status = Console(stderr=True).status(message)
    timer = threading.Timer(delay, status.start)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        status.stop()


def load(path: str) -> Trace:
    with progress(f"Loading {path} ..."):
        return traceq.load(path)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))
