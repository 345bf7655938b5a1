"""Backward ops of several gradients: each gradient is read (`shapes.gradient_outputs`,
`matching._with_more_outputs`, `readers/accumulated_gradients.py`).

`convolution_backward`, `native_batch_norm_backward` and `native_layer_norm_backward`
return the gradients of the input, the weight and the bias. With only the first output
(or none) known, the weight's and bias's gradients went unread and AccumulateGrad's
`detach` read the previous `detach` of its shape. Against the Execution Trace, every
edge out of those ops into a `detach` is now the recorded one.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.execution_trace import ground_truth

BACKWARD = [f"aten::{op}" for op in shapes.GRADIENT_OUTPUTS]

CONV_BACKWARD = (
    "[[4, 16, 8, 8], [4, 8, 8, 8], [16, 8, 3, 3], [], [], [], [], [], [], [], []]",
    ["", "", "", "[16]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[T]"],
)


@pytest.mark.parametrize(
    ("mask", "outputs"),
    [
        ("[True, True, True]", [[4, 8, 8, 8], [16, 8, 3, 3], [16]]),
        ("[False, True, True]", [[16, 8, 3, 3], [16]]),
        ("[True, True, False]", [[4, 8, 8, 8], [16, 8, 3, 3]]),
    ],
)
def test_convolution_backward_returns_the_gradients_its_mask_asks_for(
    mask: str, outputs: list[list[int]]
) -> None:
    dims, concrete = CONV_BACKWARD
    concrete = [*concrete[:-1], mask]
    sig = shapes.signature("aten::convolution_backward", dims, ["float"] * 3, concrete)
    assert sig.output == outputs[0]
    assert shapes.more_outputs("aten::convolution_backward", dims, concrete) == outputs[1:]


def test_batch_norm_backward_returns_per_channel_weight_and_bias_gradients() -> None:
    dims = "[[4, 16, 8, 8], [4, 16, 8, 8], [16], [16], [16], [16], [16], [], [], []]"
    concrete = [""] * 9 + ["[True, True, True]"]
    name = "aten::native_batch_norm_backward"
    assert shapes.signature(name, dims, ["float"] * 7, concrete).output == [4, 16, 8, 8]
    assert shapes.more_outputs(name, dims, concrete) == [[16], [16]]


def test_layer_norm_backward_returns_the_weight_and_bias_shapes() -> None:
    dims = "[[12, 2, 64], [12, 2, 64], [], [12, 2, 1], [12, 2, 1], [64], [64], []]"
    concrete = [""] * 7 + ["[True, True, True]"]
    name = "aten::native_layer_norm_backward"
    assert shapes.more_outputs(name, dims, concrete) == [[64], [64]]


def test_an_op_of_one_output_has_no_more() -> None:
    assert shapes.more_outputs("aten::add", "[[2, 3], [2, 3], []]", ["", "", "1"]) == []


@pytest.mark.parametrize("name", ["cnn_train", "tp_train", "gpt2_train_ce"])
def test_each_gradient_of_a_backward_op_is_read_by_its_detach(name: str) -> None:
    trace = corpus_trace(name)
    exact, matched = ground_truth(trace, corpus_et(name), trace.dataflow_ops)
    names = trace.dataflow_ops.select(pl.col("event").alias("consumer"), "name")
    detaches = names.filter(pl.col("name") == "aten::detach")["consumer"]
    backward = trace.dataflow_ops.filter(pl.col("name").is_in(BACKWARD))["event"]

    def into_detach(edges: pl.DataFrame) -> set[tuple[int, int]]:
        return set(
            edges.filter(
                pl.col("consumer").is_in(detaches.implode())
                & pl.col("consumer").is_in(matched.implode())
                & (
                    pl.col("producer").is_in(backward.implode())
                    | pl.col("producer").is_in(detaches.implode())
                )
            )
            .select("producer", "consumer")
            .iter_rows()
        )

    truth = into_detach(exact)
    assert len(truth) >= 4
    assert into_detach(trace.dataflow) == truth
