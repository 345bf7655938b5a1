"""A value read both as itself and as a piece of a list the same op reads: the query.

Attention with a KV cache runs `sdpa(q, cat([past_k, k]), cat([past_v, v]))` (LLaMA,
Whisper's and T5's decoders): q, k and v share a shape, and k and v (or k's rotary
embedding) are made after q, so the most recent value of the shape when `sdpa` runs is
`v` or `k`, which a `cat` has just read. Shape matching gives it to the query, and the
trace reads as `sdpa(v, cat([past_k, k]), cat([past_v, v]))`: one tensor read twice, once
through the cache. A value a list op took in is seldom read again by an op reading that
list op's result, so such an input reads instead the most recent value of its shape made
in the op's own module call that nothing had read before it and the op reads at no other
argument (q, made before k and v and read by the attention only); where there is none, it
gets no edge (unknown beats wrong).

Reads: attention's query beside a KV cache's list pieces (`sdpa(q, cat([pk, k]), ...)`).
Appears in: cached attention (`llama_mha`, T5's and Whisper's decoders); corpus entries
whose edges it changes: `llama_mha`, `t5`, `whisper`. On the ET corpus: +6 right, -6 wrong,
-6 missed edges (without it: precision 0.994, recall 0.961;
`benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.matching import THREAD, shape_key, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`query_reads` as a reader (`readers.READERS`)."""
    return query_reads(edges, flow.nodes)


def query_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` with each input that reads a piece of a list its consumer also reads moved
    to the unread value of its shape (or dropped: no such value)."""
    if edges.height == 0:
        return edges
    lists = nodes.filter(pl.col("input_types").list.contains("TensorList")).select(
        pl.col("event").alias("_list")
    )
    if lists.height == 0:
        return edges
    pieces = edges.join(lists, left_on="consumer", right_on="_list", how="semi").select(
        pl.col("producer").alias("_piece"), pl.col("consumer").alias("_list")
    )
    lists_read = edges.join(pieces.select("_list").unique(), left_on="producer", right_on="_list")
    reread = lists_read.select("consumer", pl.col("producer").alias("_list")).join(
        pieces, on="_list"
    )
    suspects = edges.filter(pl.col("input_index").is_not_null()).join(
        reread.select("consumer", pl.col("_piece").alias("producer")).unique(),
        on=["consumer", "producer"],
        how="semi",
    )
    if suspects.height == 0:
        return edges
    info = nodes.select("event", "_seq", *THREAD, "_call", "_out_shape")
    first_read = (
        edges.join(info.select(pl.col("event").alias("consumer"), "_seq"), on="consumer")
        .group_by("producer")
        .agg(pl.col("_seq").min().alias("_read_seq"))
    )
    wanted = suspects.join(
        info.rename({"event": "consumer", "_out_shape": "_cshape_out"}), on="consumer"
    ).with_columns(shape_key(pl.col("shape")).alias("_out_shape"))
    unread = info.join(first_read, left_on="event", right_on="producer", how="left").select(
        *THREAD,
        "_call",
        "_out_shape",
        pl.col("event").alias("_to"),
        "_read_seq",
        pl.col("_seq").alias("_pseq"),
    )
    found = (
        wanted.join(unread, on=[*THREAD, "_call", "_out_shape"])
        .filter(
            (pl.col("_pseq") < pl.col("_seq"))
            & (pl.col("_read_seq").is_null() | (pl.col("_read_seq") >= pl.col("_seq")))
            & (pl.col("_call") != -1)
        )
        .join(
            edges.select("consumer", pl.col("producer").alias("_to")),
            on=["consumer", "_to"],
            how="anti",
        )
        .sort("_pseq")
        .unique(["consumer", "input_index"], keep="last")
    )
    slots = ["consumer", "input_index"]
    moved = suspects.join(found.select(*slots, "_to"), on=slots)
    dropped = suspects.join(found.select(slots), on=slots, how="anti")
    key = ["producer", *slots]
    kept = edges.join(dropped.select(key), on=key, how="anti", nulls_equal=True)
    return with_moved(kept, moved, "+list-piece")
