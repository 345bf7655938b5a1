"""TQ106 unfused-attention on recorded eager attention: transformers' `attn_implementation=
"eager"` corpus entries (BERT, ViT, CLIP, GPT-2, LLaMA and a GPT-2 training step; Kineto + ET,
`fixtures/record_corpus.py`) and a hand-written attention recorded here with torch.

Numbers are recomputed from the raw trace JSON (`Input Dims` / `Input type` of the ops a
finding names), not from traceq's frames; data flow is checked against the Execution
Trace's tensor ids (the same findings on exact data flow as on inferred).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import corpus_et, corpus_paths, corpus_trace, read_json

import traceq
from traceq.relations.dataflow import dataflow
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.finding import Finding

EAGER = ("bert_eager", "vit_eager", "clip_eager", "gpt2_eager", "llama_eager", "gpt2_train_ce")
ITEMSIZE = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8}


def _tq106(trace: traceq.Trace) -> list[Finding]:
    return run(trace, Config(select=["TQ106"])).findings


@cache
def _raw(name: str) -> list[dict[str, Any]]:
    return read_json(corpus_paths(name)[0])["traceEvents"]


def _names(name: str, finding: Finding) -> list[str]:
    raw = _raw(name)
    return [raw[e]["name"] for e in finding.ops]


def _input_bytes(event: dict[str, Any], index: int = 0) -> int:
    dims = event["args"]["Input Dims"][index]
    return math.prod(dims) * ITEMSIZE[event["args"]["Input type"][index]]


@pytest.mark.parametrize("name", EAGER)
def test_finds_every_eager_attention_site_of_the_model(name: str) -> None:
    """Every softmax of the recorded forward (one per layer and tower) is in a finding,
    between the two matmuls that write its input and read its output."""
    findings = [f for f in _tq106(corpus_trace(name)) if f.evidence["direction"] == "forward"]
    raw = _raw(name)
    softmaxes = {
        i
        for i, e in enumerate(raw)
        if e.get("name") == "aten::softmax" and len(e["args"]["Input Dims"][0]) == 4
    }
    found = {e for f in findings for e in f.ops if raw[e]["name"] == "aten::softmax"}
    assert found == softmaxes
    for f in findings:
        names = _names(name, f)
        assert names.count("aten::matmul") == 2 * f.evidence["sites"]
        assert f.evidence["layers"] == f.evidence["sites"]  # one attention per layer


def test_one_finding_per_repeated_site_with_bytes_from_the_raw_shapes() -> None:
    """BERT's two layers are one finding; the score matrix's bytes are the softmax input's
    `Input Dims` × its dtype's size, and four such matrices (scores, scaled, masked,
    probabilities) are each written and read once per site."""
    (f,) = _tq106(corpus_trace("bert_eager"))
    raw = _raw("bert_eager")
    softmax = next(raw[e] for e in f.ops if raw[e]["name"] == "aten::softmax")
    score = _input_bytes(softmax)
    assert score == 2 * 4 * 12 * 12 * 4
    assert f.evidence["score_bytes"] == score
    assert f.evidence["sites"] == 2 and f.evidence["layers"] == 2
    assert _names("bert_eager", f)[:5] == [
        "aten::matmul",
        "aten::mul",
        "aten::add",
        "aten::softmax",
        "aten::matmul",
    ]
    assert f.evidence["materialized_bytes"] == 2 * (4 * 2 * score)
    assert f.evidence["mask"] is True and f.evidence["dropout"] is False
    assert f.module and "BertSelfAttention" in f.module


def test_saving_is_bytes_and_launches_capped_at_the_removed_ops() -> None:
    trace = corpus_trace("bert_eager")
    analysis = run(trace, Config(select=["TQ106"]))
    (f,) = analysis.findings
    device = analysis.device
    raw = _raw("bert_eager")
    removed = [e for e in f.ops if raw[e]["name"] != "aten::matmul"]
    removed_us = sum(raw[e]["dur"] for e in removed)
    modelled = (
        f.evidence["materialized_bytes"] / (device.memory_bandwidth_gbs * 1e3)
        + f.evidence["removed_launches"] * device.launch_overhead_us
    )
    assert f.evidence["removed_launches"] == 2 * 4  # mul, add, softmax and one GEMM per site
    assert f.est_saving_us == pytest.approx(min(modelled, removed_us), rel=1e-3)
    assert f.est_saving_us <= f.time_us


def test_fix_names_sdpa_the_transformers_switch_and_the_mask_caveat() -> None:
    (f,) = _tq106(corpus_trace("bert_eager"))
    assert "F.scaled_dot_product_attention(" in f.fix
    assert 'attn_implementation="sdpa"' in f.fix
    assert "flash_attn_func" in f.fix
    assert "is_causal=True" in f.fix and "math kernel" in f.fix


def test_training_step_has_a_forward_and_a_backward_site() -> None:
    """GPT-2 under bf16 autocast, training: dropout runs (`native_dropout`), softmax upcasts
    and casts back; the backward pass writes dP and dS between `bmm`s."""
    findings = _tq106(corpus_trace("gpt2_train_ce"))
    by_direction = {f.evidence["direction"]: f for f in findings}
    assert set(by_direction) == {"forward", "backward"}
    forward, backward = by_direction["forward"], by_direction["backward"]
    assert forward.evidence["dropout"] is True
    assert "aten::dropout" in _names("gpt2_train_ce", forward)
    names = _names("gpt2_train_ce", backward)
    assert "aten::_softmax_backward_data" in names
    assert names[0] == "aten::bmm" and names[-1] == "aten::bmm"
    raw = _raw("gpt2_train_ce")
    softmax_bw = next(raw[e] for e in backward.ops if raw[e]["name"].endswith("backward_data"))
    # dP arrives in bf16 (autocast), cast to fp32 for the softmax backward
    assert softmax_bw["args"]["Input type"][0] == "float"
    assert backward.evidence["score_bytes"] == 2 * 2 * 12 * 12 * 2


@pytest.mark.parametrize("name", ["bert", "vit", "clip", "llama", "gpt2"])
def test_sdpa_models_are_not_flagged(name: str) -> None:
    """The same architectures with transformers' default SDPA attention."""
    assert _tq106(corpus_trace(name)) == []


