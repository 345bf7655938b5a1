"""What DDP's reducer writes goes to the gradient bucket, which only its collective reads.

When a parameter's gradient is ready, the reducer scales it into its slot of the flat
bucket: `torch::distributed::reducer::mul_out` runs `mul(grad, 1 / world_size,
out=bucket_view)`. The result is a view of the bucket; the next op to read it is the
bucket's `allreduce`, which the trace records with no shapes and which reads the flat
bucket, not the view. Shape and order read the scaled gradient as the next parameter's
gradient, or as the `copy_` that writes the reduced bucket back into `.grad`
(`copy_bucket_to_grad`), so each parameter's scaling chained to the next one's: against
the ET corpus (`ddp_train`) every edge out of a reducer op was wrong (5 of 5), and on
HTA's MTIA training rank TQ104 reported the per-parameter scalings as pointwise chains of
up to 16 ops. So no edge leaves a reducer op.
"""

from __future__ import annotations

import polars as pl

REDUCER = "torch::distributed::reducer::"
"""The reducer's C++ frames (`mul_out`, ...): the ops under one write into a bucket."""


def reducer_reads(edges: pl.DataFrame, nodes: pl.DataFrame, all_ops: pl.DataFrame) -> pl.DataFrame:
    """`edges` without those out of an op the reducer ran into a gradient bucket."""
    frames = all_ops.filter(pl.col("name").str.starts_with(REDUCER)).select(
        pl.col("event").cast(pl.Int64).alias("parent")
    )
    if edges.height == 0 or frames.height == 0:
        return edges
    writes = nodes.join(frames, on="parent", how="semi").select(pl.col("event").alias("producer"))
    return edges.join(writes, on="producer", how="anti")
