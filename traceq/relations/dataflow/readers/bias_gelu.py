"""Megatron's written-out bias-GELU: `x * 0.5 * (1.0 + tanh(0.79788456 * x * (1 + 0.044715 *
x * x)))`.

Python evaluates it as nine ops: three scalar multiples of `x` (`x * 0.5`, `0.79788456 *
x`, `0.044715 * x`), then `(0.044715 * x) * x`, `+ 1`, the product with `0.79788456 * x`,
`tanh`, `+ 1` and the product with `x * 0.5`. The three multiples have `x`'s shape and
come one after another, so shape and order read them as a chain (`x * 0.5 * 0.79788456 *
0.044715`), and each binary product, whose first operand is the value just made, finds
its second operand replaced and leaves it unread. Where the nine ops run in that order
in one module call, each reads what the expression says.

Reads: the tanh GELU written out as Megatron's `bias_gelu` (`megatron/model/fused_bias_gelu.py`,
an `autograd.Function` run eagerly; on a GPU TorchScript fuses it into one kernel).
Appears in: Megatron-style MLPs (`tp_block`, `tp_train`); corpus entries whose edges it
changes: `tp_block`, `tp_train`. On the ET corpus: +20 right, -8 wrong, -20 missed edges
(`tp_block` 0.932 / 0.872 -> 0.979 / 0.979, `tp_train` 0.829 / 0.723 -> 0.844 / 0.750).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import THREAD

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

FORMULA = (
    ("mul", True),  # 0: x * 0.5
    ("mul", True),  # 1: 0.79788456 * x
    ("mul", True),  # 2: 0.044715 * x
    ("mul", False),  # 3: (2) * x
    ("add", True),  # 4: 1 + (3)
    ("mul", False),  # 5: (1) * (4)
    ("tanh", None),  # 6: tanh(5)
    ("add", True),  # 7: 1 + (6)
    ("mul", False),  # 8: (0) * (7)
)
"""The expression's ops in evaluation order: name, and whether its second operand is a
Python scalar (None: one operand)."""
READS = (
    (1, 0, "x"),
    (2, 0, "x"),
    (3, 0, 2),
    (3, 1, "x"),
    (5, 0, 1),
    (5, 1, 4),
    (8, 0, 0),
    (8, 1, 7),
)
"""(op, input index, what it reads: `x` or an earlier op of `FORMULA`) where shape and
order read otherwise."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`bias_gelu_reads` as a reader (`readers.READERS`)."""
    return bias_gelu_reads(edges, flow.nodes)


def bias_gelu_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` with each written-out bias-GELU's products reading `x` and its multiples
    (see the module's docstring)."""
    if edges.height == 0:
        return edges
    second = pl.col("data_inputs").list.get(1, null_on_oob=True).struct.field("shape")
    ordered = nodes.sort("_seq").select(
        *THREAD,
        "event",
        "_call",
        "_out_shape",
        shapes.base_name().alias("_op"),
        pl.when(pl.col("data_inputs").list.len() < 2)
        .then(None)
        .otherwise(second.list.len() == 0)
        .alias("_scalar"),
    )
    ahead = [
        pl.col(c).shift(-k).over(THREAD).alias(f"{c}{k}")
        for k in range(len(FORMULA))
        for c in ("event", "_call", "_out_shape", "_op", "_scalar")
    ]
    windows = ordered.with_columns(ahead)
    match = pl.lit(True)
    for k, (op, scalar) in enumerate(FORMULA):
        match = (
            match
            & (pl.col(f"_op{k}") == op)
            & (pl.col(f"_call{k}") == pl.col("_call0"))
            & (pl.col(f"_out_shape{k}") == pl.col("_out_shape0"))
        )
        match = match & (
            pl.col(f"_scalar{k}").is_null() if scalar is None else pl.col(f"_scalar{k}") == scalar
        )
    found = windows.filter(match.fill_null(False))
    if found.height == 0:
        return edges
    x = edges.filter(pl.col("input_index") == 0).select(
        pl.col("consumer").alias("event0"), pl.col("producer").alias("_x"), "shape"
    )
    found = found.join(x.unique("event0"), on="event0")
    targets = pl.concat(
        [
            found.select(
                pl.col(f"event{op}").alias("consumer"),
                pl.lit(index, pl.Int64).alias("input_index"),
                (pl.col("_x") if source == "x" else pl.col(f"event{source}")).alias("producer"),
                "shape",
            )
            for op, index, source in READS
        ]
    ).with_columns(pl.lit(0.75).alias("confidence"), pl.lit("shape+bias-gelu").alias("evidence"))
    key = ["consumer", "input_index"]
    kept = edges.join(targets.select(key), on=key, how="anti")
    return pl.concat([kept, targets.select(edges.columns)], how="vertical_relaxed")
