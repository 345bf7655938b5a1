"""A reshape whose size the profiler did not record still holds a value a later op reads.

Kineto records an int-list argument as `[]` in `Input Dims`; only PyTorch from 2.2 on
adds its values (`Concrete Inputs`). In older traces every `view(x, size)` and
`reshape` has an unknown result shape, so no consumer matches it by shape, and the
consumer's input is matched past it to an older value of the exact shape instead. On
HTA's GPU ranks a metric loop's `(a.view(1, -1) * b.view(1, -1)).sum()`, three views
of `[4096]` before each pair of `mul`s, read each `mul` as consuming the one before:
TQ104 chains of 18 `mul`s. A reshape keeps its input's element count, so where one of
that count ran on the thread between a shape-matched producer and its consumer, the
consumer may have read the reshape: no edge. Unknown beats wrong.
"""

from __future__ import annotations

import polars as pl

from traceq.relations.matching import THREAD, numel_key

RESHAPES = (
    "aten::view",
    "aten::reshape",
    "aten::_unsafe_view",
    "aten::_reshape_alias",
    "aten::flatten",
)
"""Views that keep their input's element count and take their size (or dims) as ints."""


def unsized_view_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` without the shape-matched ones that pass a reshape of unknown result
    shape holding as many elements as the value they carry."""
    views = nodes.filter(pl.col("name").is_in(RESHAPES) & pl.col("output_shape").is_null()).select(
        *THREAD,
        pl.col("_seq").alias("_vseq"),
        numel_key(pl.col("data_inputs").list.first().struct.field("shape")).alias("_numel"),
    )
    if edges.height == 0 or views.height == 0:
        return edges
    seq = nodes.select("event", *THREAD, "_seq")
    shaped = (
        edges.filter(pl.col("input_index").is_not_null() & pl.col("shape").is_not_null())
        .join(
            seq.select(pl.col("event").alias("producer"), pl.col("_seq").alias("_pseq")),
            on="producer",
        )
        .join(seq.rename({"event": "consumer"}), on="consumer")
        .with_columns(numel_key(pl.col("shape")).alias("_numel"))
    )
    passed = shaped.join(views, on=[*THREAD, "_numel"]).filter(
        (pl.col("_pseq") < pl.col("_vseq")) & (pl.col("_vseq") < pl.col("_seq"))
    )
    key = ["producer", "consumer", "input_index"]
    return edges.join(passed.select(key).unique(), on=key, how="anti", nulls_equal=True)
