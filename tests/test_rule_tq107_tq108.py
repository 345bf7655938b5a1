"""TQ107 unfused-norm and TQ108 unfused-rotary: written-out RMSNorm / LayerNorm / RoPE
found on data flow, the same on inferred and on exact (Execution Trace) data flow, and
one problem reported as one finding: TQ104 no longer reports their fragments, and every
call site of one idiom is one group.

Byte counts are recomputed here from the ops' recorded `Input Dims`, in closed form, not
by the rule's own helpers.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import REPO_ROOT
from conftest import corpus_et as model_corpus_et
from conftest import corpus_paths as model_corpus_paths
from conftest import corpus_trace as model_corpus_trace

import traceq
from traceq.relations.dataflow import dataflow, load_execution_trace
from traceq.reports.model import group_findings, layer_count
from traceq.rules.base import Rule
from traceq.rules.config import Config
from traceq.rules.engine import RuleSet, run
from traceq.rules.finding import Finding
from traceq.rules.tq104_pointwise_chain import chain_computes

QWEN_H100 = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
IDIOMS = ("TQ107", "TQ108")
#: Hand-written idioms (`fixtures/record_corpus.py`, `IDIOMS`), recorded apart from the
#: model corpus whose data-flow floors `test_dataflow_corpus` holds.
IDIOM_CORPUS = REPO_ROOT / "fixtures" / "corpus_idioms"


def corpus_paths(name: str) -> tuple[Path, Path]:
    if not name.startswith("written_out"):
        return model_corpus_paths(name)
    kineto, et = IDIOM_CORPUS / f"{name}.pt.trace.json.gz", IDIOM_CORPUS / f"{name}.et.json.gz"
    if not (kineto.is_file() and et.is_file()):
        pytest.skip(f"idiom corpus entry {name} is not recorded")
    return kineto, et


@cache
def corpus_trace(name: str) -> traceq.Trace:
    if not name.startswith("written_out"):
        return model_corpus_trace(name)
    return traceq.load(corpus_paths(name)[0], execution_trace=False)


@cache
def corpus_et(name: str) -> pl.DataFrame:
    if not name.startswith("written_out"):
        return model_corpus_et(name)
    return load_execution_trace(corpus_paths(name)[1])


def _findings(trace: traceq.Trace, *codes: str) -> list[Finding]:
    return run(trace, Config(select=list(codes))).findings


@cache
def _keys(name: str, exact: bool) -> frozenset[tuple[str, frozenset[int]]]:
    if exact:
        trace = traceq.load(corpus_paths(name)[0])
        trace.__dict__["dataflow"] = dataflow(
            trace, trace.dataflow_ops, execution_trace=corpus_et(name)
        )
    else:
        trace = corpus_trace(name)
    return frozenset((f.rule, frozenset(f.ops)) for f in _findings(trace, *IDIOMS))


def _op(trace: traceq.Trace, event: int) -> dict[str, Any]:
    rows = trace.ops.filter(trace.ops["event"] == event).to_dicts()
    assert rows, event
    return rows[0]


# -- TQ107 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "t5", "written_out_fp32"])
def test_written_out_fp32_rmsnorm_is_found_in_every_layer(name: str) -> None:
    trace = corpus_trace(name)
    norms = [f for f in _findings(trace, "TQ107") if f.evidence["norm"] == "RMSNorm"]
    # two layers with two norms each, and the final norm (T5: encoder and decoder)
    assert len(norms) >= 5
    ops = trace.ops
    squares = ops.filter(
        (ops["name"] == "aten::pow") & ops["module"].str.contains("Norm").fill_null(False)
    )
    assert squares.height >= 5
    assert {e for f in norms for e in f.ops} >= set(squares["event"].to_list())


def test_fp32_rmsnorm_bytes_are_the_ops_recorded_tensors() -> None:
    """pow, mean, add(eps), rsqrt, mul, mul(weight) on x [.., H] fp32: recomputed from the
    pow's input dims and the weight's, one read of each input and one write per op."""
    trace = corpus_trace("llama")
    plain = [f for f in _findings(trace, "TQ107") if f.evidence["residual_add"] is None]
    assert plain
    for f in plain:
        names = [n.removeprefix("aten::") for n in f.evidence["op_names"]]
        assert names == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
        pow_op = _op(trace, f.ops[0])
        x = pow_op["shapes"][0]
        n, rows, hidden = math.prod(x), math.prod(x[:-1]), x[-1]
        weight_op = _op(trace, f.ops[-1])
        assert [hidden] in weight_op["shapes"]
        elements = (
            (2 * n) + (n + rows) + (2 * rows) + (2 * rows) + (2 * n + rows) + (2 * n + hidden)
        )
        assert f.evidence["unfused_bytes"] == 4 * elements
        assert f.evidence["fused_bytes"] == 4 * (2 * n + hidden)
        assert 0 < f.est_saving_us <= f.time_us


def test_residual_add_before_a_norm_joins_its_finding() -> None:
    trace = corpus_trace("llama")
    with_add = [f for f in _findings(trace, "TQ107") if f.evidence["residual_add"] is not None]
    assert with_add
    for f in with_add:
        add = _op(trace, f.evidence["residual_add"])
        assert add["name"] == "aten::add"
        assert add["shapes"][0] == add["shapes"][1] == f.shapes[0]
        assert f.ops[0] == add["event"]
        assert "fused_add_rms_norm" in f.fix


def test_written_out_layernorm_is_a_layernorm_with_its_mean_and_sub() -> None:
    trace = corpus_trace("written_out_layernorm")
    norms = [f for f in _findings(trace, "TQ107") if f.evidence["variant"] == "written out"]
    assert len(norms) == 5 and all(f.evidence["norm"] == "LayerNorm" for f in norms)
    for f in norms:
        names = [n.removeprefix("aten::") for n in f.evidence["op_names"]]
        assert names[-7:] == ["pow", "mean", "add", "sqrt", "div", "mul", "add"]
        assert {"mean", "sub"} <= set(names[:-7])
        assert "F.layer_norm" in f.fix or "functional.layer_norm" in f.fix


def test_an_add_before_a_fused_layer_norm_is_the_add_norm_variant() -> None:
    trace = corpus_trace("written_out_layernorm")
    (f,) = [f for f in _findings(trace, "TQ107") if f.evidence["variant"] == "add + norm"]
    add, norm = (_op(trace, e) for e in f.ops)
    assert (add["name"], norm["name"]) == ("aten::add", "aten::layer_norm")
    n, hidden = math.prod(add["shapes"][0]), add["shapes"][0][-1]
    # add: 2 reads + 1 write; layer_norm: x, weight, bias read, output written (fp32)
    assert f.evidence["unfused_bytes"] == 4 * (3 * n + 2 * n + 2 * hidden)
    # fused: both addends, weight and bias read once, the norm written once
    assert f.evidence["fused_bytes"] == 4 * (2 * n + 2 * hidden + n)


def test_bf16_rmsnorm_holds_hf_casts() -> None:
    trace = corpus_trace("written_out_bf16")
    norms = _findings(trace, "TQ107")
    assert len(norms) == 5
    for f in norms:
        names = [n.removeprefix("aten::") for n in f.evidence["op_names"]]
        core = names[1:] if f.evidence["residual_add"] is not None else names
        assert core == ["to", "pow", "mean", "add", "rsqrt", "mul", "to", "mul"]


# -- TQ108 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "qwen2", "written_out_fp32", "written_out_bf16"])
def test_rope_is_one_finding_per_attention_call_for_q_and_k(name: str) -> None:
    trace = corpus_trace(name)
    ropes = _findings(trace, "TQ108")
    assert len(ropes) == 2  # two layers
    negs = trace.ops.filter(trace.ops["name"] == "aten::neg")["event"].to_list()
    assert sorted(e for f in ropes for e in f.ops if e in negs) == sorted(negs)
    for f in ropes:
        assert f.evidence["tensors"] == 2
        assert "liger_rotary_pos_emb" in f.fix and "apply_rotary_emb" in f.fix


def test_rope_bytes_are_ten_passes_per_tensor_against_one_read_and_write() -> None:
    trace = corpus_trace("written_out_fp32")
    for f in _findings(trace, "TQ108"):
        expected_unfused = expected_fused = 0
        for rope in f.evidence["ropes"]:
            mul_cos = _op(trace, rope["mul_cos"])
            x, cos = mul_cos["shapes"]
            n, c = math.prod(x), math.prod(cos)
            # q*cos: x, cos, out; neg: half, half; cat: two halves, out; *sin: x, sin, out;
            # add: two, out
            expected_unfused += 4 * ((2 * n + c) + n + 2 * n + (2 * n + c) + 3 * n)
            expected_fused += 4 * (2 * n + 2 * c)
        assert f.evidence["unfused_bytes"] == expected_unfused
        assert f.evidence["fused_bytes"] == expected_fused


# -- inferred against exact data flow ---------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "llama",
        "qwen2",
        "t5",
        "gemma",
        "written_out_fp32",
        "written_out_bf16",
        "written_out_layernorm",
    ],
)
def test_idiom_findings_are_the_same_on_inferred_and_exact_dataflow(name: str) -> None:
    inferred, exact = _keys(name, exact=False), _keys(name, exact=True)
    assert inferred and inferred == exact


# -- one problem, one finding ---------------------------------------------------------------


def test_tq104_leaves_the_ops_an_idiom_explains() -> None:
    trace = corpus_trace("written_out_bf16")
    alone = _findings(trace, "TQ104")
    together = _findings(trace, "TQ104", "TQ107", "TQ108")
    explained = {e for f in together if f.rule in IDIOMS for e in f.ops}
    assert any(set(f.ops) & explained for f in alone)  # the fragments, without the idioms
    assert not any(set(f.ops) & explained for f in together if f.rule == "TQ104")


def _rule(code: str, ops: list[list[int]], **flags: bool) -> Rule:
    def check(ctx: Any) -> Any:
        for events in ops:
            yield ctx.finding(message=code, ops=events)

    return Rule(code, f"rule-{code.lower()}", "info", check, **flags)


def test_engine_drops_deferring_findings_whose_ops_are_all_explained() -> None:
    idiom = _rule("TQ901", [[1, 2, 3]], explains=True)
    generic = _rule("TQ902", [[1, 2], [2, 5]], defers=True)
    bystander = _rule("TQ903", [[1, 2]])
    # the deferring rule is listed first: the engine still runs the explaining one first
    ruleset = RuleSet(
        [generic, bystander, idiom], origin={"TQ901": "t", "TQ902": "t", "TQ903": "t"}
    )
    trace = corpus_trace("llama")
    found = run(trace, Config(), ruleset=ruleset).findings
    assert sorted((f.rule, tuple(f.ops)) for f in found) == [
        ("TQ901", (1, 2, 3)),
        ("TQ902", (2, 5)),
        ("TQ903", (1, 2)),
    ]


def test_an_idiom_at_every_site_is_one_group_with_sites_and_layers() -> None:
    trace = corpus_trace("llama")
    groups = [g for g in group_findings(_findings(trace, "TQ107")) if g.rule == "TQ107"]
    (group,) = groups  # input and post-attention norms of both layers, and the final norm
    assert group.count == 5
    assert "(5 sites in 2 layers)" in group.where


def test_layer_count_reads_indices_and_suffixes() -> None:
    assert layer_count(["m.layers.0.norm", "m.layers.1.norm", "m.norm"]) == 2
    assert layer_count(["M_0.Layer_0.Norm_0", "M_0.Layer_0.Norm_1", "M_0.Layer_1.Norm_2"]) == 2
    assert layer_count(["m.norm"]) == 0


@pytest.mark.parametrize(
    ("names", "computes"),
    [
        (["aten::mul", "aten::pow", "aten::mul", "aten::add", "aten::mul", "aten::tanh",
          "aten::add", "aten::mul"], "GELU-tanh written out"),
        (["aten::mul", "aten::sigmoid", "aten::mul"], "SiLU written out"),
        (["aten::mul", "aten::add"], "scaled residual add"),
        (["aten::exp", "aten::add", "aten::log"], None),
    ],
)  # fmt: skip
def test_tq104_names_what_a_chain_computes(names: list[str], computes: str | None) -> None:
    assert chain_computes(names, [1] * len(names))[0] == computes


def test_a_chain_of_two_products_summed_is_no_scaled_residual_add() -> None:
    # RoPE's half: q * cos and cat * sin both read by the add
    assert chain_computes(["aten::mul", "aten::mul", "aten::add"], [0, 0, 2])[0] is None


# -- the shared Qwen1.5 H100 trace -----------------------------------------------------------


@pytest.mark.shared
def test_qwen_rmsnorm_and_rope_are_one_group_each_and_tq104_fragments_are_gone(
    load_shared: Any,
) -> None:
    trace = load_shared(QWEN_H100)
    findings = traceq.analyze(trace)
    groups = group_findings(findings)
    norms = [g for g in groups if g.rule == "TQ107"]
    ropes = [g for g in groups if g.rule == "TQ108"]
    assert len(norms) == 1 and len(ropes) == 1
    (norm,), (rope,) = norms, ropes
    assert norm.count == 49  # 24 layers x 2, and the final norm
    assert "49 sites in 24 layers" in norm.where
    assert "F.rms_norm" in norm.first.fix or "functional.rms_norm" in norm.first.fix
    assert "fused_add_rms_norm" in norm.first.fix
    assert rope.count == 24 and "24 sites in 24 layers" in rope.where
    assert "liger_rotary_pos_emb" in rope.first.fix
    explained = {e for f in findings if f.rule in IDIOMS for e in f.ops}
    assert not [f for f in findings if f.rule == "TQ104" and set(f.ops) & explained]
    pointwise = [f for f in findings if f.rule == "TQ104"]
    assert len(pointwise) <= 1  # the rotary table's cos/sin, computed once
