"""Megatron's bias-GELU backward: `bias_gelu_back(g, bias, y)`, written out, read as written.

The `autograd.Function` of `bias_gelu` (`readers.bias_gelu`) saves `y` and `bias`; its
backward recomputes `x = bias + y` and the tanh, then the derivative:

    x = bias + y
    tanh_out = tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x))
         + 0.5 * (1 + tanh_out)
    return ff * g

Nineteen ops of one shape, run one after another in the node: shape and order read
each as the one before it (a chain), where the expression reads `x`, `tanh_out` and the
scalar multiples of `x` many times; and `x = bias + y` reads the gradient, the most
recent value of `y`'s shape, where the ET has the saved `y`: what the forward's `bias + y`
read (the Function's forward range and the backward node carry one sequence number).
Where the nineteen ops run in that order under one node, each reads what the
expression says; `g` is the value shape and order gave `bias + y` (the most recent of
`y`'s shape when the node starts: the incoming gradient).

Reads: the backward of Megatron's bias-GELU (`megatron/model/fused_bias_gelu.py`,
`bias_gelu_back`), run eagerly. Appears in: Megatron-style MLPs trained (`tp_train`);
corpus entries whose edges it changes: `tp_train`. On the ET corpus: +26 right, -12 wrong,
-26 missed edges (without it: precision 0.984, recall 0.952; `tp_train` 0.891 / 0.851 ->
0.928 / 0.920, the training steps 0.908 / 0.869 without it, 0.926 / 0.903 with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import THREAD

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

FORMULA = (
    ("add", False),  # 0: x = bias + y
    ("mul", True),  # 1: 0.79788456 * x
    ("mul", True),  # 2: 0.044715 * x
    ("mul", False),  # 3: (2) * x
    ("add", True),  # 4: 1 + (3)
    ("mul", False),  # 5: (1) * (4)
    ("tanh", None),  # 6: tanh_out
    ("mul", True),  # 7: 0.5 * x
    ("mul", False),  # 8: tanh_out * tanh_out
    ("rsub", None),  # 9: 1 - (8) (its scalar is not recorded as data)
    ("mul", True),  # 10: 0.1070322243 * x
    ("mul", False),  # 11: (10) * x
    ("add", True),  # 12: 0.79788456 + (11)
    ("mul", False),  # 13: (9) * (12)
    ("mul", False),  # 14: (7) * (13)
    ("add", True),  # 15: 1 + tanh_out
    ("mul", True),  # 16: 0.5 * (15)
    ("add", False),  # 17: ff
    ("mul", False),  # 18: ff * g
)
"""The expression's ops in evaluation order: name, and whether its second operand is a
Python scalar (None: one operand)."""
READS = (
    (0, 1, "y"),
    *((k, 0, 0) for k in (1, 2, 7, 10)),
    (3, 0, 2),
    (3, 1, 0),
    (4, 0, 3),
    (5, 0, 1),
    (5, 1, 4),
    (6, 0, 5),
    (8, 0, 6),
    (8, 1, 6),
    (9, 0, 8),
    (11, 0, 10),
    (11, 1, 0),
    (12, 0, 11),
    (13, 0, 9),
    (13, 1, 12),
    (14, 0, 7),
    (14, 1, 13),
    (15, 0, 6),
    (16, 0, 15),
    (17, 0, 14),
    (17, 1, 16),
    (18, 0, 17),
    (18, 1, "g"),
)
"""(op, input index, what it reads: `y`, `g` or an earlier op of `FORMULA`)."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`bias_gelu_backward_reads` as a reader (`readers.READERS`)."""
    return bias_gelu_backward_reads(edges, flow.nodes, flow.all_ops)


