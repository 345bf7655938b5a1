"""`traceq roofline TRACE`: the heaviest ops, the work each did, and how far from its roof."""

from __future__ import annotations

import sys

import click
import polars as pl
from rich.table import Table
from traceq.cli.common import echo_json, format_option, load, output_console, trace_argument

from traceq.perf.roofline import roofline, summed
from traceq.perf.specs import load_spec
from traceq.reports.safe_text import LINE_CHARS, terminal


@click.command(name="roofline")
@trace_argument
@click.option(
    "--by",
    type=click.Choice(["op", "kernel", "module"]),
    default="op",
    show_default=True,
    help="One row per op (calls of one signature summed), kernel name, or module.",
)
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True)
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A spec file from `traceq device calibrate`: achievable peaks beside the datasheet.",
)
@format_option(("text", "json", "csv"))
def roofline_command(trace: str, by: str, top: int, spec_file: str | None, fmt: str) -> None:
    """Show the ops (or kernels, or modules) that take the most time, what each computed
    and moved, and how close it came to the device's compute and memory roofs."""
    loaded = load(trace)
    achievable = load_spec(spec_file) if spec_file else None
    frame = roofline(loaded, by=by, achievable=achievable)  # type: ignore[arg-type]
    if by == "op":
        frame = summed(frame)
    total_us = float(frame["time_us"].sum() or 0.0)
    frame = frame.sort("time_us", descending=True).head(top)
    if fmt == "json":
        echo_json(frame.to_dicts())
        return
    if fmt == "csv":
        flat = frame.with_columns(pl.col(pl.List(pl.Int64)).list.eval(pl.element().cast(pl.String)))
        flat = flat.with_columns(pl.col(pl.List(pl.String)).list.join("x"))
        sys.stdout.write(flat.write_csv())
        return
    render(frame, by, total_us, trace)


def render(frame: pl.DataFrame, by: str, total_us: float, trace: str) -> None:
    console = output_console()
    table = Table(title=terminal(trace, LINE_CHARS), title_justify="left")
    first = "op" if by == "op" else by
    for header in (first, "family", "shape", "dtype", "calls", "time µs", "% time"):
        table.add_column(header, justify="right" if "µs" in header or "%" in header else "left")
    for header in ("TFLOP/s", "GB/s", "% compute", "% memory", "% roof", "bound"):
        table.add_column(header, justify="right")
    label = "datasheet" if frame["pct_roof_datasheet"].is_not_null().any() else "achievable"
    for row in frame.iter_rows(named=True):
        modelled = row.get("modelled", True)
        table.add_row(
            terminal(row["name"], 60),
            terminal(row.get("family") or ""),
            terminal(_shape(row.get("shape"))),
            terminal(row.get("dtype") or ""),
            f"{row.get('calls', row.get('n_kernels', row.get('ops', 1))):,}",
            f"{row['time_us']:,.1f}",
            _pct(100 * row["time_us"] / total_us if total_us else None),
            _num(row["tflops"] if modelled else None, 1),
            _num(row["gbs"] if modelled else None, 0),
            _pct(row.get(f"pct_compute_{label}")),
            _pct(row.get(f"pct_memory_{label}")),
            _pct(row.get(f"pct_roof_{label}")),
            terminal(row.get("bound") or ("not modelled" if not modelled else "")),
        )
    console.print(table)
    if frame["pct_roof_datasheet"].is_null().all() and frame["pct_roof_achievable"].is_null().all():
        console.print("no roofs: the device is not in traceq's spec table (or a CPU trace)")


def _shape(shape: list[int] | None) -> str:
    return "×".join(map(str, shape)) if shape else ""


def _num(value: float | None, digits: int) -> str:
    return "" if value is None or value != value else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "" if value is None or value != value else f"{value:.0f}%"
