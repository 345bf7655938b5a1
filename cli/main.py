"""Entry point: the `traceq` group, and one-line errors with exit 2 for bad input.

Every error any command prints is one line that starts `traceq: error:`: bad input (a
`TraceError`), an output path that cannot be written, and click's own usage errors (a
missing option, a bad value), which click would otherwise print as a usage block.

Commands are imported when used, so `traceq info` never imports torch (only `zoo` needs it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import NoReturn

import click

from traceq import TraceError, __version__

COMMANDS = {
    "info": "traceq.cli.info:info",
    "query": "traceq.cli.query:query",
    "analyze": "traceq.cli.analyze:analyze",
    "rules": "traceq.cli.rules:rules",
    "explain": "traceq.cli.rules:explain",
    "critical-path": "traceq.cli.critical_path:critical_path",
    "annotate": "traceq.cli.annotate:annotate",
    "report": "traceq.cli.report:report",
    "diff": "traceq.cli.diff:diff",
    "baseline": "traceq.cli.baseline:baseline",
    "check": "traceq.cli.check:check",
    "zoo": "traceq.cli.zoo:zoo",
    "cache": "traceq.cli.cache:cache",
    "roofline": "traceq.cli.roofline:roofline_command",
    "device": "traceq.cli.device:device",
}


class Group(click.Group):
    """Lazy commands; every `TraceError` becomes one line on stderr and exit status 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if importlib.util.find_spec(_module(name)) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or importlib.util.find_spec(_module(name)) is None:
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attr)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """A mistyped command names the closest ones: `no command 'analyse'; did you mean
        'analyze'?`, exit 2."""
        name = args[0] if args else None
        if name is not None and not name.startswith("-") and name not in COMMANDS:
            import difflib

            from traceq.reports.safe_text import clip, printable

            close = difflib.get_close_matches(name, list(COMMANDS), n=3, cutoff=0.6)
            hint = (
                f"did you mean {' or '.join(repr(c) for c in close)}?"
                if close
                else "see 'traceq --help'"
            )
            click.echo(f"traceq: error: no command {printable(clip(name))!r}; {hint}", err=True)
            sys.exit(2)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TraceError as exc:
            from traceq.reports.safe_text import LINE_CHARS, clip, printable

            # one line, whatever a path or a name in the message holds
            click.echo(f"traceq: error: {printable(clip(exc, LINE_CHARS))}", err=True)
            sys.exit(2)
        except click.UsageError as exc:
            _usage_error(exc, ctx)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """An unknown option before the command (`traceq --bogus`) is one line too."""
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise  # bare `traceq`: the help, not an error
        except click.UsageError as exc:
            _usage_error(exc, ctx)


def _usage_error(exc: click.UsageError, ctx: click.Context) -> NoReturn:
    where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
    message = " ".join(exc.format_message().split())
    click.echo(f"traceq: error: {message} (see '{where} --help')", err=True)
    sys.exit(2)


def _module(name: str) -> str:
    return COMMANDS[name].split(":")[0]


@click.group(cls=Group)
@click.version_option(__version__, prog_name="traceq")
def main() -> None:
    """Read PyTorch profiler traces: what to fuse, what it saves, and proof of the fix."""
