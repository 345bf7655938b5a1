"""The gradients one autograd node returns are separate values: none reads another.

A product's backward (`derivatives.yaml`) returns one gradient per input, each its own
expression of the incoming gradient and a saved input: `MulBackward0` runs
`grad * other` and `grad * self`, `AddmmBackward0` runs `grad.mm(mat2.t())` and
`mat1.t().mm(grad)`. The two products have one shape, run back to back on one thread,
and shape and order read the second as consuming the first (against the ET corpus:
`AddmmBackward0`'s `mm -> mm`, 1 of 1 wrong; on HTA's `trace_diff` GPU traces, every
`MulBackward0` became the head of a pointwise chain). So inside such a node a product reads no
product made there (what it reads there is a view, `t`, of a saved input); a view may
read one (`mm_mat2_backward` returns `grad.t().mm(mat1).t()`).

The engine then adds each returned gradient into the input buffer of the node it flows
to (the `add`s directly under `autograd::engine::evaluate_function: MulBackward0`): one
buffer per gradient, so one such `add` does not read another either.
"""

from __future__ import annotations

import polars as pl

from traceq.relations import opshapes

PRODUCT_RULE = frozenset(
    {"MulBackward0", "MmBackward0", "BmmBackward0", "AddmmBackward0", "BaddbmmBackward0"}
    | {"AddbmmBackward0", "MvBackward0", "AddmvBackward0"}
)
"""Autograd nodes whose gradients are one product per input (`derivatives.yaml`)."""

EVALUATE = "autograd::engine::evaluate_function: "
"""The engine's frame around a node: the node, then its input-buffer accumulations."""


def gradient_reads(edges: pl.DataFrame, nodes: pl.DataFrame, all_ops: pl.DataFrame) -> pl.DataFrame:
    """`edges` without those between two gradients of one product-rule node, or between
    two of the input-buffer `add`s that follow it."""
    if edges.height == 0:
        return edges
    node = pl.col("name").str.strip_prefix(EVALUATE)
    frames = all_ops.filter(node.is_in(PRODUCT_RULE)).select(
        pl.col("event").cast(pl.Int64).alias("parent"),
        pl.col("name").str.starts_with(EVALUATE).alias("_buffers"),
    )
    if frames.height == 0:
        return edges
    inside = nodes.join(frames, on="parent").select(
        "event",
        "parent",
        "_buffers",
        (pl.col("kind") == opshapes.VIEW).alias("_view"),
        (pl.col("name") == "aten::add").alias("_add"),
    )
    producer = inside.select(
        pl.col("event").alias("producer"),
        pl.col("parent").alias("_node"),
        "_view",
        pl.col("_add").alias("_padd"),
    )
    consumer = inside.select(
        pl.col("event").alias("consumer"),
        "parent",
        "_buffers",
        "_add",
        pl.col("_view").alias("_cview"),
    )
    both = edges.join(producer, on="producer").join(consumer, on="consumer")
    between = both.filter(
        (pl.col("_node") == pl.col("parent"))
        & pl.when("_buffers")
        .then(pl.col("_padd") & pl.col("_add"))
        .otherwise(~pl.col("_view") & ~pl.col("_cview"))
    )
    key = ["producer", "consumer", "input_index"]
    return edges.join(between.select(key), on=key, how="anti", nulls_equal=True)
