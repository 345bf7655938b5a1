"""`traceq query TRACE SQL`: SQL over the trace's frames."""

from __future__ import annotations

import click
import polars as pl
from traceq.cli.common import format_option, load, trace_argument

from traceq import TraceError


class QueryError(TraceError):
    """The SQL could not run: a syntax error, an unknown table or column."""


@click.command()
@trace_argument
@click.argument("sql")
@format_option(("text", "json", "csv"))
@click.option("--limit", type=int, default=50, show_default=True, help="Rows shown as text.")
def query(trace: str, sql: str, fmt: str, limit: int) -> None:
    """Run SQL over TRACE's frames: events, ops, kernels, runtime, annotations, steps,
    python, modules, flows, flow_points, syncs, counters, instants, threads, other.

    Example: traceq query t.json "SELECT name, sum(dur_ns)/1e3 AS us FROM kernels
    GROUP BY name ORDER BY us DESC LIMIT 5"
    """
    loaded = load(trace)
    try:
        result = loaded.sql(sql)
    except (pl.exceptions.PolarsError, ValueError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QueryError(f"SQL failed: {message}") from None
    if fmt == "json":
        click.echo(result.write_json())
    elif fmt == "csv":
        click.echo(flat_for_csv(result).write_csv(), nl=False)
    else:
        from traceq.reports.safe_text import printable

        with pl.Config(tbl_rows=limit, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=160):
            table = str(result)
        # the trace's names as text: no control character reaches the terminal
        click.echo("\n".join(printable(line) for line in table.split("\n")))


def flat_for_csv(frame: pl.DataFrame) -> pl.DataFrame:
    """CSV has no lists or structs: write each nested value as its JSON text."""
    return frame.with_columns(
        pl.struct(pl.col(name).alias("v"))
        .struct.json_encode()
        .str.json_path_match("$.v")
        .alias(name)
        for name, dtype in frame.schema.items()
        if dtype.is_nested()
    )
