"""Rotary embeddings of `q` and `k` of one shape: the second expression reads `k`.

`apply_rotary_pos_emb` computes `q * cos + rotate_half(q) * sin`, then the same for `k`.
Where `q` and `k` have different shapes (fewer KV heads than heads) shape matching reads
both right. Where they share one (as many KV heads as heads: Qwen1.5-0.5B, LLaMA-7B), the
most recent value of the shape when `k * cos` runs is `q_embed`, so `k * cos` reads
`(q * cos + ...) * cos`, a product no rotary embedding computes, and `rotate_half(k)`'s
slices read `q_embed * cos` or `q`. Against LLaMA and Qwen2 recorded with as many KV
heads as heads, each entry's 10 wrong edges were these, and TQ104's rotary chains wrong.

- `x * cos` reading a sum of `x' * cos` (the same `cos` value, read by an earlier mul the
  sum read) reads the oldest value of the sum's shape in the call that nothing reads and
  that was made before that earlier mul (`k`, made after `q` and before `v`);
- `rotate_half(x)`'s slices (read by the `cat` the `* sin` mul reads, directly or through a
  `neg`) read the `x` of the `x * cos` the expression's sum adds.

Reads: rotary embeddings of `q` and `k` of one shape (as many KV heads as heads). Appears
in: multi-head-attention LLaMA (`llama_mha`); corpus entries whose edges it changes:
`llama_mha`. On the ET corpus: +10 right, -10 wrong, -10 missed edges (without it:
precision 0.994, recall 0.960; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import THREAD, shape_key, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`rotary_reads` as a reader (`readers.READERS`)."""
    return rotary_reads(edges, flow.nodes)


def rotary_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` with the second rotary expression's `x * cos` and every expression's
    `rotate_half` slices pointed at their `x` (module docstring)."""
    if edges.height == 0:
        return edges
    edges = with_moved(edges, _second_x(edges, nodes), "+rotary-second")
    return with_moved(edges, _rotate_half_x(edges, nodes), "+rotary-rotate-half")


def _named(nodes: pl.DataFrame) -> pl.DataFrame:
    return nodes.select(
        "event", "_seq", *THREAD, "_call", "_out_shape", shapes.base_name().alias("_b")
    )


def _second_x(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    named = _named(nodes)
    kind = named.select("event", "_b")
    e = edges.join(kind.rename({"event": "producer", "_b": "_pb"}), on="producer").join(
        kind.rename({"event": "consumer", "_b": "_cb"}), on="consumer"
    )
    into_mul = e.filter(pl.col("_cb") == "mul")
    # M2 reads a sum A and a value C; an earlier mul M1 reads C too and A reads M1
    sums = into_mul.filter(pl.col("_pb") == "add")
    others = into_mul.select(pl.col("consumer").alias("_m2"), pl.col("producer").alias("_c"))
    m1 = into_mul.select(pl.col("consumer").alias("_m1"), pl.col("producer").alias("_c"))
    a_reads = e.filter(pl.col("_cb") == "add").select(
        pl.col("consumer").alias("producer"), pl.col("producer").alias("_m1")
    )
    found = (
        sums.join(others, left_on="consumer", right_on="_m2")
        .filter(pl.col("_c") != pl.col("producer"))
        .join(a_reads, on="producer")
        .join(m1, on=["_m1", "_c"])
        .filter(pl.col("_m1") != pl.col("consumer"))
        .unique(["producer", "consumer", "input_index"])
    )
    if found.height == 0:
        return found
    read = edges.select(pl.col("producer").alias("event")).unique()
    unread = named.join(read, on="event", how="anti").select(
        pl.col("event").alias("_to"), pl.col("_seq").alias("_xseq"), *THREAD, "_call", "_out_shape"
    )
    info = named.select(
        pl.col("event").alias("_m1"), pl.col("_seq").alias("_m1seq"), *THREAD, "_call"
    )
    sum_shape = named.select(pl.col("event").alias("producer"), "_out_shape")
    picked = (
        found.join(info, on="_m1")
        .join(sum_shape, on="producer")
        .join(unread, on=[*THREAD, "_call", "_out_shape"])
        .filter(pl.col("_xseq") < pl.col("_m1seq"))
        .sort("_xseq")
        .unique(["producer", "consumer", "input_index"], keep="first")
    )
    return picked.select(*edges.columns, "_to")


def _rotate_half_x(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    named = _named(nodes)
    kind = named.select("event", "_b", "_out_shape")
    e = edges.join(
        kind.rename({"event": "producer", "_b": "_pb", "_out_shape": "_pshape"}), on="producer"
    ).join(kind.rename({"event": "consumer", "_b": "_cb", "_out_shape": "_cshape"}), on="consumer")
    # A sum of two muls: `x * cos` (reads x of its own shape) and `cat(...) * sin`
    into_add = e.filter((pl.col("_cb") == "add") & (pl.col("_pb") == "mul")).select(
        pl.col("consumer").alias("_sum"), pl.col("producer").alias("_mul")
    )
    x_of = e.filter(
        (pl.col("_cb") == "mul") & (shape_key(pl.col("shape")) == pl.col("_cshape"))
    ).select(pl.col("consumer").alias("_mul"), pl.col("producer").alias("_x"), "_pb")
    cat_of = e.filter((pl.col("_cb") == "mul") & (pl.col("_pb") == "cat")).select(
        pl.col("consumer").alias("_mul"), pl.col("producer").alias("_cat")
    )
    x_side = into_add.join(x_of.filter(pl.col("_pb") != "cat"), on="_mul").select("_sum", "_x")
    cat_side = into_add.join(cat_of, on="_mul").select("_sum", "_cat")
    rotated = x_side.join(cat_side, on="_sum").unique(["_cat"], keep="first")
    into_cat = e.filter(pl.col("_cb") == "cat").select(
        pl.col("producer").alias("_piece"), pl.col("consumer").alias("_cat"), "_pb"
    )
    negs = into_cat.filter(pl.col("_pb") == "neg").select("_piece", "_cat")
    direct = into_cat.filter(pl.col("_pb") == "slice").select(
        pl.col("_piece").alias("consumer"), "_cat"
    )
    through_neg = (
        e.filter((pl.col("_cb") == "neg") & (pl.col("_pb") == "slice"))
        .select(pl.col("producer").alias("consumer"), pl.col("consumer").alias("_piece"))
        .join(negs, on="_piece")
        .select("consumer", "_cat")
    )
    slices = pl.concat([direct, through_neg]).join(rotated, on="_cat")
    moved = (
        edges.join(slices, on="consumer")
        .filter(pl.col("producer") != pl.col("_x"))
        .join(
            named.select(pl.col("event").alias("_x"), pl.col("_out_shape").alias("_xshape")),
            on="_x",
        )
        .filter(shape_key(pl.col("shape")) == pl.col("_xshape"))
        .rename({"_x": "_to"})
        .unique(["producer", "consumer", "input_index"])
    )
    return moved.select(*edges.columns, "_to")
