"""A blend by a mask written out: `x * m + y * (1 - m)`.

`generate` keeps finished sequences at the pad token so: `next_tokens * unfinished +
pad * (1 - unfinished)`; inpainting blends latents by a mask the same way. The trace
records `mul(x, m)`, `rsub(m)`, `mul(y, 1 - m)`, `add`, and by shape and order the `rsub`
reads the product just made (`1 - x * m`) and the `add` a value older than the product
(the product looks replaced by the `rsub`): against the ET corpus both readings were
wrong every time (8 edges, both `generate` entries, every decode step).

Where a `rsub` reads a product of two values of its shape that nothing else reads, and
a second product reads the `rsub`, and an `add` of two values of that shape reads the
second product: the `add` reads the first product beside it, and the `rsub` reads the
mask, the product's older operand (`x`, the value being blended, is computed last:
`next_tokens` by the `argmax` right before). Where the two operands are one value, or
neither is older, the `rsub` gets no edge. Where the `add` was left reading the second
product alone (the first looked replaced by the `rsub`, so no older value was offered),
the first product is its first operand, the second its second.

Reads: a mask blend written out, `x * m + y * (1 - m)`. Appears in: `generate`'s `next *
unfinished + pad * (1 - unfinished)` (GPT-2, LLaMA); corpus entries whose edges it changes:
`gpt2_generate`, `llama_generate`. On the ET corpus: +16 right, -8 wrong, -16 missed edges
(without it: precision 0.994, recall 0.959; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import edge_of, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

BASE = shapes.base_name()


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`blend_reads` as a reader (`readers.READERS`)."""
    return blend_reads(edges, flow.nodes)


def blend_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` with a written-out mask blend read as written (module docstring)."""
    if edges.height == 0:
        return edges
    tensors = (
        pl.col("data_inputs")
        .list.eval(pl.element().struct.field("shape").list.len() > 0)
        .list.sum()
    )
    info = nodes.select("event", "_seq", BASE.alias("_base"), tensors.alias("_n"), "_out_shape")
    shaped = edges.filter(pl.col("shape").list.len() > 0).join(
        info.select(pl.col("event").alias("producer"), pl.col("_seq").alias("_pseq")),
        on="producer",
    )

    def into(base: str, n: int) -> pl.DataFrame:
        ops = info.filter((pl.col("_base") == base) & (pl.col("_n") == n))
        return shaped.join(
            ops.select(pl.col("event").alias("consumer"), "_out_shape"), on="consumer"
        )

    readers = shaped.group_by("producer").agg(pl.len().alias("_readers"))
    rsub = into("rsub", 1).join(readers.filter(pl.col("_readers") == 1), on="producer")
    first = into("mul", 2)
    second = into("mul", 2).vstack(into("mul", 1))
    sums = into("add", 2)
    found = (
        rsub.select(
            pl.col("producer").alias("_p1"),
            pl.col("consumer").alias("_r"),
            pl.col("input_index").alias("_r_index"),
            "_out_shape",
        )
        .join(
            first.select(pl.col("consumer").alias("_p1"), "_out_shape").unique(),
            on=["_p1", "_out_shape"],
        )
        .join(
            second.select(pl.col("producer").alias("_r"), pl.col("consumer").alias("_p2")),
            on="_r",
        )
        .join(
            sums.select(
                pl.col("producer").alias("_p2"), pl.col("consumer").alias("_sum"), "_out_shape"
            ),
            on=["_p2", "_out_shape"],
        )
    )
    if found.height == 0:
        return edges
    found = found.unique(["_r", "_sum"])
    into_sum = (
        found.select("_p1", "_p2", "_sum")
        .join(sums.select("producer", pl.col("consumer").alias("_sum"), "input_index"), on="_sum")
        .filter((pl.col("producer") != pl.col("_p2")) & (pl.col("producer") != pl.col("_p1")))
    )
    moved_sum = edges.join(
        into_sum.select(
            "producer", pl.col("_sum").alias("consumer"), "input_index", pl.col("_p1").alias("_to")
        ),
        on=["producer", "consumer", "input_index"],
    )
    # a sum left reading the second product alone: the first product is its first operand
    alone = (
        edges.join(found.select(pl.col("_sum").alias("consumer"), "_p1", "_p2"), on="consumer")
        .filter(pl.len().over("consumer") == 1)
        .filter(pl.col("producer") == pl.col("_p2"))
    )
    if alone.height:
        both = pl.concat(
            [
                alone.with_columns(
                    pl.col("_p1").alias("producer"),
                    pl.lit(0).alias("input_index"),
                    pl.concat_str("evidence", pl.lit("+blend")).alias("evidence"),
                ),
                alone.with_columns(pl.lit(1).alias("input_index")),
            ]
        )
        key = ["producer", "consumer", "input_index"]
        edges = pl.concat(
            [
                edges.join(alone.select(key), on=key, how="anti", nulls_equal=True),
                both.select(edges.columns),
            ],
            how="vertical_relaxed",
        )
    # the mask: the product's older operand, where the other one is newer
    operands = first.group_by("consumer").agg(
        pl.col("producer").sort_by("_pseq").first().alias("_mask"),
        pl.col("_pseq").n_unique().alias("_operands"),
    )
    masks = found.join(operands, left_on="_p1", right_on="consumer").filter(
        pl.col("_operands") == 2
    )
    moved_rsub = edges.join(
        masks.select(
            *edge_of("_p1", "_r", "_r_index", _to="_mask"),
        ),
        on=["producer", "consumer", "input_index"],
    )
    unknown = found.join(masks.select("_r"), on="_r", how="anti").select(*edge_of("_p1", "_r"))
    edges = edges.join(unknown, on=["producer", "consumer"], how="anti")
    return with_moved(edges, pl.concat([moved_sum, moved_rsub]), "+blend")
