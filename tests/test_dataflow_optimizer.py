"""The optimizer's reads and Megatron's written-out bias-GELU, against the Execution Trace
(`readers/optimizer_steps.py`, `readers/bias_gelu.py`)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace

from traceq.relations.dataflow.execution_trace import ground_truth
from traceq.relations.dataflow.readers.optimizer_steps import stored_gradients


def _edges(name: str) -> tuple[pl.DataFrame, set[tuple[int, int]]]:
    trace = corpus_trace(name)
    exact, _ = ground_truth(trace, corpus_et(name), trace.dataflow_ops)
    return trace.dataflow, set(exact.select("producer", "consumer").iter_rows())


def _sgd_steps(name: str) -> pl.DataFrame:
    ops = corpus_trace(name).dataflow_ops
    return ops.filter((pl.col("name") == "aten::add_") & pl.col("parent").is_null())


@pytest.mark.parametrize("name", ["gpt2_train_ce", "tp_train"])
def test_each_sgd_step_reads_one_stored_gradient(name: str) -> None:
    """`param.add_(grad)`: the parameter has no producer in the step; shape and order gave
    each `add_` two values (a norm's backward, the previous `add_`)."""
    flow, _ = _edges(name)
    trace = corpus_trace(name)
    stored = stored_gradients(trace.dataflow_ops, trace.ops)
    steps = _sgd_steps(name)
    assert steps.height >= 10
    into = flow.join(steps.select(pl.col("event").alias("consumer")), on="consumer")
    assert into.group_by("consumer").len()["len"].max() == 1
    assert into["producer"].is_in(stored["event"].implode()).all()


def test_sgd_steps_in_forward_order_read_their_own_gradients() -> None:
    """GPT-2 registers its parameters in forward order: every step reads the ET's gradient,
    the norms' weight and bias (one shape) included."""
    flow, exact = _edges("gpt2_train_ce")
    steps = _sgd_steps("gpt2_train_ce").filter(pl.col("event").is_in(flow["consumer"].implode()))
    into = flow.join(steps.select(pl.col("event").alias("consumer")), on="consumer")
    assert into.height >= 12
    assert set(into.select("producer", "consumer").iter_rows()) <= exact


@pytest.mark.parametrize("name", ["gpt2_train_ce", "tp_train"])
def test_no_backward_op_reads_a_stored_gradient(name: str) -> None:
    """A norm's backward takes the parameter for its weight and bias, not `param.grad`."""
    flow, _ = _edges(name)
    trace = corpus_trace(name)
    stored = stored_gradients(trace.dataflow_ops, trace.ops)
    read = flow.filter(pl.col("producer").is_in(stored["event"].implode()))
    assert read.height > 0
    assert read["consumer_name"].unique().to_list() == ["aten::add_"]


@pytest.mark.parametrize("name", ["tp_block", "tp_train"])
def test_bias_gelu_products_read_x_and_its_multiples(name: str) -> None:
    """`x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))`: every edge into its
    nine ops is the ET's (the three scalar multiples were read as a chain)."""
    flow, exact = _edges(name)
    gelu = flow.filter(pl.col("evidence") == "shape+bias-gelu")
    assert gelu.height == 16  # two layers, 8 reads each
    assert set(gelu.select("producer", "consumer").iter_rows()) <= exact
