"""What every part of data flow shares: the edge frame's columns, what a reader is given
(`Flow`), and the test for an edge matched past an op that recorded no shape.

An edge is one producer -> consumer read between two rows of `dataflow_ops`: the
producer's result is the consumer's input `input_index` (null when the edge rests on
program order alone), with the `shape` read, how sure it is (`confidence`, 0..1] and what
it rests on (`evidence`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.matching import numel_key

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

EDGE_SCHEMA = {
    "producer": pl.Int64,
    "consumer": pl.Int64,
    "producer_name": pl.String,
    "consumer_name": pl.String,
    "input_index": pl.Int64,
    "shape": pl.List(pl.Int64),
    "confidence": pl.Float64,
    "evidence": pl.String,
    "inferred": pl.Boolean,
}
"""The columns of `dataflow`'s frame, inferred or exact (`execution_trace`)."""


@dataclass(frozen=True)
class Flow:
    """What a reader (`readers.READERS`) reads besides the edges so far.

    `nodes`: the semantic ops in thread order with their matching keys and module calls
    (`inferred._numbered`); `ops`: the same ops as `dataflow_ops` returns them; `all_ops`:
    every op of the trace (`trace.ops`: autograd nodes, the ops inside a semantic op);
    `aliases`: events of the ops that returned their input (`inferred.returned_inputs`);
    `trace`: the loaded trace itself."""

    nodes: pl.DataFrame
    ops: pl.DataFrame
    all_ops: pl.DataFrame
    aliases: pl.Series
    trace: LoadedTrace


def unshaped(confidence: pl.Expr, evidence: str) -> list[pl.Expr]:
    """Columns of an edge with no input position or shape: it rests on order alone."""
    return [
        pl.lit(None, dtype=pl.Int64).alias("input_index"),
        pl.lit(None, dtype=pl.List(pl.Int64)).alias("shape"),
        confidence.alias("confidence"),
        pl.lit(evidence).alias("evidence"),
    ]


def passed_shapeless(
    edges: pl.DataFrame,
    ordered: pl.DataFrame,
    shapeless: pl.Expr,
    by: list[str],
    numel: pl.Expr | None = None,
) -> pl.DataFrame:
    """The rows of `edges` matched past an op that recorded no shape: an op of `ordered`
    for which `shapeless` holds ran on the consumer's thread (`by`) after the producer and
    before the consumer, in `ordered`'s thread order `_seq`.

    Kineto leaves an op's result shape unknown where it recorded no arguments (Inductor's
    C++ kernels) or not their values (a `view`'s size before PyTorch 2.2). Such an op may
    have written, or reshaped, the value the consumer read, so an edge that bridges it
    rests on a shape the op hid: unknown beats wrong. With `numel` (the element count of
    what each op of `ordered` read, a shape expression), only such an op holding as many
    elements as the edge's `shape` counts: a reshape keeps its input's element count.
    Readers: `readers.unsized_views` (reshapes of unrecorded size) and TQ105's
    `unbroken` (a compiled graph's argument-less kernels)."""
    keys = [*by, "_numel"] if numel is not None else list(by)
    marks = ordered.filter(shapeless).select(
        *by,
        pl.col("_seq").alias("_mseq"),
        *([numel_key(numel).alias("_numel")] if numel is not None else []),
    )
    if edges.height == 0 or marks.height == 0:
        return edges.clear()
    seq = ordered.select("event", *by, "_seq")
    located = (
        edges.with_row_index("_edge")
        .join(
            seq.select(pl.col("event").alias("producer"), pl.col("_seq").alias("_pseq")),
            on="producer",
        )
        .join(seq.rename({"event": "consumer"}), on="consumer")
    )
    if numel is not None:
        located = located.with_columns(numel_key(pl.col("shape")).alias("_numel"))
        located, marks = located.drop_nulls("_numel"), marks.drop_nulls("_numel")
    passed = (
        located.sort("_seq")
        .join_asof(
            marks.sort("_mseq"),
            left_on="_seq",
            right_on="_mseq",
            by=keys,
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .filter(pl.col("_mseq") > pl.col("_pseq"))
    )
    return (
        edges.with_row_index("_edge")
        .join(passed.select("_edge"), on="_edge", how="semi")
        .drop("_edge")
    )
