"""Residual adds after a dropout that returned its input, against the Execution Trace.

`h = residual + dropout(dense(x))` (BERT, ViT, T5; dropout in eval mode returns its
input): `dense(x)` and `dropout(...)` are the two most recent values of the shape, so the
add read `dense(x)` twice and missed the residual (BERT 4, ViT 6, T5 10 edges); in BERT
the next value of the shape is the dense's own input (`matching._without_aliased`). The
edges into each residual add (two inputs of one 3-d shape) are checked against the ET's
tensor ids; the test fails on the code before `_without_aliased`.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace

from traceq.relations.dataflow.execution_trace import tensor_edges


def _pairs(frame: pl.DataFrame) -> set[tuple[int, int]]:
    return set(frame.select("producer", "consumer").iter_rows())


@pytest.mark.parametrize("entry", ["bert", "vit_repeated", "t5"])
def test_residual_adds_read_the_residual_and_the_sublayer(entry: str) -> None:
    trace, et = corpus_trace(entry), corpus_et(entry)
    adds = trace.dataflow_ops.filter(
        (pl.col("name") == "aten::add")
        & (pl.col("data_inputs").list.len() == 2)
        & (pl.col("output_shape").list.len() == 3)
    )["event"]
    assert adds.len() >= 6
    exact = _pairs(tensor_edges(trace, et).filter(pl.col("consumer").is_in(adds.implode())))
    inferred = _pairs(trace.dataflow.filter(pl.col("consumer").is_in(adds.implode())))
    assert len(exact) >= adds.len() + 6  # a parameter (a position embedding) has no edge
    assert inferred == exact
