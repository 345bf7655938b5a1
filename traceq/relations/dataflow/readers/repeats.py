"""One op run twice over, a few ops apart, reads two values: `x[:, -1:].clone(); y[:, -1:].clone()`.

Code that applies the same step to several tensors (`generate` preparing each model
input: `input_ids[:, -1:]`, then `position_ids[:, -1:]`) runs the same op with the same
shapes and arguments once per tensor. Shape and order give both runs the most recent
value of the shape, so both read one value, and computed one result twice: code rarely
does that on purpose (an even split, `x[..., :h], x[..., h:]`, has other arguments). Only
an op of one tensor argument whose other arguments the trace records is known to compute
the same thing twice: two GEMMs of one shape in a backward read one gradient and two
different operands (`grad @ W`, `x.T @ grad`). In `generate` the two values are the
carried `input_ids` and position ids, both grown by a `cat` of one shape, and the second
slice read the `input_ids` (the ET corpus: 6 wrong edges). So where two runs of one op
(name, shapes, recorded arguments), at most `REACH` ops apart in one module call, read
one value, the second reads the value of that shape made before it, if an op of the
same name (another `cat`) made it in the same call with no value of the shape between:
two values of one kind, one per run. Else nothing moves.

The two results are two values too, and where they are a call's arguments (made in the
caller, outside any module call, then handed to a forward: `model(input_ids=...,
position_ids=...)`) shape and order give the call's first reader of their shape the
second, the most recent, and leave the first unread (GPT-2's `view(input_ids)`, LLaMA's
`embed_tokens(input_ids)` read the position ids: 6 wrong edges in the ET corpus). A value
made and never read is rarer than a misread one: the call's first reader of the second
result reads the first, which nothing read (`repeated_results`).

Reads: one op run twice over a few ops apart (`input_ids[:, -1:].clone()`, then
`position_ids[:, -1:].clone()`). Appears in: `generate` preparing its inputs (GPT-2,
LLaMA); corpus entries whose edges it changes: `gpt2_generate`, `llama_generate`. On the ET
corpus: +12 right, -12 wrong, -12 missed edges (without it: precision 0.993, recall 0.960;
`benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.matching import THREAD, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

REACH = 3
"""Most ops between two runs of one op (`slice, clone, slice`)."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`repeated_reads` as a reader (`readers.READERS`)."""
    return repeated_reads(edges, flow.nodes)


def repeated_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` with the second of two runs of one op that read one value reading the
    value of its kind made before that one (module docstring)."""
    if edges.height == 0:
        return edges
    run = [*THREAD, "_call", "name", "_dims", "_args"]
    ordered = (
        nodes.select(
            "event",
            "_seq",
            *THREAD,
            "_call",
            "name",
            pl.col("input_dims").cast(pl.String).alias("_dims"),
            pl.col("concrete_inputs").list.join("\x1f").alias("_args"),
            "data_inputs",
            "concrete_inputs",
        )
        .filter((pl.col("data_inputs").list.len() == 1) & pl.col("concrete_inputs").is_not_null())
        .drop_nulls("_dims")
        # a second tensor argument the trace records no value of (a Linear's weight) makes
        # two runs two computations: without stacks (no module calls) T5's q, k and v
        # `linear`s, three ops apart, read as repeats, and k and v read the RMSNorm's
        # inner `mul` instead of its output (TQ105 lost q)
        .filter(pl.col("_dims").str.count_matches(r"\[\d").fill_null(0) <= 1)
        .sort("_seq")
        .with_columns(
            pl.col("event").shift().over(run).alias("_first"),
            (pl.col("_seq") - pl.col("_seq").shift().over(run)).alias("_gap"),
        )
    )
    repeats = ordered.filter(pl.col("_gap") <= REACH).select(
        pl.col("event").alias("consumer"), "_first"
    )
    first_reads = edges.select(
        pl.col("consumer").alias("_first"), "producer", "input_index"
    ).filter(pl.len().over("_first", "input_index") == 1)
    shared = edges.filter(pl.len().over("consumer", "input_index") == 1).join(
        repeats.join(first_reads, on="_first"), on=["consumer", "producer", "input_index"]
    )
    if shared.height == 0:
        return edges
    kind = [*THREAD, "_call", "_out_shape"]
    made = nodes.select("event", "_seq", *kind, "name").drop_nulls("_out_shape").sort("_seq")
    before = made.with_columns(
        pl.col("event").shift().over(kind).alias("_to"),
        pl.col("name").shift().over(kind).alias("_to_name"),
    ).select(pl.col("event").alias("producer"), "name", "_to", "_to_name")
    moved = (
        shared.join(before, on="producer")
        .filter(pl.col("_to").is_not_null() & (pl.col("_to_name") == pl.col("name")))
        .select(*edges.columns, "_to")
    )
    edges = with_moved(edges, moved, "+repeated-op")
    return repeated_results(edges, nodes, repeats)


def repeated_results(
    edges: pl.DataFrame, nodes: pl.DataFrame, repeats: pl.DataFrame
) -> pl.DataFrame:
    """`edges` with the first reader of the second of two repeated results, in a module call
    of its own (the caller made both outside any), reading the first result where nothing
    reads that (module docstring)."""
    calls = nodes.select("event", "_seq", "_top")
    unread = repeats.join(edges, left_on="_first", right_on="producer", how="anti").join(
        calls.filter(pl.col("_top") == -1), left_on="consumer", right_on="event", how="semi"
    )
    first_reader = (
        edges.join(unread, left_on="producer", right_on="consumer")
        .join(calls.rename({"event": "consumer"}), on="consumer")
        .sort("_seq")
        .unique("producer", keep="first", maintain_order=True)
        .filter(pl.col("_top") != -1)
        .select(*edges.columns, pl.col("_first").alias("_to"))
    )
    return with_moved(edges, first_reader, "+repeated-result")
