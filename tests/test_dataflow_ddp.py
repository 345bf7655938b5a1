"""DDP's gradient buckets and the backward pass, against the Execution Trace (`ddp_train`).

The reducer writes each gradient into its bucket view (`reducer::mul_out`: `mul(grad,
1 / world_size, out=view)`), all-reduces the flat bucket in place (`c10d::allreduce_`),
and copies each new view of it back into the grad (`copy_bucket_to_grad`: `copy_(grad,
view)`). Before `ddp_reducer` and the in-place collective's result (`opshapes`), `copy_`
read the bucket write as the grad (4 wrong edges), the bucket write read a `t` for the
grad, and nothing read the allreduce. Before `backward_reads`, an `AddmmBackward0` read
the model's output as its gradient or a graph input, and its weight gradient GEMM read the
input gradient GEMM beside it (3 wrong edges). Each test fails on the code before them.
"""

from __future__ import annotations

import polars as pl
from conftest import corpus_et, corpus_trace, edges_into

from traceq.relations.dataflow import shapes

ENTRY = "ddp_train"


def _ops(parent: str | None = None, names: list[str] | None = None) -> pl.Series:
    """Events of the data-flow ops whose enclosing range is named `parent`, or named `names`."""
    trace = corpus_trace(ENTRY)
    ops = trace.dataflow_ops
    if parent is not None:
        ranges = trace.ops.filter(pl.col("name").str.ends_with(parent))["event"].cast(pl.Int64)
        ops = ops.filter(pl.col("parent").is_in(ranges.implode()))
    if names is not None:
        ops = ops.filter(pl.col("name").is_in(names))
    return ops["event"]


def test_a_bucket_write_reads_the_gradient_and_its_bucket_view() -> None:
    inferred, exact = edges_into(corpus_trace(ENTRY), corpus_et(ENTRY), _ops("reducer::mul_out"))
    assert len(exact) == 8  # four gradients, each with its view of the bucket
    assert inferred == exact


def test_the_bucket_views_after_the_allreduce_read_it() -> None:
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    allreduce = _ops(names=["c10d::allreduce_"])
    views = trace.dataflow_ops.filter(
        (pl.col("name") == "aten::as_strided") & (pl.col("event") > allreduce.max())
    )["event"]
    inferred, exact = edges_into(trace, et, views)
    assert {p for p, _ in exact} == set(allreduce)
    assert len(exact) == 4
    assert inferred == exact


def test_the_copy_back_writes_the_grad_accumulate_grad_detached() -> None:
    inferred, exact = edges_into(
        corpus_trace(ENTRY), corpus_et(ENTRY), _ops("reducer::copy_bucket_to_grad")
    )
    assert len(exact) == 8  # the grad and the bucket's new view, four times
    assert inferred == exact


def test_the_backward_nodes_read_no_value_their_forward_op_did_not_save() -> None:
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    work = ["aten::mm", "aten::sum", "aten::t", "aten::view", "aten::gelu_backward"]
    inferred, exact = edges_into(trace, et, _ops(names=work))
    assert len(inferred & exact) >= 13
    assert inferred <= exact


def test_an_in_place_collective_returns_its_one_tensor() -> None:
    """`allreduce_([bucket])` writes the bucket; of several tensors no one shape is known."""
    types = ["TensorList", "", "", "", "", ""]
    one = shapes.signature("c10d::allreduce_", "[[[16576]], [], [], [], [], []]", types, None)
    two = shapes.signature("c10d::allreduce_", "[[[4], [8]], [], [], [], [], []]", types, None)
    assert one.output == [16576]
    assert two.output is None


def test_the_broadcast_parameters_are_copied_back_from_the_broadcast() -> None:
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    broadcasts = _ops(names=["c10d::broadcast_"])
    copies = trace.dataflow_ops.filter(
        (pl.col("name") == "aten::copy_") & (pl.col("event") - 1).is_in(broadcasts.implode())
    )["event"]
    inferred, exact = edges_into(trace, et, copies)
    assert {(p, c) for p, c in exact if p in set(broadcasts)} <= inferred
    assert inferred <= exact
