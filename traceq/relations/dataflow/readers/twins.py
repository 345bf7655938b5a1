"""Twin ops read twin values in order: `cos.to(dtype), sin.to(dtype)` (`twin_reads`).

After twin values (`cos(x) * s, sin(x) * s`) the most recent value of their shape is the
second, and shape matching gives it to both twin ops; the first twin op reads the first
value (`twin_reads`), and where the first value has no reader, ops of one name that read
the second 2n times alternate between the two (`_alternating`).

Reads: twin ops reading twin values in order (`cos.to(dtype), sin.to(dtype)`; the four
products of `q * cos + rotate_half(q) * sin` and k's, alternating). Appears in:
rotary-embedding decoders (LLaMA, Mistral, Mixtral, Qwen2/3, Gemma); corpus entries whose
edges it changes: `gemma`, `llama`, `llama_generate`, `llama_mha`, `mistral`, `mixtral`,
`qwen2`, `qwen3`. On the ET corpus: +77 right, -77 wrong, -77 missed edges (without it:
precision 0.981, recall 0.948; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.matching import THREAD, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`twin_reads` as a reader (`readers.READERS`)."""
    return twin_reads(edges, flow.nodes)


def twin_reads(edges: pl.DataFrame, nodes: pl.DataFrame, reach: int = 3) -> pl.DataFrame:
    """Twin ops read twin values in order: `cos.to(dtype), sin.to(dtype)`.

    Twins are two ops of one name and output shape in one module call, the second at most
    `reach` ops after the first on its thread (`cos(x) * s, sin(x) * s`); twin ops run
    one right after the other (`cos.to(...), sin.to(...)`). When twin ops run after twin
    values, the most recent value of that shape is the second one, and shape matching
    gives it to both; the first twin op reads the first twin value. A value read by twin
    ops that has no twin (`x[..., :h], x[..., h:]`) is left as it is.
    """
    if edges.height == 0:
        return edges
    same = [*THREAD, "_call", "name", "_out_shape"]
    ordered = nodes.select("event", "_seq", *same).drop_nulls("_out_shape").sort("_seq")
    previous = ordered.with_columns(
        pl.col("event").shift().over(same).alias("_first"),
        (pl.col("_seq") - pl.col("_seq").shift().over(same)).alias("_gap"),
    )
    twins = previous.filter(pl.col("_gap") <= reach).select(
        pl.col("event").alias("_second"), "_first", "_gap"
    )
    if twins.height == 0:
        return edges
    into_second = edges.join(
        twins.filter(pl.col("_gap") == 1), left_on="consumer", right_on="_second"
    ).select(pl.col("_first").alias("consumer"), "producer", "input_index")
    # the first twin op reads the value the second one reads, and that value has a twin
    moved = edges.join(into_second, on=["consumer", "producer", "input_index"]).join(
        twins.select(pl.col("_second").alias("producer"), pl.col("_first").alias("_to")),
        on="producer",
    )
    edges = with_moved(edges, moved, "+twin")
    return with_moved(edges, _alternating(edges, nodes, twins), "+twin-alternating")


def _alternating(edges: pl.DataFrame, nodes: pl.DataFrame, twins: pl.DataFrame) -> pl.DataFrame:
    """Edges into the second twin value to give to the first one, which nothing reads.

    `q * cos + rotate_half(q) * sin; k * cos + rotate_half(k) * sin` after `cos, sin =
    cos.unsqueeze(1), sin.unsqueeze(1)`: the four muls all take `sin`, the most recent
    value of the shape, and `cos` is read by no one. A value made and never read is rarer
    than a misread one, so where the first twin value has no reader and 2n ops of one
    name read the second at one argument, they alternate: the 1st, 3rd, ... read the
    first twin. Edges with `_to` (the first twin value)."""
    readers = edges.select("producer").unique()
    unread = twins.join(readers, left_on="_first", right_on="producer", how="anti")
    names = nodes.select(pl.col("event").alias("consumer"), pl.col("name").alias("_cname"), "_seq")
    by = ["producer", "_cname", "input_index"]
    return (
        edges.join(unread.select("_first", "_second"), left_on="producer", right_on="_second")
        .join(names, on="consumer")
        .sort("_seq")
        .with_columns(pl.int_range(pl.len()).over(by).alias("_nth"), pl.len().over(by).alias("_of"))
        .filter((pl.col("_of") % 2 == 0) & (pl.col("_nth") % 2 == 0))
        .select(*edges.columns, pl.col("_first").alias("_to"))
    )
