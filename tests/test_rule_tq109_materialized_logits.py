"""TQ109 materialized-logits on a recorded LM training step: GPT-2's real vocabulary (50257)
with a tiny body under CPU bf16 autocast (`gpt2_train_ce` in `fixtures/record_corpus.py`):
the LM head writes bf16 logits, `.float()` copies them, `cross_entropy` reads the copy, and
backward writes their gradient. Bytes are recomputed from the raw JSON's `Input Dims` and
`Input type`; data flow is checked against the Execution Trace.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import pytest
from conftest import corpus_et, corpus_paths, corpus_trace, read_json

import traceq
from traceq.relations.dataflow import dataflow
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.finding import Finding

ITEMSIZE = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2}


def _tq109(trace: traceq.Trace, **options: Any) -> list[Finding]:
    config = Config(select=["TQ109"], rules={"TQ109": options} if options else {})
    return run(trace, config).findings


@cache
def _raw() -> list[dict[str, Any]]:
    return read_json(corpus_paths("gpt2_train_ce")[0])["traceEvents"]


def _bytes(event: dict[str, Any], index: int = 0) -> int:
    args = event["args"]
    return math.prod(args["Input Dims"][index]) * ITEMSIZE[args["Input type"][index]]


def test_lm_head_logits_upcast_and_loss_are_one_finding() -> None:
    (f,) = _tq109(corpus_trace("gpt2_train_ce"))
    raw = _raw()
    names = [raw[e]["name"] for e in f.ops]
    assert names[0] == "aten::linear" and "aten::cross_entropy_loss" in names
    assert "aten::to" in names  # the upcast
    assert f.evidence["vocab"] == 50257
    cast = raw[f.evidence["casts"][0]]
    loss = raw[f.evidence["loss"]]
    # the logits as the cast reads them (bf16), the fp32 copy as the loss reads it
    assert f.evidence["logits_bytes"] == _bytes(cast) == 2 * 12 * 50257 * 2
    assert f.evidence["fp32_copy_bytes"] == _bytes(loss) == 2 * 12 * 50257 * 4


def test_backward_gradient_of_the_logits_is_counted() -> None:
    (f,) = _tq109(corpus_trace("gpt2_train_ce"))
    raw = _raw()
    backward = [raw[e]["name"] for e in f.evidence["backward_ops"]]
    assert sorted(backward) == ["aten::_log_softmax_backward_data", "aten::nll_loss_backward"]
    logits = 2 * 12 * 50257
    # bf16 logits + fp32 copy + fp32 log-probabilities + two fp32 gradients
    assert f.evidence["materialized_bytes"] == logits * (2 + 4 + 4 + 4 + 4)
    assert 0 < f.est_saving_us <= f.time_us


def test_fix_names_liger_chunking_and_compile() -> None:
    (f,) = _tq109(corpus_trace("gpt2_train_ce"))
    assert "LigerFusedLinearCrossEntropyLoss" in f.fix and "0.3" in f.fix
    assert "chunk" in f.fix and "torch.compile" in f.fix


def test_small_vocabulary_is_left_alone_unless_a_table_has_that_many_rows() -> None:
    """`min_vocab` above GPT-2's 50257 and no embedding of that size: nothing. The model's
    token embedding is [50257, 32], so a vocabulary equal to it is still found."""
    trace = corpus_trace("gpt2_train_ce")
    assert len(_tq109(trace, min_vocab=10**6)) == 1  # the tied embedding table's rows
    assert _tq109(corpus_trace("gpt2")) == []  # inference: no loss


@pytest.mark.parametrize("name", ["gpt2_train_ce", "ddp_train"])
def test_same_findings_on_execution_trace_data_flow(name: str) -> None:
    inferred = {frozenset(f.ops) for f in _tq109(corpus_trace(name))}
    trace = traceq.load(corpus_paths(name)[0])
    trace.__dict__["dataflow"] = dataflow(
        trace, trace.dataflow_ops, execution_trace=corpus_et(name)
    )
    assert inferred == {frozenset(f.ops) for f in _tq109(trace)}
