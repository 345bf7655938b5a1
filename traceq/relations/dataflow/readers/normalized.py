"""A tensor divided by its own norm: the norm reads the tensor the division does.

`x / x.norm(dim=-1, keepdim=True)` written out (CLIP's `_get_vector_norm`: `pow(x, 2)`,
`sum`, `pow(0.5)`; `F.normalize`: `linalg_vector_norm(x)`, `clamp_min`, `expand_as`) reads
`x` twice: once at the first op of the norm, once at the division. Shape and order match
the two reads apart, and where another value of `x`'s shape waits unread the norm's first
op takes the most recent one: CLIP normalizes its image and text embeddings, two sibling
projections of one shape made one after the other, and each `pow` read the other
embedding (or the image's normalized result) while the division read its own (against the
ET corpus: both `pow`s wrong, both divisions right, after `sibling_projection_reads`). The
division's numerator and the norm's input are one tensor, so the norm's first op reads what
the numerator read.

Reads: a tensor divided by its own norm, written out (`x / x.pow(2).sum().pow(0.5)`).
Appears in: CLIP's image and text embeddings; corpus entries whose edges it changes:
`clip`. On the ET corpus: +2 right, -2 wrong, -2 missed edges (without it: precision 0.995,
recall 0.961; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

DIVISIONS = ("aten::div",)
NORM_STARTS = ("aten::pow", "aten::square", "aten::abs", "aten::linalg_vector_norm", "aten::norm")
"""The first op of a norm of `x`: `x ** 2`, `|x|`, or the norm itself."""
MAX_CHAIN = 4
"""Ops from the norm's first op to the divisor (`pow, sum, pow`; `norm, clamp_min,
expand_as`)."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`normalized_reads` as a reader (`readers.READERS`)."""
    return normalized_reads(edges, flow.nodes)


def normalized_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` with the first op of a divisor's norm reading the division's numerator."""
    if edges.height == 0:
        return edges
    first_shape = pl.col("data_inputs").list.first().struct.field("shape")
    shapes = nodes.select(
        "event",
        first_shape.alias("_in0"),
        "output_shape",
        pl.col("name").is_in(NORM_STARTS).alias("_starts"),
    )
    single = (
        edges.filter(pl.col("input_index") == 0)
        .group_by("consumer")
        .agg(pl.col("producer").first(), pl.len().alias("_n"))
        .filter(pl.col("_n") == 1)
        .select("consumer", "producer")
    )
    divs = (
        nodes.filter(pl.col("name").is_in(DIVISIONS) & (pl.col("data_inputs").list.len() == 2))
        .select(pl.col("event").alias("consumer"), first_shape.alias("_shape"))
        .join(single.rename({"producer": "_numerator"}), on="consumer")
        .join(
            edges.filter(pl.col("input_index") == 1).select(
                "consumer", pl.col("producer").alias("_at")
            ),
            on="consumer",
        )
    )
    if divs.height == 0:
        return edges
    # walk back from the divisor, along first arguments, to a norm's first op on x's shape,
    # past a reduction (`a / b.pow(2)` of one shape divides by no norm)
    found = []
    walk = divs.select("consumer", "_numerator", "_shape", "_at", pl.lit(False).alias("_reduced"))
    for _ in range(MAX_CHAIN):
        walk = walk.join(shapes.rename({"event": "_at"}), on="_at").with_columns(
            (pl.col("_reduced") | (pl.col("output_shape") != pl.col("_shape"))).alias("_reduced")
        )
        hit = walk.filter(
            pl.col("_starts") & (pl.col("_in0") == pl.col("_shape")) & pl.col("_reduced")
        )
        found.append(hit.select("_numerator", pl.col("_at").alias("_first")))
        walk = (
            walk.join(hit.select("consumer"), on="consumer", how="anti")
            .join(single.rename({"consumer": "_at", "producer": "_next"}), on="_at")
            .select("consumer", "_numerator", "_shape", pl.col("_next").alias("_at"), "_reduced")
        )
        if walk.height == 0:
            break
    norms = pl.concat(found).unique("_first", keep="none")
    into = pl.col("consumer").is_in(norms["_first"].implode()) & (pl.col("input_index") == 0)
    moved = (
        edges.filter(into)
        .join(norms, left_on="consumer", right_on="_first")
        .filter(pl.col("producer") != pl.col("_numerator"))
    )
    if moved.height == 0:
        return edges
    rewired = moved.with_columns(
        pl.col("_numerator").alias("producer"),
        pl.concat_str("evidence", pl.lit("+normalized")).alias("evidence"),
    ).drop("_numerator")
    kept = edges.join(
        moved.select("producer", "consumer", "input_index"),
        on=["producer", "consumer", "input_index"],
        how="anti",
    )
    return pl.concat([kept, rewired], how="diagonal_relaxed")
