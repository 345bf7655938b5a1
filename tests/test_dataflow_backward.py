"""Edges into the backward pass against the Execution Trace (`ddp_train`).

A backward node's ops (`MseLossBackward0`'s `mse_loss_backward`, `GeluBackward0`'s
`gelu_backward`, `AddmmBackward0`'s `mm`s) read the gradient and what the forward op saved.
For a GEMM, GELU or a loss that is the forward op's inputs, never its result, so the edge
from the forward op by the autograd sequence number (`fwdbwd`) was wrong each time in the
corpus (5 of 5); the loss's backward reads the seed gradient `ones_like(loss)` instead.
Both tests fail on the code before `dataflow.SAVES_RESULT` and
`scalars.gradient_seed_edges`.
"""

from __future__ import annotations

import polars as pl
from conftest import corpus_et, corpus_trace

from traceq.relations.execution_trace import tensor_edges

ENTRY = "ddp_train"


def _edges_into(names: list[str]) -> tuple[set, set]:
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    ops = trace.dataflow_ops.filter(pl.col("name").is_in(names))["event"].implode()
    key = ["producer", "consumer"]
    exact = set(
        tensor_edges(trace, et).filter(pl.col("consumer").is_in(ops)).select(key).iter_rows()
    )
    inferred = set(trace.dataflow.filter(pl.col("consumer").is_in(ops)).select(key).iter_rows())
    return inferred, exact


def test_the_loss_backward_reads_the_seed_gradient_and_the_losss_input() -> None:
    inferred, exact = _edges_into(["aten::mse_loss_backward", "aten::ones_like"])
    assert len(exact) == 3  # loss -> ones_like; ones_like, the prediction -> backward
    assert inferred == exact


def test_no_edge_rests_on_the_sequence_number_where_the_backward_reads_inputs() -> None:
    """Every edge from a forward op into its backward node (`fwdbwd`) is the ET's: the
    corpus's GEMMs, GELU and loss make none (their backward reads their inputs)."""
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    key = ["producer", "consumer"]
    exact = set(tensor_edges(trace, et).select(key).iter_rows())
    fwdbwd = set(trace.dataflow.filter(pl.col("evidence") == "fwdbwd").select(key).iter_rows())
    assert fwdbwd <= exact
