"""What every command shares: loading with a progress display, output formats and paths."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

import traceq
import traceq.loader.load
from traceq import Trace, TraceError
from traceq.job.engine import ENGINES

if TYPE_CHECKING:
    from traceq.relations.critical_path import Region

FORMATS = ("text", "json")
NO_CACHE = "traceq.no_cache"  # the click context's `meta` key `--no-cache` sets
CAPTURE = "traceq.capture"  # the click context's `meta` key `--capture` sets
EXECUTION_TRACE = "traceq.execution_trace"  # the `meta` key `--et` / `--no-et` set
F = TypeVar("F", bound=Callable[..., Any])


def trace_argument(command: F) -> F:
    """The TRACE argument (any path: a directory or a missing file is the library's to report
    in one line, exit 2, where click would print a usage block), `--no-cache`, `--capture`,
    `--et` and `--no-et`."""
    return _et_options(
        _capture_option(_no_cache_option(click.argument("trace", type=click.Path())(command)))
    )


def traces_argument(command: F) -> F:
    """TRACE as a trace or a job (a directory, a glob pattern, or several files, one per
    rank), `--no-cache`, `--capture`, `--et` and `--no-et`."""
    argument = click.argument("trace", nargs=-1, required=True, type=click.Path(), metavar="TRACE")
    return _et_options(_capture_option(_no_cache_option(argument(command))))


def _et_options(command: F) -> F:
    """`--et PATH` and `--no-et`: the Execution Trace exact data flow comes from, noted on
    the click context, where `execution_trace_choice` reads it for the trace's load."""
    command = click.option(
        "--no-et",
        is_flag=True,
        expose_value=False,
        callback=_no_et,
        help="Infer data flow from shapes and order, even with an Execution Trace beside TRACE.",
    )(command)
    return click.option(
        "--et",
        type=click.Path(exists=True, dir_okay=False),
        expose_value=False,
        callback=_et,
        help="Execution Trace recorded with TRACE, for exact data flow; by default "
        "<stem>.et.json.gz beside TRACE.",
    )(command)


