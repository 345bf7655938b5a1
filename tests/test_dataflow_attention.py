"""Written-out attention reads its key and value (`readers/attention_operands.py`).

`scores = q @ k.transpose(-1, -2)`, `softmax`, `probs @ v`: q, k and v have one shape, and
by shape and order the key's transpose took `v` (the most recent) and the second product
took `q`. Against the Execution Trace, every edge into the key's transpose and the two
products is the recorded one (before the reader: 2 of 4 wrong per layer, each entry).
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace

from traceq.relations.dataflow.execution_trace import ground_truth
from traceq.relations.dataflow.readers.attention_operands import PRODUCTS, TRANSPOSES

ATTENTION = [f"aten::{op}" for op in PRODUCTS] + [f"aten::{op}" for op in TRANSPOSES]


def _into_attention(edges: pl.DataFrame) -> set[tuple[int, int]]:
    return set(
        edges.filter(pl.col("consumer_name").is_in(ATTENTION))
        .select("producer", "consumer")
        .iter_rows()
    )


@pytest.mark.parametrize(
    ("name", "module"),
    [("vit_eager", "ViTAttention"), ("bert_eager", "Attention"), ("tp_block", "Layer")],
)
def test_attention_reads_its_key_and_value(name: str, module: str) -> None:
    trace = corpus_trace(name)
    exact, matched = ground_truth(trace, corpus_et(name), trace.dataflow_ops)
    calls = trace.dataflow_ops.filter(pl.col("module").str.contains(module))["event"]
    inferred = trace.dataflow.filter(
        pl.col("consumer").is_in(matched.implode()) & pl.col("consumer").is_in(calls.implode())
    )
    exact = exact.filter(pl.col("consumer").is_in(calls.implode()))
    got, truth = _into_attention(inferred), _into_attention(exact)
    assert len(truth) >= 8
    assert got == truth
    moved = inferred.filter(pl.col("evidence").str.contains("attention-operands"))
    assert moved.height >= 2
