"""A training step's backward and optimizer read as PyTorch writes them, against the
Execution Trace (`readers/foreach_adam.py`, `readers/saved_operands.py`,
`readers/bias_gelu_backward.py`)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace

from traceq.relations.dataflow.execution_trace import ground_truth


def _read(name: str, evidence: str) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(inferred pairs resting on `evidence`, exact pairs) of a corpus entry."""
    trace = corpus_trace(name)
    exact, _ = ground_truth(trace, corpus_et(name), trace.dataflow_ops)
    read = trace.dataflow.filter(pl.col("evidence") == evidence)
    return set(read.select("producer", "consumer").iter_rows()), set(
        exact.select("producer", "consumer").iter_rows()
    )


def test_multi_tensor_adam_reads_its_lists_as_written() -> None:
    """`Adam(foreach=True)`: the gradients, moments, parameters and denominators are lists
    of one list of shapes, and no list argument got an edge. The ET's 47 are read: the
    stored gradients into `lerp_` and `addcmul_`, the steps into each `item`, the
    denominator's chain into `addcdiv_`."""
    read, exact = _read("cnn_train", "list+foreach-adam")
    trace = corpus_trace("cnn_train")
    names = dict(trace.dataflow_ops.select("event", "name").iter_rows())
    optimizer = {
        pair
        for pair in exact
        if names[pair[1]].startswith("aten::_foreach_") or names[pair[1]] == "aten::item"
    }
    assert len(optimizer) == 47
    assert read == optimizer


@pytest.mark.parametrize("name", ["cnn_train", "gpt2_train_ce", "tp_train", "ddp_train"])
def test_gemm_backward_reads_the_saved_operands(name: str) -> None:
    """`grad @ mat2.t()`, `grad.t() @ mat1`, `self.transpose(1, 2).bmm(grad)`: a saved
    operand is the forward GEMM's input, or what the forward op made of it (`linear`'s
    `weight.t()`, an autocast copy); shape and order gave these reads the backward's
    most recent value of the shape, or nothing."""
    read, exact = _read(name, "shape+saved-operand")
    assert len(read) >= 4
    assert read <= exact


def test_bias_gelu_backward_reads_as_written() -> None:
    """Megatron's `bias_gelu_back`: 19 ops of one shape read as a chain; the ET's 26 reads
    per layer (`x`, `tanh_out` and the multiples of `x` read many times, `bias + y` the
    saved `y`, `ff * g` the gradient) are made."""
    read, exact = _read("tp_train", "shape+bias-gelu-backward")
    assert len(read) == 2 * 26  # two layers
    assert read <= exact
