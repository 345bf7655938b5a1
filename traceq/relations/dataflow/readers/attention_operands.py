"""Written-out attention's key and value: `scores = q @ k.transpose(-1, -2)`, then
`softmax(scores) @ v` (`attention_operand_reads`).

q, k and v are made one after the other and have one shape, so by shape and order the
`transpose` of the key takes the most recent of the three, `v`, and the second product
reads whatever is left (`q`, or the query's rotary sum). The code always makes the key
before the value: where a product `matmul(a, transpose(x))` is followed in its module
call by a product of the scores with a value of `x`'s shape, the transpose reads the
older and the second product the newer of the last two values of that shape made in the
call that nothing else reads (the query, read by the first product, is not one of them).

Reads: written-out attention's key and value (`matmul(q, k.transpose(-1, -2))`, `softmax`,
`matmul(p, v)`; Megatron's `bmm` on `[b * heads, s, d]`). Appears in: transformers' eager
attention (`attn_implementation="eager"`: BERT, ViT, CLIP, LLaMA after `repeat_kv`),
Megatron's `CoreAttention` (`tp_block`, `tp_train`); corpus entries whose edges it
changes: `bert_eager`, `clip_eager`, `gpt2_eager`, `gpt2_train_ce`, `llama_eager`,
`tp_block`, `tp_train`, `vit_eager`. On the ET corpus: +31 right, -31 wrong, -31 missed
edges (without it: precision 0.964, recall 0.924; `benchmarks/dataflow_ablation.py`; the
eager-attention entries 0.951 / 0.933 -> 0.980 / 0.962).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import THREAD, shape_key, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

PRODUCTS = ("matmul", "bmm")
"""Batched products an attention's two steps are written with."""
TRANSPOSES = ("transpose", "t", "permute")
"""Views that turn the key into `k^T`."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`attention_operand_reads` as a reader (`readers.READERS`)."""
    return attention_operand_reads(edges, flow.nodes)


def attention_operand_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` with each written-out attention's `k^T` reading the key and its second
    product reading the value (see the module's docstring)."""
    if edges.height == 0:
        return edges
    base = shapes.base_name()
    info = nodes.select("event", "_seq", *THREAD, "_call", "_out_shape", base.alias("_op"))
    shaped = edges.filter(pl.col("input_index").is_not_null())
    products = info.filter(pl.col("_op").is_in(PRODUCTS) & (pl.col("_call") >= 0))
    # first product: input 1 is a transpose T of a value in the same call
    transposed = (
        shaped.filter(pl.col("input_index") == 1)
        .select(pl.col("producer").alias("_t"), pl.col("consumer").alias("_m1"))
        .join(products.select(pl.col("event").alias("_m1"), *THREAD, "_call", "_seq"), on="_m1")
        .join(
            info.filter(pl.col("_op").is_in(TRANSPOSES)).select(
                pl.col("event").alias("_t"),
                pl.col("_call").alias("_tcall"),
                pl.col("_seq").alias("_tseq"),
            ),
            on="_t",
        )
        .filter(pl.col("_tcall") == pl.col("_call"))
        .drop("_tcall")
    )
    key_read = shaped.filter(pl.col("input_index") == 0).select(
        pl.col("consumer").alias("_t"),
        pl.col("producer").alias("_k"),
        shape_key(pl.col("shape")).alias("_kv_shape"),
    )
    query = shaped.filter(pl.col("input_index") == 0).select(
        pl.col("consumer").alias("_m1"), pl.col("producer").alias("_q")
    )
    # second product: the next product in the call, reading a value of the key's shape
    second = products.select(
        pl.col("event").alias("_m2"), *THREAD, "_call", pl.col("_seq").alias("_m2seq")
    )
    attention = (
        transposed.join(key_read, on="_t")
        .join(query, on="_m1", how="left")
        .join(second, on=[*THREAD, "_call"])
        .filter(pl.col("_m2seq") > pl.col("_seq"))
        .sort("_m2seq")
        .unique(["_m1"], keep="first")
    )
    value_read = shaped.filter(pl.col("input_index") == 1).select(
        pl.col("consumer").alias("_m2"),
        pl.col("producer").alias("_v"),
        shape_key(pl.col("shape")).alias("_v_shape"),
    )
    attention = attention.join(value_read, on="_m2").filter(
        pl.col("_v_shape") == pl.col("_kv_shape")
    )
    if attention.height == 0:
        return edges
    # candidates: values of the key's shape made in the call before T, read by nobody but
    # T and the second product
    readers = edges.select("producer", "consumer").unique()
    made = info.select(
        pl.col("event").alias("_cand"),
        *THREAD,
        "_call",
        pl.col("_seq").alias("_cseq"),
        pl.col("_out_shape").alias("_kv_shape"),
    )
    candidates = attention.join(made, on=[*THREAD, "_call", "_kv_shape"]).filter(
        (pl.col("_cseq") < pl.col("_tseq")) & (pl.col("_cand") != pl.col("_q").fill_null(-1))
    )
    read_elsewhere = (
        candidates.select("_m1", "_t", "_m2", "_cand")
        .join(readers.rename({"producer": "_cand"}), on="_cand")
        .filter((pl.col("consumer") != pl.col("_t")) & (pl.col("consumer") != pl.col("_m2")))
        .select("_m1", "_cand")
        .unique()
    )
    last_two = (
        candidates.join(read_elsewhere, on=["_m1", "_cand"], how="anti")
        .sort("_cseq", descending=True)
        .group_by("_m1", maintain_order=True)
        .head(2)
        .group_by("_m1")
        .agg(
            pl.len().alias("_n"),
            pl.col("_cand").sort_by("_cseq").first().alias("_key"),
            pl.col("_cand").sort_by("_cseq").last().alias("_value"),
        )
        .filter(pl.col("_n") == 2)
    )
    plan = attention.join(last_two, on="_m1")
    targets = pl.concat(
        [
            plan.select(
                pl.col("_t").alias("consumer"),
                pl.lit(0, pl.Int64).alias("input_index"),
                pl.col("_key").alias("_to"),
            ),
            plan.select(
                pl.col("_m2").alias("consumer"),
                pl.lit(1, pl.Int64).alias("input_index"),
                pl.col("_value").alias("_to"),
            ),
        ]
    )
    moved = edges.join(targets, on=["consumer", "input_index"]).filter(
        pl.col("producer") != pl.col("_to")
    )
    return with_moved(edges, moved, "+attention-operands")
