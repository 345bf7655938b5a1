"""Advanced indexing (`x[idx]`, `x[rows, cols]`): a result of unknown shape read next.

Kineto records `aten::index`'s indices as a tensor list it leaves empty, so the shape of
`x[idx]` is unknown and shape matching cannot offer it to anyone. The op after it then
takes an older value of the shape it reads: CLIP's `text_projection(pooled)` with `pooled
= last_hidden_state[arange(n), eos]` read the vision tower's norm, 60 ops back; Whisper's
`embed_positions.weight[positions]` left the `to` after it reading the token embedding.
Indexing keeps the trailing dims of `x` past the indexed ones, so where the op right
after an unread `index` reads a value whose last dim is `x`'s last dim, it may be reading
the index's result: an edge there from a value older than the `index` is dropped (unknown
beats wrong).
"""

from __future__ import annotations

import polars as pl

from traceq.relations.matching import THREAD

INDEXING = frozenset({"aten::index"})


def indexed_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` without the ones into the op right after an unread `index` (`INDEXING`) of
    the same last dim that come from a value made before the index."""
    if edges.height == 0:
        return edges
    last_dim = pl.col("data_inputs").list.first().struct.field("shape").list.last()
    ordered = nodes.sort("_seq").with_columns(
        pl.col("event").shift(1).over(THREAD).alias("_index"),
        pl.col("name").shift(1).over(THREAD).alias("_index_name"),
        pl.col("_seq").shift(1).over(THREAD).alias("_index_seq"),
        last_dim.shift(1).over(THREAD).alias("_index_dim"),
    )
    read = edges.select(pl.col("producer").alias("_index")).unique()
    after = (
        ordered.filter(pl.col("_index_name").is_in(INDEXING))
        .join(read, on="_index", how="anti")
        .select(pl.col("event").alias("consumer"), "_index_seq", "_index_dim")
    )
    if after.height == 0:
        return edges
    seq = nodes.select(pl.col("event").alias("producer"), pl.col("_seq").alias("_pseq"))
    older = (
        edges.filter(pl.col("input_index").is_not_null())
        .join(after, on="consumer")
        .join(seq, on="producer")
        .filter(
            (pl.col("_pseq") < pl.col("_index_seq"))
            & (pl.col("shape").list.last() == pl.col("_index_dim"))
        )
    )
    key = ["producer", "consumer", "input_index"]
    return edges.join(older.select(key), on=key, how="anti", nulls_equal=True)
