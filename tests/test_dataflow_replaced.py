"""A value replaced by a binary op, a view or a copy is not read again by a later pointwise
op (`matching._SELF_READING`), against the Execution Trace.

A pointwise op may read a value an op at its module level replaced when the replacing op
was a function of it (`h * sigmoid(h)`, a written-out GELU). Where the replacing op was a
binary op or a view (T5's `rp = torch.abs(rp); rp.to(...)`, `large = torch.min(large,
full_like(large))`; DDP's reducer `grad.view(...)`), the ET corpus had 15 such reads
wrong of 17: T5's bucket `where` read `full_like`, DDP's `mul` of the gradient a view.
Both tests fail on the code before `_SELF_READING`.
"""

from __future__ import annotations

import polars as pl
from conftest import corpus_et, corpus_trace

from traceq.relations.dataflow.execution_trace import tensor_edges


def _edges_into(entry: str, name: str) -> tuple[set, set]:
    trace, et = corpus_trace(entry), corpus_et(entry)
    ops = trace.dataflow_ops.filter(pl.col("name") == name)["event"].implode()
    key = ["producer", "consumer"]
    exact = set(
        tensor_edges(trace, et).filter(pl.col("consumer").is_in(ops)).select(key).iter_rows()
    )
    inferred = set(trace.dataflow.filter(pl.col("consumer").is_in(ops)).select(key).iter_rows())
    return inferred, exact


def test_t5_bucket_where_reads_no_replaced_full_like() -> None:
    inferred, exact = _edges_into("t5", "aten::where")
    assert len(exact) >= 10
    assert inferred <= exact


def test_ddp_gradient_muls_read_no_replaced_view() -> None:
    inferred, exact = _edges_into("ddp_train", "aten::mul")
    assert len(inferred & exact) == 8  # each bucket write `mul(grad, 1 / n, out=view)`
    assert inferred == exact  # its `out=` view no longer takes a second value by shape
