"""A training step's backward and optimizer read as PyTorch writes them, against the
Execution Trace (`readers/foreach_adam.py`, `readers/saved_operands.py`,
`readers/bias_gelu_backward.py`, `readers/parameter_order.py`,
`readers/saved_inputs.py`)."""

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


def test_sgd_steps_read_their_own_gradients_in_parameters_order() -> None:
    """`tp_train`'s layer registers its row-parallel biases itself and its LayerNorms as
    submodules: `parameters()` yields both biases before both norms' weights and biases,
    although the forward uses them interleaved. Each `[hidden]` step read another
    parameter's gradient (12 of 24 wrong); ordered by module (own parameters first), each
    of the 24 steps reads its own (`readers/parameter_order.py`)."""
    read, exact = _read("tp_train", "shape+optimizer-step")
    assert len(read) == 24
    assert read <= exact


@pytest.mark.parametrize("name", ["gpt2_train_ce", "tp_train", "cnn_train"])
def test_norm_and_product_backward_read_the_gradient_then_the_saved_input(name: str) -> None:
    """`native_layer_norm_backward(grad, input, ...)`, `native_batch_norm_backward(grad,
    input, ...)`, dropout's `grad * mask`: slot 0 took an older value of the backward (the
    previous norm's backward), slot 1 the gradient, and the saved input was missed
    (`readers/saved_inputs.py`)."""
    read, exact = _read(name, "shape+saved-input")
    assert len(read) >= 4
    assert read <= exact
    trace = corpus_trace(name)
    norms = trace.dataflow_ops.filter(
        pl.col("name").is_in(
            ["aten::native_layer_norm_backward", "aten::native_batch_norm_backward"]
        )
    )["event"]
    into = trace.dataflow.filter(pl.col("consumer").is_in(norms.implode()))
    assert set(into.select("producer", "consumer").iter_rows()) <= exact


@pytest.mark.parametrize("name", ["cnn_train", "tp_train", "gpt2_train_ce"])
def test_softmax_backward_reads_the_gradient_in_slot_zero(name: str) -> None:
    """`_softmax_backward_data(grad, output, ...)` and its log twin: the gradient (the newer
    value) in slot 0, as the ET has it; the older value in slot 1 only when a softmax made
    it. Shape and order had them the other way round (`cnn_train`: the logits' `linear` in
    slot 0; `tp_train`: another layer's backward `reshape`)."""
    trace = corpus_trace(name)
    truth, _ = ground_truth(trace, corpus_et(name), trace.dataflow_ops)
    ops = trace.dataflow_ops
    backward = ops.filter(pl.col("name").str.contains("softmax_backward_data"))["event"]
    assert backward.len() > 0
    inferred = trace.dataflow.filter(
        pl.col("consumer").is_in(backward.implode()) & pl.col("input_index").is_in([0, 1])
    )
    exact = {
        (p, c, i) for p, c, i in truth.select("producer", "consumer", "input_index").iter_rows()
    }
    slot_zero = {
        r for r in inferred.select("producer", "consumer", "input_index").iter_rows() if r[2] == 0
    }
    assert slot_zero and slot_zero <= exact
    names = dict(ops.select("event", "name").iter_rows())
    slot_one = inferred.filter(pl.col("input_index") == 1)["producer"].to_list()
    assert all("softmax" in names[p] for p in slot_one)