def _et(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        if ctx.meta.get(EXECUTION_TRACE) is False:
            raise click.UsageError("choose one of --et and --no-et")
        ctx.meta[EXECUTION_TRACE] = value


def _no_et(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        if isinstance(ctx.meta.get(EXECUTION_TRACE), str):
            raise click.UsageError("choose one of --et and --no-et")
        ctx.meta[EXECUTION_TRACE] = False


def execution_trace_choice() -> str | bool | None:
    """The `execution_trace` to pass to `traceq.load`: `--et`'s path, False under `--no-et`,
    else None (the Execution Trace beside the trace, if any)."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(EXECUTION_TRACE)


def _capture_option(command: F) -> F:
    """`--capture PATH`: the capture trace of the CUDA/HIP graphs a trace replays, noted on
    the click context, where `capture_choice` reads it for every load the command makes."""
    return click.option(
        "--capture",
        type=click.Path(exists=True),
        expose_value=False,
        callback=_capture,
        help="Capture trace (or capture_traces/ folder) of the CUDA/HIP graphs TRACE "
        "replays; by default capture_traces/ beside TRACE.",
    )(command)


def _capture(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[CAPTURE] = value


def capture_choice() -> str | None:
    """The `capture` to pass to `traceq.load`: `--capture`'s path, else None (the
    `capture_traces/` folder beside the trace, if any)."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(CAPTURE)


def _no_cache_option(command: F) -> F:
    return click.option(
        "--no-cache",
        is_flag=True,
        expose_value=False,
        callback=_no_cache,
        help="Load the trace from its JSON, neither reading nor writing the cache.",
    )(command)


def _no_cache(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """`--no-cache`: noted on the command's click context, where `cache_choice` reads it for
    every load the command makes (the library's too, through their `cache` parameters).
    Nothing global changes: not `TRACEQ_CACHE`, which keeps working on its own."""
    if value:
        ctx.meta[NO_CACHE] = True


def cache_choice() -> bool | None:
    """The `cache` to pass to `traceq.load` and the library: False under `--no-cache`,
    else None (the library's default: on unless `TRACEQ_CACHE=0`)."""
    ctx = click.get_current_context(silent=True)
    return False if ctx is not None and ctx.meta.get(NO_CACHE) else None


class OutputError(TraceError):
    """An output path that cannot be written: a missing directory, a directory, no permission.

    A `TraceError`, so the CLI prints it in one line with exit status 2: a traceback with
    exit 1 would read in CI as "a finding reached --fail-on".
    """


def cannot_write(path: str | os.PathLike[str], reason: str) -> OutputError:
    return OutputError(f"cannot write {os.fspath(path)}: {reason}")


def check_output(path: str | os.PathLike[str]) -> None:
    """Fail before the (slow) load when `path` clearly cannot be written; creates nothing.

    What this cannot see (a read-only file when running as root, a full disk) `writing`
    catches at the write itself.
    """
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise cannot_write(path, "it is a directory")
    if not folder.exists():
        raise cannot_write(path, f"directory {folder} does not exist")
    if not folder.is_dir():
        raise cannot_write(path, f"{folder} is not a directory")
    if not os.access(target if target.exists() else folder, os.W_OK):
        raise cannot_write(path, "permission denied")


def output_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """click callback for every `-o/--output`: `check_output` as soon as options are parsed."""
    if value is not None:
        check_output(value)
    return value


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an `OSError` raised while writing `path` into one `OutputError` line."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOENT and not Path(path).parent.is_dir():
            raise cannot_write(path, f"directory {Path(path).parent} does not exist") from None
        reason = exc.strerror or str(exc)
        raise cannot_write(path, reason[:1].lower() + reason[1:]) from None


def rule_selection(command: F) -> F:
    """`--select` and `--ignore`: which rules run (`annotate`; with `--option`, `rule_options`)."""
    command = click.option("--ignore", multiple=True, help="rule codes or prefixes to skip")(
        command
    )
    return click.option(
        "--select", multiple=True, help="rule codes or prefixes to run (e.g. TQ1,TQ201)"
    )(command)


def rule_options(command: F) -> F:
    """`--select`, `--ignore` and `--option` as `analyze` takes them (also `report`)."""
    command = click.option(
        "--option",
        "options",
        multiple=True,
        metavar="CODE.NAME=VALUE",
        help="a rule threshold, e.g. TQ201.min_gap_us=5 (repeatable)",
    )(command)
    return rule_selection(command)


def format_option(choices: Sequence[str] = FORMATS) -> Callable[[F], F]:
    """`--format` (as `fmt`), one of `choices`, text by default."""
    return click.option(
        "--format", "fmt", type=click.Choice(choices), default="text", show_default=True
    )


def output_option(help: str, **settings: Any) -> Callable[[F], F]:
    """`-o/--output`, checked as soon as options are parsed (`output_path`); `help` and
    `settings` (`required`, `default`) say what this command writes there."""
    return click.option(
        "-o", "--output", type=click.Path(), callback=output_path, help=help, **settings
    )


@dataclass(frozen=True)
class JobEngine:
    """Where a job's per-rank work runs: `--engine`, `--address` (Ray), `--workers`."""

    name: str = "local"
    address: str | None = None
    workers: int | None = None


def job_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--engine`, `--address` and `--workers`, handed to the command as one `engine`
    (a `JobEngine`), so neither the commands nor `cli.jobs` spell out all three."""

    @functools.wraps(command)
    def run(*args: Any, engine: str, address: str | None, workers: int | None, **kwargs: Any):
        return command(*args, engine=JobEngine(engine, address, workers), **kwargs)

    return with_options(
        run,
        click.option(
            "--engine",
            type=click.Choice(ENGINES),
            default="local",
            show_default=True,
            help="job: where per-rank work runs (local processes, this process, or Ray)",
        ),
        click.option("--address", help="job: a Ray cluster's address (--engine ray)"),
        click.option(
            "--workers",
            type=click.IntRange(min=1),
            help="job: processes (default: by cores, memory)",
        ),
    )


def region_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--step`, `--annotation` (+ `--instance`) or `--window`, handed to the command as one
    `region` (`region_of`): the part of the trace whose critical path is asked for."""

    @functools.wraps(command)
    def run(
        *args: Any,
        step: int | None,
        annotation: str | None,
        instance: int,
        window: tuple[int, int] | None,
        **kwargs: Any,
    ):
        return command(*args, region=region_of(step, annotation, instance, window), **kwargs)

    return with_options(
        run,
        click.option("--step", type=int, help="Critical path of this ProfilerStep only."),
        click.option(
            "--annotation", help="Critical path of this annotation (record_function) or op only."
        ),
        click.option(
            "--instance",
            type=int,
            default=0,
            show_default=True,
            help="Which annotation (0: the first).",
        ),
        click.option(
            "--window",
            nargs=2,
            type=int,
            metavar="START_NS END_NS",
            help="Critical path of this time window only.",
        ),
    )


def with_options(command: F, *options: Callable[[F], F]) -> F:
    """`command` with click `options`, listed in `--help` in the order given."""
    for option in reversed(options):
        command = option(command)
    return command


def region_of(
    step: int | None, annotation: str | None, instance: int, window: tuple[int, int] | None
) -> Region:
    """The one region `--step`, `--annotation` (+ `--instance`) or `--window` names."""
    chosen = [x for x in (step, annotation, window) if x is not None]
    if len(chosen) > 1:
        raise TraceError("choose one of --step, --annotation and --window")
    if step is not None:
        return step
    if annotation is not None:
        return (annotation, instance)
    if window is not None:
        return (int(window[0]), int(window[1]))
    return None


def split_codes(values: tuple[str, ...]) -> list[str]:
    """`--select TQ1,TQ201 --select unfused-glu` -> ['TQ1', 'TQ201', 'TQ103']: codes, code
    prefixes, `ALL` and rule names (as `explain` takes them), each resolved through the
    catalogue; an unknown one is an error that names the closest rules."""
    refs = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not refs:
        return []
    from traceq.rules.engine import discover

    rules = discover().rules
    return [_rule_ref(ref, rules) for ref in refs]


def _rule_ref(ref: str, rules: Sequence[Any]) -> str:
    """One `--select`/`--ignore` entry as a code or prefix the configuration takes."""
    import difflib

    from traceq.rules.config import ConfigError

    if ref.upper() == "ALL" or any(r.code.startswith(ref.upper()) for r in rules):
        return ref.upper()
    named = next((r for r in rules if r.name == ref.lower()), None)
    if named is not None:
        return named.code
    known = [r.name for r in rules] + [r.code for r in rules]
    close = difflib.get_close_matches(ref, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "see 'traceq rules'"
    what = "rule code or prefix" if re.fullmatch(r"(?i)TQ\d*", ref) else "rule"
    raise ConfigError(f"unknown {what} {ref!r}; {hint}")


@contextlib.contextmanager
def progress(message: str, *, delay: float = 1.0) -> Iterator[None]:
    """A spinner on stderr, shown only on a TTY and only once work takes over `delay` s."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    from traceq.reports.safe_text import LINE_CHARS, terminal

    status = Console(stderr=True).status(terminal(message, LINE_CHARS))  # paths as text
    timer = threading.Timer(delay, status.start)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        status.stop()


def load(path: str) -> Trace:
    """Load a trace, with a progress bar on stderr when it is a terminal (not in pipes, CI)."""
    console = _terminal()
    settings = {
        "cache": cache_choice(),
        "capture": capture_choice(),
        "execution_trace": execution_trace_choice(),
    }
    if console is None:
        return traceq.load(path, **settings)
    with LoadBar(path, console) as bar:
        return traceq.load(path, progress=bar.update, **settings)


def _terminal() -> Any:
    if not sys.stderr.isatty() or os.environ.get("CI"):
        return None
    from rich.console import Console

    return Console(stderr=True)


class LoadBar:
    """One load's progress: phase, bytes read of the file's size (compressed bytes for gzip),
    events parsed, time left. Shown only once the load takes over `delay` seconds, and
    cleared when it ends."""

    def __init__(self, path: str, console: Any, *, delay: float = 1.0) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        from traceq.reports.safe_text import LINE_CHARS, clip, printable

        self._path = printable(clip(path, LINE_CHARS))  # shown as text, never as markup
        self._bar = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[events]:,} events"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._task = self._bar.add_task(f"Loading {self._path}", total=None, events=0)
        self._timer = threading.Timer(delay, self._bar.start)

    def __enter__(self) -> LoadBar:
        self._timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._timer.cancel()
        self._bar.stop()

    def update(self, state: traceq.loader.load.Progress) -> None:
        sizes = {"completed": state.read} if state.read else {}
        if state.total is not None:
            sizes["total"] = state.total
        description = f"{state.phase.capitalize()} {self._path}"
        self._bar.update(self._task, description=description, events=state.events, **sizes)


PIPE_WIDTH = 1000  # off a terminal: wide enough that no table drops or squeezes a column


def output_width() -> int | None:
    """The width stdout renders at: the terminal's (None: rich asks it) on a TTY; in a pipe
    or a CI log `COLUMNS` when set, else `PIPE_WIDTH`, where rich would take 80 columns and
    squeeze tables to "comp…" and blank cells. Names stay capped by `safe_text.clip`."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


def output_console() -> Any:
    """The rich Console every command prints tables to (`output_width`)."""
    from rich.console import Console

    return Console(width=output_width(), soft_wrap=False)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))
