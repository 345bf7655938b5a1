"""``traceq zoo``: list the kernel zoo, check its entries' numbers and speed, and verify
that a fused entry makes a finding go away.

Thin on purpose: parse options, call ``zoo``, render. torch and the kernels are imported
inside the commands, so ``traceq`` itself starts without them. Exit status: 0 all good,
1 an entry failed numerics (``check``) or the finding is still there (``verify``), 2 a bad
request (one line on stderr, never a traceback).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console
from rich.table import Table
from traceq.cli.common import cannot_write, format_option, with_options, writing

if TYPE_CHECKING:
    from traceq.zoo.check import CheckReport
    from traceq.zoo.registry import Zoo
    from traceq.zoo.verify import TraceStats, VerifyResult


def _fail_usage(message: str) -> NoReturn:
    click.echo(f"traceq: error: {message}", err=True)
    sys.exit(2)


def _keep_folder(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--keep DIR`: made when missing (like `mkdir -p`); one line and exit 2 when it cannot
    be, before minutes of recording."""
    if value is None:
        return value
    if Path(value).exists() and not Path(value).is_dir():
        raise cannot_write(value, "it is not a directory")
    with writing(value):
        Path(value).mkdir(parents=True, exist_ok=True)
    if not os.access(value, os.W_OK):
        raise cannot_write(value, "permission denied")
    return value


def _case_options(command: Any) -> Any:
    """`--shape`, `--act`, `--dtype` and `--device`: the case `check` and `verify` run."""
    return with_options(
        command,
        click.option(
            "--shape", required=True, help="M,K,N: rows, input features, output features."
        ),
        click.option(
            "--act", default="gelu", show_default=True, help="gelu, gelu_tanh, relu, silu, none"
        ),
        click.option(
            "--dtype", default="float32", show_default=True, help="float32, tf32, bf16, ..."
        ),
        click.option(
            "--device",
            type=click.Choice(["cpu", "cuda"]),
            default=None,
            help="default: cuda if present",
        ),
    )


def _console() -> Console:
    # Off a terminal rich would wrap at 80 columns; entry names must stay whole.
    return Console(width=None if sys.stdout.isatty() else 160, soft_wrap=False)


def _prepare_triton(device: str | None) -> None:
    """Run Triton entries in the interpreter when there is no GPU to run them on.

    The flag is read when the kernel modules are imported, so it is set before discovery,
    and only when the user has not set it and no kernel module is loaded yet.
    """
    if "traceq.zoo.triton_support" in sys.modules or "TRITON_INTERPRET" in os.environ:
        return
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        return
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _discover(device: str | None) -> Zoo:
    _prepare_triton(device)
    try:
        from traceq.zoo.registry import discover
    except ImportError as error:
        _fail_usage(f"the zoo needs its extra dependencies (pip install 'traceq[zoo]'): {error}")
    return discover()


@click.group("zoo")
def zoo() -> None:
    """Reference and fused kernels for the patterns traceq flags, and their check."""


@zoo.command("list")
@format_option()
def list_entries(fmt: str) -> None:
    """List every zoo entry (built-in and plugins) and whether it can run here."""
    found = _discover(None)
    if fmt == "json":
        payload = {
            "entries": [e.to_dict() for e in found.entries],
            "problems": [p.to_dict() for p in found.problems],
        }
        click.echo(json.dumps(payload, indent=2))
        return
    table = Table(title="traceq zoo")
    for column in ("entry", "pattern", "impl", "activations", "dtypes", "devices", "here"):
        table.add_column(column, overflow="fold")
    for entry in found.entries:
        ok, reason = entry.available()
        here = ("yes" if ok else "no") + (f": {reason}" if reason else "")
        activations = ", ".join(entry.activations)
        for device, acts in entry.activations_on.items():
            activations += f" ({device}: {', '.join(acts)})"
        table.add_row(
            entry.name,
            entry.pattern,
            entry.impl,
            activations,
            ", ".join(entry.dtypes),
            ", ".join(entry.devices),
            here,
        )
    console = _console()
    console.print(table)
    for problem in found.problems:
        console.print(f"[red]plugin problem[/red] {problem.source}: {problem.error}")


