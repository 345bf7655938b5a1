"""Sibling projections viewed in order: `q, k, v = q_proj(x), k_proj(x), v_proj(x)`, then
`q.view(...), k.view(...), v.view(...)` (`sibling_projection_reads`).

The projections run in submodule calls, so the first view takes `v`, the most recent value
of the shape; the i-th of n views in a row reads the i-th of n projections
(`sibling_projection_reads`).

Reads: sibling projections viewed in order (`q_proj(x), k_proj(x), v_proj(x)`, then
`q.view(...), k.view(...), v.view(...)`). Appears in: CLIP's and diffusers' attention
(`Attention`: DiT, the UNet); corpus entries whose edges it changes: `clip`, `dit`, `unet`.
On the ET corpus: +26 right, -26 wrong, -26 missed edges (without it: precision 0.991,
recall 0.957; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import THREAD, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`sibling_projection_reads` as a reader (`readers.READERS`)."""
    return sibling_projection_reads(edges, flow.nodes)


def sibling_projection_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Sibling projections viewed in order: `q = self.q_proj(x); k = ...; v = ...; q.view(),
    k.view(), v.view()` (CLIP, diffusers' Attention).

    The GEMMs run in submodule calls, so their results are no siblings of one call and
    the oldest-first queue (`matching._queued`) leaves them alone; the first view takes `v`, the
    most recent value of the shape. Where n GEMMs of one output shape return into one
    module call and then n ops of one name in that call, all after the last GEMM, read
    them at one argument (each reads one), the i-th op reads the i-th GEMM. Not for
    `q_proj(x).view(...)` interleaved (LLaMA): there the most recent value is right."""
    if edges.height == 0:
        return edges
    info = nodes.select("event", "_seq", *THREAD, "_call", "_scope_start", "_out_shape", "kind")
    gemms = info.filter(
        (pl.col("kind") == shapes.GEMM) & pl.col("_scope_start").is_not_null()
    ).select(
        pl.col("event").alias("producer"),
        pl.col("_seq").alias("_pseq"),
        *THREAD,
        pl.col("_call").alias("_pcall"),
        "_scope_start",
        "_out_shape",
    )
    reads = (
        edges.filter(pl.col("input_index").is_not_null())
        .join(gemms, on="producer")
        .join(
            nodes.select(
                pl.col("event").alias("consumer"),
                pl.col("_seq").alias("_cseq"),
                pl.col("_call").alias("_ccall"),
                pl.col("_scope_start").alias("_cscope"),
                pl.col("name").alias("_cname"),
            ),
            on="consumer",
        )
        .filter(
            (pl.col("_cscope") == pl.col("_scope_start")) & (pl.col("_ccall") != pl.col("_pcall"))
        )
    )
    family = [*THREAD, "_scope_start", "_out_shape", "_cname"]
    consumers = (
        reads.group_by([*family, "consumer", "_cseq"])
        .agg(pl.len().alias("_n"), pl.col("input_index").first())
        .sort("_cseq")
        .with_columns(pl.int_range(pl.len()).over(family).alias("_i"))
    )
    made = (
        gemms.join(consumers.select(family).unique(), on=[*THREAD, "_scope_start", "_out_shape"])
        .join(
            consumers.group_by(family).agg(
                pl.col("_cseq").min().alias("_first"), pl.col("_cseq").max().alias("_last")
            ),
            on=family,
        )
        .filter(pl.col("_pseq") < pl.col("_last"))
        .sort("_pseq")
        .with_columns(pl.int_range(pl.len()).over(family).alias("_i"))
    )
    sizes = (
        consumers.group_by(family)
        .agg(pl.len().alias("_q"), (pl.col("_n") == 1).all().alias("_single"))
        .join(
            made.group_by(family).agg(
                pl.len().alias("_p"), (pl.col("_pseq") < pl.col("_first")).all().alias("_before")
            ),
            on=family,
        )
        .filter(
            (pl.col("_q") == pl.col("_p"))
            & (pl.col("_q") >= 2)
            & pl.col("_single")
            & pl.col("_before")
        )
    )
    pairs = consumers.join(sizes.select(family), on=family).join(
        made.select(*family, "_i", pl.col("producer").alias("_to")), on=[*family, "_i"]
    )
    moved = edges.join(
        pairs.select("consumer", "input_index", "_to"), on=["consumer", "input_index"]
    ).filter(pl.col("producer") != pl.col("_to"))
    return with_moved(edges, moved, "+sibling-projections")
