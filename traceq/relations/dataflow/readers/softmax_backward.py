"""A softmax's backward reads the gradient first, then the output its forward saved.

`_softmax_backward_data(grad_output, output, dim, input_dtype)` and
`_log_softmax_backward_data(...)` (`derivatives.yaml`) take the gradient in slot 0 and the
forward's result in slot 1. Shape and order give slot 1 the most recent value of the shape,
which in a backward pass is the gradient just made, and slot 0 an older one: the logits'
GEMM under a cross-entropy, another layer's backward value under a custom attention
`Function`. So slot 0 reads the newer of the two, and slot 1 keeps the older only when a
softmax made it (the forward output it saved); another op's value is no saved output.

Reads: `_softmax_backward_data`, `_log_softmax_backward_data`. Appears in: every training
step through a softmax or a cross-entropy; corpus entries whose edges it changes:
`cnn_train` (the loss), `tp_train` (Megatron's scale-mask-softmax `Function`). On the ET
corpus: +0 right, -2 wrong, -0 missed (the right reads were there, in the wrong slots):
training steps 0.953 / 0.930 -> 0.955 / 0.930, and TQ106 on `tp_train` finds the backward
attention group of both layers as the ET run does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

BACKWARD = ("_softmax_backward_data", "_log_softmax_backward_data")
SOFTMAX = r"(?i)softmax"
"""The forward ops whose output a softmax backward saves (`softmax`, `_log_softmax`, ...)."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`edges` with each softmax backward's two tensor reads in their slots (module docstring)."""
    ops = flow.nodes.filter(shapes.base_name().is_in(BACKWARD)).select("event")
    if ops.height == 0 or edges.height == 0:
        return edges
    seq = flow.nodes.select(pl.col("event").alias("producer"), pl.col("_seq").alias("_pseq"))
    names = flow.nodes.select(pl.col("event").alias("producer"), pl.col("name").alias("_pname"))
    both = (
        edges.filter(pl.col("input_index").is_in([0, 1]))
        .join(ops, left_on="consumer", right_on="event", how="semi")
        .join(seq, on="producer")
        .join(names, on="producer")
        .with_columns(pl.len().over("consumer").alias("_reads"))
        .filter(pl.col("_reads") == 2)
    )
    if both.height == 0:
        return edges
    ranked = both.with_columns(
        pl.col("_pseq").rank("ordinal", descending=True).over("consumer").sub(1).alias("_slot")
    )
    moved = ranked.filter((pl.col("_slot") == 0) | pl.col("_pname").str.contains(SOFTMAX))
    key = ["producer", "consumer", "input_index"]
    kept = edges.join(both.select(key), on=key, how="anti", nulls_equal=True)
    moved = moved.with_columns(
        pl.col("_slot").cast(pl.Int64).alias("input_index"),
        pl.concat_str("evidence", pl.lit("+softmax-backward")).alias("evidence"),
    )
    return pl.concat([kept, moved.select(edges.columns)], how="vertical_relaxed")
