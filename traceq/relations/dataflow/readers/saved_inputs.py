"""A norm's and a product's backward read the gradient first, then what their forward saved.

`native_layer_norm_backward(grad_out, input, ...)` and
`native_batch_norm_backward(grad_out, input, ...)` read the gradient, then the input the
forward norm saved; `MulBackward0`'s formulas are `grad * other` and `grad * self`
(`FunctionsManual.cpp`, `derivatives.yaml`). Shape and order read both slots as values of
the backward: the most recent value of the shape (the gradient) goes to the second slot
and an older one (the previous norm's backward, the residual's other gradient) to the
first, so one edge is wrong and the saved input is missed.

Each such op of a node reads, in slot 0, the node's gradient: the most recent of the
values its ops read there now; and in slot 1 the saved value: for a norm, the forward
op's input 0 (its producer; a graph input has none); for a product whose forward `mul`
ran inside another op (dropout's `input * mask`), that op, which made the mask. The
forward op is the one that carries the node's sequence number.

A plain product's node is left to shape and order (`backward_reads` keeps its two `mul`s
apart): read as written (`MulBackward0::apply` computes `other`'s gradient first, so its
first `mul` reads `self`, the second `other`, both the one gradient), `gpt2_train_ce`'s
written-out GELU gains 3 right edges, but TQ104 then chains the gradient's producer into
both formulas (HTA's `trace_diff/control`: `add -> mul, mul` of a SiLU's backward,
`tests/test_dataflow_backward.py`), a fan-out the rule reads as one chain.

Reads: `native_layer_norm_backward`, `native_batch_norm_backward` and `MulBackward0`'s
`mul`s. Appears in: every training step through LayerNorm, BatchNorm, dropout or a
product of two tensors; corpus entries whose edges it changes: `cnn_train`,
`gpt2_train_ce`, `tp_train`. On the ET corpus: +7 right, -8 wrong, -7 missed edges
(without it: precision 0.988, recall 0.958; `gpt2_train_ce` 0.914 / 0.869 -> 0.933 / 0.880,
`tp_train` 0.960 / 0.952 -> 0.968 / 0.957, `cnn_train` 0.950 / 0.931 -> 0.951 / 0.951; the
training steps 0.942 / 0.919 without it, 0.953 / 0.928 with it). The limit: a norm whose
forward input shape and order read wrong (the residual past a row-parallel linear) gets no
saved input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import CONFIDENCE, edge_rows
from traceq.relations.dataflow.readers.backward_reads import backward_nodes, semantic_roots

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

NODES = {
    "NativeLayerNormBackward0": ("native_layer_norm_backward", ("layer_norm", "native_layer_norm")),
    "NativeBatchNormBackward0": ("native_batch_norm_backward", ("batch_norm", "native_batch_norm")),
    "MulBackward0": ("mul", ("mul",)),
}
"""Each node, the op of its formula read here, and the forward ops that carry its number."""
PRODUCT = "mul"
"""`MulBackward0`'s formula op: `grad * other`, `grad * self`."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`saved_input_reads` as a reader (`readers.READERS`)."""
    return saved_input_reads(edges, flow)


def saved_input_reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`edges` with each formula op of `NODES` reading the gradient in slot 0 and the
    forward's saved value in slot 1 (see the module's docstring)."""
    if edges.height == 0 or "sequence_number" not in flow.all_ops.columns:
        return edges
    in_node = backward_nodes(flow.trace, flow.ops).filter(pl.col("_node_name").is_in(list(NODES)))
    if in_node.height == 0:
        return edges
    wanted = pl.DataFrame(
        [(node, op) for node, (op, _) in NODES.items()],
        schema={"_node_name": pl.String, "_op": pl.String},
        orient="row",
    )
    formula = (
        flow.nodes.select("event", "_seq", shapes.base_name().alias("_op"))
        .join(in_node, on="event")
        .join(wanted, on=["_node_name", "_op"])
        .sort("_seq")
    )
    forward = _forward_ops(flow, formula["_node_seq"].unique())
    if formula.height == 0 or forward.height == 0:
        return edges
    seq = dict(flow.nodes.select("event", "_seq").iter_rows())
    slot = {
        (c, i): p
        for p, c, i in edges.filter(pl.col("input_index").is_in([0, 1]))
        .select("producer", "consumer", "input_index")
        .iter_rows()
    }
    fed = {
        (c, i): p
        for p, c, i in edges.filter(pl.col("input_index").is_not_null())
        .select("producer", "consumer", "input_index")
        .iter_rows()
    }
    forward_of = {s: (f, inside) for s, f, inside in forward.iter_rows()}
    rows = []
    # a few ops per node, a few hundred nodes: read in node order
    for _, ops in formula.group_by("_node", maintain_order=True):
        events, node_seq = ops["event"].to_list(), ops["_node_seq"][0]
        if node_seq not in forward_of:
            continue
        made = {slot.get((e, i)) for e in events for i in (0, 1)} - {None, *events}
        gradient = max(made, key=seq.__getitem__) if made else None
        forward_op, inside = forward_of[node_seq]
        for k, event in enumerate(events):
            if ops["_op"][k] == PRODUCT:
                if not inside:
                    break  # a plain product's two formulas: see the module's docstring
                saved = forward_op
            else:
                saved = fed.get((forward_op, 0))
            rows += [(gradient, event, 0), (saved, event, 1)]
    if not rows:
        return edges
    read = edge_rows(rows)
    key = ["consumer", "input_index"]
    kept = edges.join(read.select(key), on=key, how="anti", nulls_equal=False)
    read = (
        read.drop_nulls("producer")
        .join(flow.nodes.select(pl.col("event").alias("consumer"), "data_inputs"), on="consumer")
        .with_columns(
            pl.col("data_inputs")
            .list.get(pl.col("input_index"), null_on_oob=True)
            .struct.field("shape")
            .alias("shape"),
            pl.lit(CONFIDENCE["fwdbwd"]).alias("confidence"),
            pl.lit("shape+saved-input").alias("evidence"),
        )
    )
    return pl.concat([kept, read.select(edges.columns)], how="vertical_relaxed")


def _forward_ops(flow: Flow, numbers: pl.Series) -> pl.DataFrame:
    """Per sequence number in `numbers`: the semantic op its forward op ran in, and
    whether it ran inside that op (`_inside`) rather than being it."""
    names = {name for _, forward in NODES.values() for name in forward}
    found = (
        flow.all_ops.filter(
            pl.col("sequence_number").is_in(numbers.implode())
            & shapes.base_name().is_in(list(names))
            & pl.col("shapes").is_not_null()
        )
        .sort("ts_ns")
        .unique("sequence_number", keep="first")
        .select(pl.col("event").cast(pl.Int64), "sequence_number")
    )
    name_of = flow.ops.select("event", shapes.base_name().alias("_name"))
    return (
        semantic_roots(found, flow.trace, flow.ops)
        .join(name_of, on="event")
        .select(
            "sequence_number",
            pl.col("event").alias("_forward"),
            ~pl.col("_name").is_in(list(names)).alias("_inside"),
        )
    )