def _format_float(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _render_check(report: CheckReport) -> None:
    console = _console()
    m, k, n = report.shape
    console.print(
        f"[bold]{report.pattern}[/bold] M={m} K={k} N={n} {report.dtype} on {report.device}, "
        f"act={report.act}; bound ‖out−ref‖/‖ref‖ ≤ {report.bound:g} against float64 "
        f"{report.reference}; cases: {', '.join(report.cases)}"
    )
    numerics = Table(title="numerics")
    for column in ("entry", "impl", "status", "max rel err", "cases passed", "poisoning", "note"):
        numerics.add_column(column, overflow="fold")
    for result in report.entries:
        passed = sum(c.passed for c in result.cases)
        status = {"pass": "[green]pass[/green]", "fail": "[red]FAIL[/red]"}.get(
            result.status, "skipped"
        )
        numerics.add_row(
            result.entry,
            result.impl,
            status,
            _format_float(result.max_rel_error, ".2e"),
            f"{passed}/{len(result.cases)}" if result.cases else "—",
            result.poisoning or "—",
            result.note,
        )
    console.print(numerics)

    timed = [(r, c) for r in report.entries for c in r.timed_cases]
    if timed:
        timings = Table(title="timings (main case)")
        for column in ("case", "entry", "median ms", "TFLOP/s", "GB/s", "% peak", "speedup", "how"):
            timings.add_column(column, overflow="fold")
        for result, case in timed:
            assert case.timing is not None
            t = case.timing
            fraction = t.peak_tflops_fraction if t.tflops is not None else t.peak_gbps_fraction
            timings.add_row(
                case.case,
                result.entry,
                f"{t.median_ms:.4f}",
                _format_float(t.tflops, ".3f"),
                f"{t.gbps:.1f}",
                _format_float(None if fraction is None else 100 * fraction, ".1f"),
                _format_float(case.speedup, ".2f") + ("×" if case.speedup else ""),
                t.method,
            )
        console.print(timings)
    else:
        console.print("no timings (nothing here runs compiled code it could time)")
    for result in report.failures:
        for case in result.cases:
            if not case.passed:
                error = _format_float(case.rel_error, ".2e")
                console.print(
                    f"[red]FAIL[/red] {result.entry} {case.case} {case.shape}: "
                    f"{case.error} (rel err {error}, bound {case.bound:g})"
                )
    for problem in report.problems:
        console.print(f"[red]plugin problem[/red] {problem.source}: {problem.error}")


@zoo.command("check")
@click.argument("pattern")
@_case_options
@click.option(
    "--entry", "select", multiple=True, help="Only this entry (name or impl); repeatable."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-timing", is_flag=True, help="Check numerics only.")
@format_option()
def check_pattern(
    pattern: str,
    shape: str,
    act: str,
    dtype: str,
    device: str | None,
    select: tuple[str, ...],
    seed: int,
    no_timing: bool,
    fmt: str,
) -> None:
    """Check every applicable entry of PATTERN against float64, and time it.

    Exit 1 when any entry fails numerics on any case.
    """
    found = _discover(device)
    from traceq.zoo.check import check
    from traceq.zoo.errors import ZooUsageError
    from traceq.zoo.patterns import parse_shape
    from traceq.zoo.registry import cuda_available

    device = device or ("cuda" if cuda_available() else "cpu")
    options: dict[str, Any] = {"zoo": found, "seed": seed, "timing": not no_timing}
    if select:
        options["select"] = set(select)
    try:
        report = check(pattern, parse_shape(shape), dtype, device, act, **options)
    except ZooUsageError as error:
        _fail_usage(str(error))
    if fmt == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _render_check(report)
    if not report.passed:
        sys.exit(1)


def _render_verify(result: VerifyResult) -> None:
    console = _console()
    assert result.shape is not None and result.requested_shape is not None
    shape = "×".join(map(str, result.shape))
    scale = ""
    if result.scale > 1:
        requested = "×".join(map(str, result.requested_shape))
        scale = f" (scaled 1/{result.scale} from {requested})"
    console.print(
        f"[bold]verify {' + '.join(result.rules)}[/bold] with {result.pattern}: M,K,N "
        f"{shape}{scale} {result.dtype} on {result.device}, act={result.act}"
    )
    table = Table(title="recorded traces")
    columns = ("trace", "entry", "ops/step (top level)", "ops", "kernels", "time/step")
    for column in (*columns, *(f"{rule} fired" for rule in result.rules)):
        table.add_column(column, overflow="fold")
    for side, stats in (("split", result.split), ("fused", result.fused)):
        assert stats is not None
        table.add_row(
            side,
            stats.entry,
            _top_level(stats),
            str(stats.ops),
            str(stats.kernels),
            _step_time(stats),
            *(str(stats.findings[rule]) for rule in result.rules),
        )
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    colour = "green" if result.gone else "red"
    console.print(f"[{colour}]{result.summary}[/{colour}]")


def _top_level(stats: TraceStats) -> str:
    steps = max(stats.steps, 1)
    return ", ".join(
        f"{name} ×{count / steps:g}" if count != steps else name
        for name, count in stats.top_level_ops.items()
    )


def _step_time(stats: TraceStats) -> str:
    text = f"{stats.step_us:,.1f} µs {stats.clock}"
    return text if stats.timed else f"{text} (interpreted: no measurement)"


@zoo.command("verify")
@click.argument("pattern")
@_case_options
@click.option("--entry", default=None, help="The fused entry to record (default: the best here).")
@click.option("--variant", default=None, help="mlp: plain (Linear->act->Linear) or gated (GLU).")
@click.option(
    "--scale",
    type=click.IntRange(min=1),
    default=None,
    help="Divide M, K, N by this (default: 1 on CUDA, enough to stay small on the CPU).",
)
@click.option("--steps", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--keep",
    type=click.Path(),
    callback=_keep_folder,
    default=None,
    help="Keep the two recorded traces in this directory (made when missing).",
)
@format_option()
def verify_pattern(
    pattern: str,
    shape: str,
    act: str,
    dtype: str,
    device: str | None,
    entry: str | None,
    variant: str | None,
    scale: int | None,
    steps: int,
    keep: str | None,
    fmt: str,
) -> None:
    """Record PATTERN's split reference and a fused entry, analyze both traces, and show
    that the rule the pattern fixes fires on the first and not on the second.

    Exit 0 when the finding is gone from the fused trace, 1 when it is not.
    """
    found = _discover(device)
    from traceq.zoo.errors import ZooUsageError
    from traceq.zoo.patterns import parse_shape
    from traceq.zoo.verify import verify

    try:
        result = verify(
            pattern,
            shape=parse_shape(shape),
            act=act,
            dtype=dtype,
            device=device,
            entry=entry,
            scale=scale,
            variant=variant,
            steps=steps,
            keep=keep,
            zoo=found,
        )
    except ZooUsageError as error:
        _fail_usage(str(error))
    if fmt == "json":
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _render_verify(result)
    if not result.gone:
        sys.exit(1)
