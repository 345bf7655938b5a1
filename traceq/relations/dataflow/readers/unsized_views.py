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

Reads: a reshape whose size the profiler did not record (PyTorch before 2.2). Appears in:
traces of PyTorch before 2.2 (HTA's recsys ranks, `tests/test_dataflow_unsized_views.py`);
the corpus records every size; corpus entries whose edges it changes: none. On the ET
corpus: +0 right, +0 wrong, +0 missed edges (without it: precision 0.996, recall 0.962;
`benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.edges import passed_shapeless
from traceq.relations.dataflow.matching import THREAD

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

RESHAPES = (
    "aten::view",
    "aten::reshape",
    "aten::_unsafe_view",
    "aten::_reshape_alias",
    "aten::flatten",
)
"""Views that keep their input's element count and take their size (or dims) as ints."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`unsized_view_reads` as a reader (`readers.READERS`)."""
    return unsized_view_reads(edges, flow.nodes)


def unsized_view_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` without the shape-matched ones that pass a reshape of unknown result
    shape holding as many elements as the value they carry."""
    shaped = edges.filter(pl.col("input_index").is_not_null() & pl.col("shape").is_not_null())
    passed = passed_shapeless(
        shaped,
        nodes,
        pl.col("name").is_in(RESHAPES) & pl.col("output_shape").is_null(),
        THREAD,
        numel=pl.col("data_inputs").list.first().struct.field("shape"),
    )
    key = ["producer", "consumer", "input_index"]
    return edges.join(passed.select(key).unique(), on=key, how="anti", nulls_equal=True)
