"""The engine's input-buffer adds after a product-rule node each accumulate a different gradient.

A product's backward returns one gradient per input (`backward_reads.ONE_OP_FORMULAS`:
`MulBackward0`'s `grad * other` and `grad * self`). The engine then adds each into the
input buffer of the node it flows to: the `aten::add`s directly under
`autograd::engine::evaluate_function: MulBackward0`, one buffer per gradient. Shape and
order read the second add as consuming the first (on HTA's `trace_diff` GPU traces, the
tail of a pointwise chain through both of `MulBackward0`'s products), so one such `add`
reads no other.

Reads: the engine's input-buffer `add`s after a product-rule node, each a gradient of its
own. Appears in: training steps through `MulBackward0` (HTA's `trace_diff` GPU traces; none
in the corpus); corpus entries whose edges it changes: none. On the ET corpus: +0 right, +0
wrong, +0 missed edges (without it: precision 0.996, recall 0.962;
`benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations import autograd
from traceq.relations.dataflow.readers.backward_reads import ONE_OP_FORMULAS

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`input_buffer_reads` as a reader (`readers.READERS`)."""
    return input_buffer_reads(edges, flow.nodes, flow.all_ops)


def input_buffer_reads(
    edges: pl.DataFrame, nodes: pl.DataFrame, all_ops: pl.DataFrame
) -> pl.DataFrame:
    """`edges` without those between two input-buffer `add`s after one product-rule node."""
    frames = all_ops.filter(autograd.framed_node().is_in(ONE_OP_FORMULAS)).select(
        pl.col("event").cast(pl.Int64).alias("parent")
    )
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