@pytest.mark.parametrize("name", EAGER)
def test_same_findings_on_execution_trace_data_flow(name: str) -> None:
    inferred = {frozenset(f.ops) for f in _tq106(corpus_trace(name))}
    trace = traceq.load(corpus_paths(name)[0])
    trace.__dict__["dataflow"] = dataflow(
        trace, trace.dataflow_ops, execution_trace=corpus_et(name)
    )
    exact = {frozenset(f.ops) for f in _tq106(trace)}
    assert inferred and inferred == exact


def _hand_written(tmp_path: Path) -> Path:
    """`q @ k.transpose(-1, -2) / sqrt(d)`, `masked_fill`, softmax, training dropout, `@ v`."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    class Attention(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(mask, float("-inf"))
            probs = torch.nn.functional.dropout(scores.softmax(-1), p=0.1, training=True)
            return probs @ v

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    mask = torch.ones(16, 16, dtype=torch.bool).triu(1)
    model = Attention()
    model(q, k, v, mask)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_modules=True) as p:
        model(q, k, v, mask)
    path = tmp_path / "attention.pt.trace.json"
    p.export_chrome_trace(str(path))
    return path


def test_hand_written_attention_without_transformers(tmp_path: Path) -> None:
    path = _hand_written(tmp_path)
    (f,) = _tq106(traceq.load(path))
    raw = read_json(path)["traceEvents"]
    names = [raw[e]["name"] for e in f.ops]
    assert names == [
        "aten::matmul",
        "aten::div",
        "aten::masked_fill",
        "aten::softmax",
        "aten::dropout",
        "aten::matmul",
    ]
    assert f.evidence["score_bytes"] == 2 * 4 * 16 * 16 * 4
    assert f.evidence["dropout"] is True and f.evidence["mask"] is True
    assert "attn_implementation" not in f.fix
    assert "dropout" in f.fix
