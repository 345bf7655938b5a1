"""The engine's input-buffer adds after a product-rule node each accumulate a different gradient.

A product's backward returns one gradient per input (`backward_reads.ONE_OP_FORMULAS`:
`MulBackward0`'s `grad * other` and `grad * self`). The engine then adds each into the
input buffer of the node it flows to: the `aten::add`s directly under
`autograd::engine::evaluate_function: MulBackward0`, one buffer per gradient. Shape and
order read the second add as consuming the first (on HTA's `trace_diff` GPU traces, the
tail of a pointwise chain through both of `MulBackward0`'s products), so one such `add`
reads no other.
"""

from __future__ import annotations

import polars as pl

from traceq.relations import autograd
from traceq.relations.backward_reads import ONE_OP_FORMULAS

EVALUATE = f"{autograd.ENGINE_FRAME} "
"""The engine's frame around a node: the node, then its input-buffer accumulations."""


def input_buffer_reads(
    edges: pl.DataFrame, nodes: pl.DataFrame, all_ops: pl.DataFrame
) -> pl.DataFrame:
    """`edges` without those between two input-buffer `add`s after one product-rule node."""
    frames = all_ops.filter(
        pl.col("name").str.starts_with(EVALUATE)
        & pl.col("name").str.strip_prefix(EVALUATE).is_in(ONE_OP_FORMULAS)
    ).select(pl.col("event").cast(pl.Int64).alias("parent"))
    if edges.height == 0 or frames.height == 0:
        return edges
    adds = (
        nodes.filter(pl.col("name") == "aten::add")
        .join(frames, on="parent")
        .select("event", "parent")
    )
    between = (
        edges.join(adds.rename({"event": "producer", "parent": "_frame"}), on="producer")
        .join(adds.rename({"event": "consumer"}), on="consumer")
        .filter(pl.col("_frame") == pl.col("parent"))
    )
    key = ["producer", "consumer", "input_index"]
    return edges.join(between.select(key), on=key, how="anti", nulls_equal=True)
