"""The fusion rules' precision on the Execution Trace corpus: every finding made on inferred
data flow is one the same rule makes on exact (tensor-id) data flow.

`fixtures/corpus/` (`fixtures/record_corpus.py`, docs/dataflow_accuracy.md) pairs each
Kineto trace with an Execution Trace of the same run. A rule run twice, once on the edges
`dataflow` infers and once on the ET's, must agree: a finding only the inferred run makes
rests on an edge the model does not have. Each test here names the case that made a rule
wrong (it fails on the rule before its fix) and checks it against the ET run, not against
counts written down.
"""

from __future__ import annotations

from functools import cache

import polars as pl
import pytest
from conftest import CORPUS, corpus_et, corpus_paths, corpus_trace

import traceq
from traceq.relations.dataflow import dataflow
from traceq.relations.dataflow.execution_trace import tensor_edges
from traceq.rules.config import Config
from traceq.rules.engine import run

FUSION = ("TQ101", "TQ102", "TQ103", "TQ104", "TQ105")
ENTRIES = sorted(p.name.removesuffix(".et.json.gz") for p in CORPUS.glob("*.et.json.gz"))

Keys = set[tuple[str, frozenset[int]]]


def _keys(trace: traceq.Trace, *codes: str) -> Keys:
    findings = run(trace, Config(select=list(codes or FUSION))).findings
    return {(f.rule, frozenset(f.ops)) for f in findings}


@cache
def _inferred(name: str) -> Keys:
    return _keys(corpus_trace(name))


@cache
def _exact(name: str) -> Keys:
    trace = traceq.load(corpus_paths(name)[0])
    trace.__dict__["dataflow"] = dataflow(
        trace, trace.dataflow_ops, execution_trace=corpus_et(name)
    )
    return _keys(trace)


def _by_rule(keys: Keys, code: str) -> set[frozenset[int]]:
    return {ops for rule, ops in keys if rule == code}


def _x_producer(name: str, gemm: int) -> int | None:
    """The op that wrote a GEMM's activation operand, by tensor id (the ET)."""
    trace = corpus_trace(name)
    exact = tensor_edges(trace, corpus_et(name), trace.dataflow_ops)
    into = exact.filter((pl.col("consumer") == gemm) & (pl.col("input_index") == 0))
    return into["producer"].item() if into.height == 1 else None


@pytest.mark.skipif(not ENTRIES, reason="the Execution Trace corpus is not recorded")
@pytest.mark.parametrize("name", ENTRIES)
def test_every_fusion_finding_on_inferred_flow_is_one_the_et_makes(name: str) -> None:
    """Precision 1.0 per entry (benchmarks/dataflow_accuracy.py measures it over the corpus;
    before these fixes 15 findings failed: clip, llama_compiled x2, t5, and 11 TQ104 chains
    in dit and unet)."""
    assert _inferred(name) - _exact(name) == set()


def test_tq105_does_not_group_clip_text_and_vision_projections() -> None:
    """CLIP's visual projection (on the vision tower's pooled [2, 64]) and its text
    projection (on the text tower's, 300 ops later) read two different values of one shape.
    Data flow gave both the vision LayerNorm as producer (the text value comes from an
    `index` whose output shape opshapes cannot derive); the GEMMs of one group must run
    together, so this pair is no group."""
    trace = corpus_trace("clip")
    linears = trace.dataflow_ops.filter(
        (pl.col("name") == "aten::linear") & pl.col("module").str.contains(r"^CLIPModel_0\.Linear_")
    )["event"].to_list()
    assert len(linears) == 2
    visual, text = linears
    assert _x_producer("clip", visual) != _x_producer("clip", text)  # the ET: two inputs
    assert not any({visual, text} <= ops for ops in _by_rule(_inferred("clip"), "TQ105"))
    assert _by_rule(_inferred("clip"), "TQ105") == _by_rule(_exact("clip"), "TQ105")


def test_tq105_leaves_extern_gemms_fed_by_inductor_kernels_alone() -> None:
    """torch.compile'd LLaMA: each extern `mm` reads a buffer an Inductor C++ kernel wrote,
    and those kernels record no shapes; data flow matched the GEMMs to a kernel (or to the
    attention op) by element count, so two GEMMs fed by two kernels shared a "producer"
    (the old rule grouped q with nothing and k/v, o/gate/up wrongly). With no shape-matched
    producer the input is unknown: no group."""
    trace = corpus_trace("llama_compiled")
    ops = trace.dataflow_ops
    extern = ops.filter((pl.col("name") == "aten::mm") & pl.col("compiled"))
    assert extern.height >= 7  # q, k, v, o, gate, up, down of one layer (and the lm head)
    assert ops.filter(pl.col("compiled") & pl.col("output_shape").is_null()).height >= 5
    found = _by_rule(_inferred("llama_compiled"), "TQ105")
    assert found <= _by_rule(_exact("llama_compiled"), "TQ105")
    assert found == set()


def test_tq104_leaves_t5_relative_position_buckets_alone() -> None:
    """T5's `_relative_position_bucket` computes on [q, k] grids of long ints:
    `buckets = (rel > 0).long() * n + 0; rel = abs(rel)`. Shape matching read `abs` as
    reading the bucket sum (the most recent [12, 12] long value), a `mul -> add -> abs`
    chain; the ET has `abs(sub)`. Integer-only chains (index arithmetic) are no TQ104
    finding; the float part of the buckets (`div -> log -> div -> mul`) still is."""
    trace = corpus_trace("t5")
    ops = trace.dataflow_ops.select("event", "name")
    abs_ops = ops.filter(pl.col("name") == "aten::abs")["event"].to_list()
    assert abs_ops
    exact = tensor_edges(trace, corpus_et("t5"), trace.dataflow_ops)
    names = dict(ops.iter_rows())
    for op in abs_ops:  # the ET: abs reads the sub (relative_position), not an add
        producers = exact.filter(pl.col("consumer") == op)["producer"].to_list()
        assert [names[p] for p in producers] == ["aten::sub"]
    chains = _by_rule(_inferred("t5"), "TQ104")
    assert not any(ops_ & set(abs_ops) for ops_ in chains)
    assert chains and chains <= _by_rule(_exact("t5"), "TQ104")
    float_chain = [names[e] for e in sorted(min(chains, key=min))]
    assert float_chain == ["aten::div", "aten::log", "aten::div", "aten::mul"]
