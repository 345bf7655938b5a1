"""`torch.min(a, b)` / `torch.max(a, b)`: elementwise, not a reduction (`opshapes`).

T5's relative position buckets run `-torch.min(rp, torch.zeros_like(rp))` and
`torch.min(large, torch.full_like(large, n - 1))`. Read as the reduction `torch.min(a)`,
each returned a 0-d tensor and read only `a`: `neg` and `where` found no value of their
shape and took the `zeros_like` / `full_like` beside it (t5: 4 wrong edges, 3 missed).
The edges into T5's `min` and `neg` ops are checked against the ET's tensor ids; the
first two tests fail on the code before `shapes.PAIRWISE_EXTREMES`.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.execution_trace import tensor_edges


def test_min_of_two_tensors_is_elementwise_and_reads_both() -> None:
    sig = shapes.signature("aten::min", "[[8, 8], [8, 8]]", ["long int", "long int"], ["", ""])
    assert (sig.kind, sig.output, sig.inputs) == (
        shapes.ELEMENTWISE,
        [8, 8],
        [(0, [8, 8]), (1, [8, 8])],
    )
    whole = shapes.signature("aten::min", "[[8, 8]]", ["float"], [""])
    assert (whole.kind, whole.output) == (shapes.REDUCTION, [])


@pytest.mark.parametrize("name", ["aten::neg", "aten::min"])
def test_t5_bucket_ops_read_what_the_et_says(name: str) -> None:
    """`neg` reads the `min` (it read `zeros_like` before); each `min` reads both tensors."""
    trace, et = corpus_trace("t5"), corpus_et("t5")
    ops = trace.dataflow_ops.filter(pl.col("name") == name)["event"].implode()
    key = ["producer", "consumer"]
    exact = set(
        tensor_edges(trace, et).filter(pl.col("consumer").is_in(ops)).select(key).iter_rows()
    )
    inferred = set(trace.dataflow.filter(pl.col("consumer").is_in(ops)).select(key).iter_rows())
    assert exact
    assert inferred == exact