def bias_gelu_backward_reads(
    edges: pl.DataFrame, nodes: pl.DataFrame, all_ops: pl.DataFrame
) -> pl.DataFrame:
    """`edges` with each written-out bias-GELU backward reading as its expression says
    (see the module's docstring)."""
    if edges.height == 0:
        return edges
    data = pl.col("data_inputs")
    second = data.list.get(1, null_on_oob=True).struct.field("shape")
    ordered = nodes.sort("_seq").select(
        *THREAD,
        "event",
        "_tree",
        "_out_shape",
        shapes.base_name().alias("_op"),
        pl.when(data.list.len() < 2).then(None).otherwise(second.list.len() == 0).alias("_scalar"),
    )
    columns = ("event", "_tree", "_out_shape", "_op", "_scalar")
    windows = ordered.with_columns(
        pl.col(c).shift(-k).over(THREAD).alias(f"{c}{k}")
        for k in range(len(FORMULA))
        for c in columns
    )
    match = pl.col("_tree") >= 0
    for k, (op, scalar) in enumerate(FORMULA):
        match = (
            match
            & (pl.col(f"_op{k}") == op)
            & (pl.col(f"_tree{k}") == pl.col("_tree"))
            & (pl.col(f"_out_shape{k}") == pl.col("_out_shape"))
        )
        match = match & (
            pl.col(f"_scalar{k}").is_null() if scalar is None else pl.col(f"_scalar{k}") == scalar
        )
    found = windows.filter(match.fill_null(False))
    if found.height == 0:
        return edges
    found = found.join(
        _saved_y(edges, nodes, all_ops), left_on="_tree", right_on="_node", how="left"
    )
    # shape and order gave `bias + y` the most recent value of y's shape: the gradient
    given = edges.filter(pl.col("input_index") == 1).select(
        pl.col("consumer").alias("event0"), pl.col("producer").alias("_g")
    )
    found = found.join(given.unique("event0"), on="event0", how="left")
    source = {"y": pl.col("_y"), "g": pl.col("_g")}
    targets = (
        pl.concat(
            [
                found.select(
                    pl.col(f"event{op}").alias("consumer"),
                    pl.lit(index, pl.Int64).alias("input_index"),
                    (source[what] if isinstance(what, str) else pl.col(f"event{what}")).alias(
                        "producer"
                    ),
                )
                for op, index, what in READS
            ]
        )
        .join(nodes.select(pl.col("event").alias("consumer"), "data_inputs"), on="consumer")
        .with_columns(
            pl.col("data_inputs")
            .list.get(pl.col("input_index"), null_on_oob=True)
            .struct.field("shape")
            .alias("shape"),
            pl.lit(0.75).alias("confidence"),
            pl.lit("shape+bias-gelu-backward").alias("evidence"),
        )
    )
    key = ["consumer", "input_index"]
    kept = edges.join(targets.select(key), on=key, how="anti")
    return pl.concat(
        [kept, targets.drop_nulls("producer").select(edges.columns)], how="vertical_relaxed"
    )


def _saved_y(edges: pl.DataFrame, nodes: pl.DataFrame, all_ops: pl.DataFrame) -> pl.DataFrame:
    """`_node`, `_y`: per backward node range, what its Function's forward `bias + y` read
    as `y` (the Function's forward range carries the node's sequence number)."""
    ranges = all_ops.filter(pl.col("sequence_number").is_not_null()).select(
        pl.col("event").cast(pl.Int64), "name", "sequence_number"
    )
    backward = ranges.filter(pl.col("name").str.ends_with("Backward")).select(
        pl.col("event").alias("_node"),
        pl.col("name").str.strip_suffix("Backward").alias("_function"),
        "sequence_number",
    )
    forward = ranges.select(
        pl.col("event").alias("_range"), pl.col("name").alias("_function"), "sequence_number"
    )
    first_add = (
        nodes.filter(shapes.base_name() == "add")
        .sort("_seq")
        .unique("parent", keep="first")
        .select(pl.col("parent").alias("_range"), pl.col("event").alias("_add"))
    )
    y = edges.filter(pl.col("input_index") == 1).select(
        pl.col("consumer").alias("_add"), pl.col("producer").alias("_y")
    )
    return (
        backward.join(forward, on=["_function", "sequence_number"])
        .join(first_add, on="_range")
        .join(y.unique("_add"), on="_add")
        .select("_node", "_y")
    )
