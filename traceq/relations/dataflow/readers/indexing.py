"""What an advanced index (`x[idx]`, `aten::index`) reads and returns, from the ops it runs.

Kineto records `aten::index(self, indices)` with the indices as one untyped argument of no
shape (`Input Dims` `[[24, 64], []]`, type `''`), so its output shape is unknown and its
index tensors are no data inputs: a Mixture of Experts dispatch (`hidden[token_idx]`,
`weights[perm]`, `out[inverse]`) then has every edge into and out of its `index` ops
missing, and the ops after them read older values of the shape instead (against the ET
corpus: Mixtral's 16 missed and 4 wrong edges). What the op runs says both: it restrides
`self` to the result's size (`as_strided(self, size, stride)`, its first child) and
reshapes each index tensor to broadcast it (`reshape(idx, ...)` of an integer tensor),
on every device (TensorIterator's `restride_src`). So the result has the `as_strided`'s
size, and each integer tensor a `reshape` or `view` child reads is a data input of the
indices argument, in order (as the ET numbers a list's tensors, at the list's index),
whose recorded type becomes theirs.

Where the children record no size (older profilers leave `as_strided`'s concrete inputs
empty) the result stays unknown, and the op right after such an unread `index` would take
an older value of the shape it reads: CLIP's `text_projection(pooled)` with `pooled =
last_hidden_state[arange(n), eos]` read the vision tower's norm, 60 ops back; Whisper's
`embed_positions.weight[positions]` left the `to` after it reading the token embedding.
Indexing keeps the trailing dims of `x` past the indexed ones, so an edge into that op
from a value older than the `index`, of the index's last dim, is dropped (`indexed_reads`:
unknown beats wrong).

Reads: advanced indexing, `x[idx]`: the op right after an unread `index` reads it. Appears
in: Mixtral's expert dispatch (CLIP's pooled output and Whisper give `index_results` their
shapes); corpus entries whose edges it changes: `mixtral`. On the ET corpus: +0 right, -2
wrong, +0 missed edges (without it: precision 0.995, recall 0.962;
`benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.matching import THREAD

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

INDEX = "aten::index"
INDICES = 1
"""The argument of `aten::index` holding the index tensors."""
SIZE = r"^\[\s*\d+(\s*,\s*\d+)*\s*\]$"
"""A recorded size: `[48, 64]`."""
INTEGER = ("long int", "int", "short int", "signed char", "unsigned char", "bool")
"""Index tensors' dtypes, as the profiler records a tensor argument's type."""


def index_results(frame: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """`frame` (`dataflow_ops` rows) with the output shape and index tensors of each
    `aten::index` whose output is unknown, read from its children in `ops`."""
    unknown = frame.filter((pl.col("name") == INDEX) & pl.col("output_shape").is_null())
    if unknown.height == 0:
        return frame
    children = ops.filter(pl.col("parent").cast(pl.Int64).is_in(unknown["event"].implode())).select(
        pl.col("parent").cast(pl.Int64).alias("event"),
        pl.col("event").cast(pl.Int64).alias("_child"),
        "name",
        "shapes",
        "input_types",
        "concrete_inputs",
    )
    size = (
        children.filter(pl.col("name") == "aten::as_strided")
        .sort("_child")
        .unique("event", keep="first")
        .select("event", pl.col("concrete_inputs").list.get(1, null_on_oob=True).alias("_size"))
        # older profilers record no concrete inputs (`''`): the size stays unknown
        .filter(pl.col("_size").str.contains(SIZE))
        .with_columns(pl.col("_size").str.json_decode(pl.List(pl.Int64)))
    )
    indices = (
        children.filter(
            pl.col("name").is_in(["aten::reshape", "aten::view"])
            & pl.col("input_types").list.first().is_in(INTEGER)
        )
        .sort("_child")
        .group_by("event", maintain_order=True)
        .agg(
            pl.struct(
                pl.lit(INDICES, dtype=pl.Int64).alias("index"),
                pl.col("shapes").list.first().alias("shape"),
            ).alias("_indices"),
            pl.col("input_types").list.first().first().alias("_index_type"),
        )
    )
    return (
        frame.join(size, on="event", how="left")
        .join(indices, on="event", how="left")
        .with_columns(
            pl.coalesce("output_shape", "_size").alias("output_shape"),
            pl.when(pl.col("_indices").is_not_null())
            .then(pl.concat_list("data_inputs", "_indices"))
            .otherwise("data_inputs")
            .alias("data_inputs"),
            # the indices argument's dtype, as for any tensor argument (`matching` pairs
            # integer values with integer arguments)
            pl.when(pl.col("_index_type").is_not_null())
            .then(
                pl.concat_list(
                    pl.col("input_types").list.head(INDICES),
                    pl.col("_index_type"),
                    pl.col("input_types").list.slice(INDICES + 1),
                )
            )
            .otherwise("input_types")
            .alias("input_types"),
        )
        .drop("_size", "_indices", "_index_type")
    )


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`indexed_reads` as a reader (`readers.READERS`)."""
    return indexed_reads(edges, flow.nodes)


def indexed_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` without the ones into the op right after an unread `index`  of
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
        ordered.filter(pl.col("_index_name") == INDEX)
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
