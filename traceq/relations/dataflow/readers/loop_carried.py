"""Values a loop carries from one iteration to the next: `x = cat([x, new])`.

A decoding loop (`generate`) grows its state by concatenation, once per step: the KV
cache of each attention layer (`keys = cat([keys, k])`, `values = cat([values, v])`),
`input_ids = cat([input_ids, next_tokens[:, None]])`, the position ids, the attention
mask. The piece `x` is what the same code concatenated one iteration before: made in
another forward call, or a whole forward pass earlier, it lies far outside the reach of
shape and order (`matching` gives a list's pieces no producer more than a few ops back,
and no value crosses forward calls), so each cache read was missed (the ET corpus: 88
edges, none inferred).

The trace records what ties the two together: the list op of the earlier iteration ran
in the same module (the same attention layer's path; the host-side code outside any
module for `generate`'s own tensors) and returned exactly the piece's shape, one step
shorter than the new result. Iterations run the same code in the same order, so where n
list ops of one name and module returned shape S and then n list ops there read a piece
of shape S into a longer result, the i-th read the i-th (keys before values, positions
before tokens: the order the code concatenates them in). Where the counts differ, or a
reader ran before the last of them, nothing is read: unknown beats wrong.

The new piece is often made from the carried value itself, `cat([x, x[:, -1:] + 1])`
(position ids, a token-type or cache position), and the slice, like the pieces, reads
a value of the previous iteration: the most recent one of its shape is another carried
value (`input_ids`, concatenated after the positions), so shape and order read that
(the ET corpus: 6 wrong edges). Once the piece is known, so is the slice: `tail_reads`.

Reads: values a loop carries: `cat([past, new])` reads the list op of the previous
iteration. Appears in: `generate` (each layer's KV cache past, `input_ids`, position ids:
GPT-2, LLaMA); corpus entries whose edges it changes: `gpt2_generate`, `llama_generate`. On
the ET corpus: +42 right, -6 wrong, -42 missed edges (without it: precision 0.994, recall
0.954; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.matching import CONFIDENCE, THREAD, shape_key, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

EVIDENCE = "shape+loop-carried"


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`loop_carried_reads` as a reader (`readers.READERS`)."""
    return loop_carried_reads(edges, flow.nodes)


def loop_carried_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` plus, for each list op reading a piece the same code concatenated one
    iteration before (module docstring), an edge from that earlier list op."""
    context = [*THREAD, "name", "_module"]
    lists = nodes.filter(pl.col("input_types").list.contains("TensorList")).select(
        "event", "_seq", *context, "_out_shape", "data_inputs"
    )
    if lists.height == 0:
        return edges
    made = lists.select(
        pl.col("event").alias("producer"), pl.col("_seq").alias("_pseq"), *context, "_out_shape"
    )
    pieces = (
        lists.explode("data_inputs")
        .unnest("data_inputs")
        .drop_nulls("shape")
        .with_columns(shape_key(pl.col("shape")).alias("_piece"))
        # a longer result: not the first update of an empty cache (`cat([[], k])`)
        .filter(pl.col("_piece") != pl.col("_out_shape"))
        .select(pl.col("event").alias("consumer"), "_seq", *context, "index", "shape", "_piece")
    )
    read = edges.select("consumer", shape_key(pl.col("shape")).alias("_piece"))
    pieces = pieces.join(read, on=["consumer", "_piece"], how="anti")
    family = [*context, "_piece"]
    readers = pieces.sort("_seq").with_columns(pl.int_range(pl.len()).over(family).alias("_i"))
    first_read = readers.group_by(family).agg(pl.len().alias("_n"), pl.col("_seq").min())
    # the n most recent list ops of the piece's shape before the first reader: one
    # iteration's updates (a rotary `cat` of k's shape ran before them, not after)
    makers = (
        made.rename({"_out_shape": "_piece"})
        .join(first_read, on=family)
        .filter(pl.col("_pseq") < pl.col("_seq"))
        .sort("_pseq", descending=True)
        .filter(pl.int_range(pl.len()).over(family) < pl.col("_n"))
        .sort("_pseq")
        .with_columns(pl.int_range(pl.len()).over(family).alias("_i"))
    )
    sizes = (
        makers.group_by(family)
        .agg(pl.len().alias("_made"), pl.col("_n").first())
        .filter(pl.col("_made") == pl.col("_n"))
        .select(family)
    )
    added = (
        readers.join(sizes, on=family)
        .join(makers.select(*family, "_i", "producer"), on=[*family, "_i"])
        .select(
            "producer",
            "consumer",
            pl.col("index").alias("input_index"),
            "shape",
            pl.lit(CONFIDENCE["same-module"]).alias("confidence"),
            pl.lit(EVIDENCE).alias("evidence"),
        )
    )
    if added.height == 0:
        return edges
    edges = pl.concat([edges, added.select(edges.columns)], how="vertical_relaxed")
    return tail_reads(edges, nodes, added)


TAILS = ("aten::slice", "aten::select", "aten::narrow")
"""Ops that take the end of a carried value to make its next piece (`x[:, -1:]`)."""
MAX_HOPS = 4
"""Edges walked back from a new piece to the slice it was made from (`+ 1`, a cast)."""


def tail_reads(edges: pl.DataFrame, nodes: pl.DataFrame, carried: pl.DataFrame) -> pl.DataFrame:
    """`edges` with each slice that a list op's new piece was made from, within a few
    edges, reading the list op's `carried` piece (module docstring), where the slice ran
    after that piece was made and reads a value of its shape."""
    info = nodes.select("event", "_seq", "name", "data_inputs")
    lists = carried.select(
        pl.col("consumer").alias("_list"),
        pl.col("producer").alias("_to"),
        shape_key(pl.col("shape")).alias("_piece"),
    ).join(info.select(pl.col("event").alias("_to"), pl.col("_seq").alias("_pseq")), on="_to")
    back = edges.select(pl.col("consumer").alias("_at"), pl.col("producer").alias("_from"))
    frontier = (
        edges.join(lists, left_on="consumer", right_on="_list")
        .filter(pl.col("producer") != pl.col("_to"))
        .select(pl.col("producer").alias("_at"), "_to", "_piece", "_pseq")
    )
    reached = [frontier]
    for _ in range(MAX_HOPS - 1):
        frontier = frontier.join(back, on="_at").select(
            pl.col("_from").alias("_at"), "_to", "_piece", "_pseq"
        )
        reached.append(frontier)
    tails = (
        pl.concat(reached)
        .unique()
        .join(info.rename({"event": "_at"}), on="_at")
        .filter(
            pl.col("name").is_in(TAILS)
            & (pl.col("_seq") > pl.col("_pseq"))
            & (
                shape_key(pl.col("data_inputs").list.first().struct.field("shape"))
                == pl.col("_piece")
            )
        )
        .filter(pl.col("_to").n_unique().over("_at") == 1)
        .select(pl.col("_at").alias("consumer"), "_to")
        .unique()
    )
    moved = (
        edges.filter(pl.col("input_index") == 0)
        .join(tails, on="consumer")
        .filter(pl.col("producer") != pl.col("_to"))
    )
    return with_moved(edges, moved, "+carried-tail")
