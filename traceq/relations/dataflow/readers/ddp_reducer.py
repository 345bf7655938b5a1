"""DDP's gradient buckets: a gradient copied into its bucket is not a value the next op reads.

`DistributedDataParallel`'s reducer averages gradients in flat buckets. When it builds a
bucket it makes one view of it per parameter (`aten::as_strided` of the flat `[N]`
tensor); when AccumulateGrad has a gradient ready, the reducer's `mul_out` runs
`mul(grad, 1 / world_size, out=bucket_view)`, and the trace records that `aten::mul`
under `torch::distributed::reducer::mul_out`. Its result is the bucket view: read by the
allreduce of the whole bucket, then through new views of it (`copy_bucket_to_grad`'s
`copy_(grad, view)`), never by an op of the gradient's shape. Shape and order read it as
the most recent value of that shape, though: the grad that `copy_` writes, the parameter
the optimizer's `add_` updates (against the ET corpus: each such edge, 5 of 5, wrong). So
the reducer's write is no producer of a shape; what reads the bucket reads the collective
(`shapes`: an in-place collective returns its tensor).

Reads: DDP's reducer writing a gradient into its bucket view (`mul(grad, 1/n, out=view)`),
read by the allreduce. Appears in: DDP training (`ddp_train`); corpus entries whose edges
it changes: `ddp_train`. On the ET corpus: +4 right, +0 wrong, -4 missed edges (without it:
precision 0.996, recall 0.961; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.matching import CONFIDENCE, THREAD, shape_key

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace
    from traceq.relations.dataflow.edges import Flow

BUCKET_WRITE = r"::reducer::mul_out$"
"""The reducer's range around the op that writes a gradient into its bucket view."""


def bucket_writes(trace: LoadedTrace) -> pl.Series:
    """Events of the ops that wrote a gradient into a DDP bucket (`mul(..., out=view)`)."""
    ranges = trace.ops.filter(pl.col("name").str.contains(BUCKET_WRITE)).select(
        pl.col("event").cast(pl.Int64).alias("parent")
    )
    inside = trace.ops.with_columns(pl.col("parent").cast(pl.Int64)).join(ranges, on="parent")
    return inside["event"].cast(pl.Int64)


def without_bucket_results(nodes: pl.DataFrame, trace: LoadedTrace) -> pl.DataFrame:
    """`nodes` with no result shape for the ops that wrote into a bucket (by shape they
    are read by no one: the bucket is read through the allreduce), and with their `out=`
    view, the last argument, no input to match by shape (`bucket_view_reads` gives it);
    `_bucket_write` marks them."""
    writes = bucket_writes(trace)
    written = pl.col("event").is_in(writes.implode())
    last = pl.col("data_inputs").list.eval(pl.element().struct.field("index")).list.max()
    nodes = nodes.with_columns(
        pl.when(written).then(last).alias("_bucket_out"), written.alias("_bucket_write")
    )
    if writes.len() == 0:
        return nodes
    return nodes.with_columns(
        *(
            pl.when(written).then(None).otherwise(pl.col(c)).alias(c)
            for c in ("output_shape", "_out_shape", "_out_numel")
        ),
        pl.when(written)  # data inputs are in argument order: `out=` is the last
        .then(pl.col("data_inputs").list.head(pl.col("data_inputs").list.len() - 1))
        .otherwise(pl.col("data_inputs"))
        .alias("data_inputs"),
    )


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`bucket_view_reads` as a reader (`readers.READERS`)."""
    return bucket_view_reads(edges, flow.nodes)


def bucket_view_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` plus, into each bucket write's `out=` argument, the view of the bucket it
    writes: the one `as_strided` view of a flat tensor with the gradient's shape made
    before it in the step. Where the bucket has several views of that shape (layers
    alike), which one is this gradient's is not recorded: no edge."""
    if "_bucket_write" not in nodes.columns or not nodes["_bucket_write"].any():
        return edges
    flat = pl.col("data_inputs").list.first().struct.field("shape").list.len() == 1
    views = nodes.filter((pl.col("name") == "aten::as_strided") & flat).select(
        *THREAD, pl.col("event").alias("producer"), pl.col("_seq").alias("_pseq"), "_out_shape"
    )
    writes = (
        nodes.filter("_bucket_write")
        .select(
            *THREAD,
            pl.col("event").alias("consumer"),
            "_seq",
            pl.col("data_inputs").list.first().struct.field("shape").alias("shape"),
            "_bucket_out",
        )
        .with_columns(shape_key(pl.col("shape")).alias("_out_shape"))
    )
    found = (
        writes.join(views, on=[*THREAD, "_out_shape"])
        .filter(pl.col("_pseq") < pl.col("_seq"))
        .filter(pl.len().over("consumer") == 1)
        .select(
            "producer",
            "consumer",
            pl.col("_bucket_out").cast(pl.Int64).alias("input_index"),
            "shape",
            pl.lit(CONFIDENCE["unique"]).alias("confidence"),
            pl.lit("shape+bucket-view").alias("evidence"),
        )
    )
    return pl.concat([edges, found], how="diagonal_relaxed")
