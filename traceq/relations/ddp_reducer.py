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
(`opshapes`: an in-place collective returns its tensor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from traceq.trace import Trace

BUCKET_WRITE = r"::reducer::mul_out$"
"""The reducer's range around the op that writes a gradient into its bucket view."""


def bucket_writes(trace: Trace) -> pl.Series:
    """Events of the ops that wrote a gradient into a DDP bucket (`mul(..., out=view)`)."""
    ranges = trace.ops.filter(pl.col("name").str.contains(BUCKET_WRITE)).select(
        pl.col("event").cast(pl.Int64).alias("parent")
    )
    inside = trace.ops.with_columns(pl.col("parent").cast(pl.Int64)).join(ranges, on="parent")
    return inside["event"].cast(pl.Int64)


def without_bucket_results(nodes: pl.DataFrame, trace: Trace) -> pl.DataFrame:
    """`nodes` with no result shape for the ops that wrote into a bucket: by shape they
    are read by no one (the bucket is read through the allreduce)."""
    writes = bucket_writes(trace)
    if writes.len() == 0:
        return nodes
    written = pl.col("event").is_in(writes.implode())
    return nodes.with_columns(
        pl.when(written).then(None).otherwise(pl.col(c)).alias(c)
        for c in ("output_shape", "_out_shape", "_out_numel")
    )
