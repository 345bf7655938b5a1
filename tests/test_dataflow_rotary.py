"""Rotary embeddings of `q` and `k` of one shape (`relations/rotary.py`), against the ET.

`llama_mha` is LLaMA with as many KV heads as heads, as in Qwen1.5-0.5B or LLaMA-7B: `q`
and `k` share a shape, so by shape and order `k * cos` read `q_embed` and `rotate_half`'s
slices read `q * cos` or `q` (10 wrong edges, and TQ104's 4 rotary chains wrong). The
edges into the rotary ops are checked against the Execution Trace's tensor ids; the first
two tests fail on the code before `rotary.py`. The Qwen1.5 H100 trace in ../shared, which
has the same rotary and no ET, gets its 48 `q * cos + rotate_half(q) * sin` chains, read
from its own ops.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import SHARED_TRACES, corpus_et, corpus_paths, corpus_trace

import traceq
from traceq.relations.dataflow import dataflow
from traceq.relations.dataflow.execution_trace import tensor_edges
from traceq.rules.config import Config
from traceq.rules.engine import run

ENTRY = "llama_mha"
ROTARY = ("aten::mul", "aten::slice", "aten::neg", "aten::cat", "aten::add")


def _pairs(frame: pl.DataFrame) -> set[tuple[int, int]]:
    return set(frame.select("producer", "consumer").iter_rows())


def _rotary_ops(trace: traceq.Trace) -> pl.Series:
    """The attention's rotary ops: every mul/slice/neg/cat/add of shape [B, H, T, D]."""
    ops = trace.dataflow_ops
    return ops.filter(
        pl.col("module").str.contains("Attention")
        & pl.col("name").is_in(ROTARY)
        & (pl.col("output_shape").list.len() == 4)
    )["event"]


def test_rotary_edges_of_q_and_k_of_one_shape_are_the_ets() -> None:
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    rotary = _rotary_ops(trace)
    assert rotary.len() >= 2 * 2 * 7  # 2 layers, q and k, 7 ops each
    exact = _pairs(tensor_edges(trace, et).filter(pl.col("consumer").is_in(rotary.implode())))
    inferred = _pairs(trace.dataflow.filter(pl.col("consumer").is_in(rotary.implode())))
    assert len(exact) >= 2 * 2 * 9
    assert inferred == exact


def test_tq104_rotary_chains_are_the_ets_with_q_and_k_of_one_shape() -> None:
    got = {frozenset(f.ops) for f in run(corpus_trace(ENTRY), Config(select=["TQ104"])).findings}
    exact_trace = traceq.load(corpus_paths(ENTRY)[0])
    exact_trace.__dict__["dataflow"] = dataflow(
        exact_trace, exact_trace.dataflow_ops, execution_trace=corpus_et(ENTRY)
    )
    truth = {frozenset(f.ops) for f in run(exact_trace, Config(select=["TQ104"])).findings}
    assert len(truth) == 4  # q and k in each of the 2 layers
    assert got == truth


QWEN15 = SHARED_TRACES / "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@pytest.mark.skipif(not QWEN15.is_file(), reason="../shared/traces is not here")
def test_qwen15_rotary_reads_q_then_k() -> None:
    """TraceLens's Qwen1.5-0.5B H100 trace (MIT): in each attention call, `q * cos` reads
    the first of the three projections' transposes and `k * cos` the second (the order
    `q_proj`, `k_proj`, `v_proj` ran in), and each `rotate_half`'s slices read that same
    transpose, checked from the trace's own ops."""
    trace = traceq.load(QWEN15)
    ops = trace.dataflow_ops.filter(pl.col("module").str.contains("Attention"))
    edges = trace.dataflow
    checked = 0
    for _call, call in ops.group_by(pl.col("module"), maintain_order=True):

        def named(name: str, call: pl.DataFrame = call) -> list[int]:
            return call.filter(pl.col("name") == name).sort("event")["event"].to_list()

        transposes, muls, slices = (
            named("aten::transpose")[:3],
            named("aten::mul"),
            named("aten::slice"),
        )
        if len(transposes) < 3 or len(muls) < 4 or len(slices) < 4:
            continue
        reads = dict(
            edges.filter(pl.col("input_index") == 0).select("consumer", "producer").iter_rows()
        )
        q, k = transposes[0], transposes[1]
        assert reads[muls[0]] == q and reads[muls[2]] == k
        assert [reads[s] for s in slices[:4]] == [q, q, k, k]
        checked += 1
    assert checked == 24
