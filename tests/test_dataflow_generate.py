"""Data flow in `generate` loops (several decode steps, a KV cache), against the ET corpus.

A decode loop carries values from one step to the next: each attention layer's KV cache
(`keys = cat([keys, k])`) and `generate`'s own `input_ids` and position ids grow by a
`cat` per step whose past piece the same code made one step before (`loop_carried`).
GPT-2 makes q, k and v by one GEMM, split (`kv_cache`). And finished sequences are
kept at the pad token by a blend written out, `next * unfinished + pad * (1 - unfinished)`
(`blend`). The list ops' exact pieces come from the raw ET JSON
(`test_dataflow_lists._et_list_reads`); the blend's from the ET's tensor ids. Every
test here fails on the code before those three modules: no cache's past was read, GPT-2's
new k and v had no edge, and both blend reads were wrong in every step.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace
from test_dataflow_lists import _et_list_reads, _into_lists

from traceq.relations.dataflow.execution_trace import tensor_edges

GENERATE = ("gpt2_generate", "llama_generate")
STEPS = 4  # `max_new_tokens`: a prefill and three decode steps
LAYERS = 2


def _cats(name: str, inside_a_module: bool) -> pl.DataFrame:
    ops = corpus_trace(name).dataflow_ops.filter(pl.col("name") == "aten::cat")
    attention = pl.col("module").str.contains("Attention").fill_null(False)
    return ops.filter(attention if inside_a_module else pl.col("module").is_null())


def _reads(name: str, consumers: pl.DataFrame) -> tuple[dict, dict]:
    """(exact, inferred): the producers of each consumer's list pieces, by consumer."""
    edges = _into_lists(name)
    events = set(consumers["event"])
    exact = {
        consumer: {p for p, _ in elements if p is not None}
        for consumer, elements in _et_list_reads(name).items()
        if consumer in events
    }
    inferred = {c: set(edges.filter(pl.col("consumer") == c)["producer"]) for c in exact}
    return exact, inferred


@pytest.mark.parametrize("name", GENERATE)
def test_every_kv_cache_update_reads_its_past_and_its_new_k_or_v(name: str) -> None:
    """Each step's `cat([past, new])` per layer, keys and values: the past is the same
    layer's cat of the step before (none in the prefill: an empty cache), the new piece
    this step's k or v."""
    cats = _cats(name, inside_a_module=True)
    negs = set(corpus_trace(name).dataflow_ops.filter(pl.col("name") == "aten::neg")["event"])
    exact, inferred = _reads(name, cats)
    kv = {c: p for c, p in exact.items() if not p & negs}  # not rotate_half's cat
    assert len(kv) == STEPS * LAYERS * 2
    assert {c: inferred[c] for c in kv} == kv


def test_gpt2_cache_reads_k_and_v_split_from_one_gemm() -> None:
    """GPT-2's `c_attn` makes q, k and v of one shape, all unread when the cache is
    updated: the cache takes k and v, the attention q."""
    exact, inferred = _reads("gpt2", _cats("gpt2", inside_a_module=True))
    assert len(exact) == LAYERS * 2
    assert inferred == exact


@pytest.mark.parametrize("name", GENERATE)
def test_generates_tensors_grow_from_the_cat_of_the_step_before(name: str) -> None:
    """`input_ids = cat([input_ids, next])` and the position ids, once per step after the
    first: each reads the cat of the step before, the first the other first."""
    exact, inferred = _reads(name, _cats(name, inside_a_module=False))
    cats = set(_cats(name, inside_a_module=False)["event"])
    carried = {c: p for c, p in exact.items() if p & cats}
    assert len(carried) == (STEPS - 1) * 2
    assert {c: inferred[c] for c in carried} == carried


@pytest.mark.parametrize("name", GENERATE)
def test_pad_blend_reads_the_mask_and_the_first_product(name: str) -> None:
    """`next * unfinished + pad * (1 - unfinished)`: `1 - unfinished` reads the mask, not
    the product just made, and the sum reads the product, in every step."""
    trace = corpus_trace(name)
    ops = trace.dataflow_ops
    rsubs = ops.filter((pl.col("name") == "aten::rsub") & pl.col("module").is_null())["event"]
    exact = tensor_edges(trace, corpus_et(name))
    products = exact.filter(pl.col("consumer").is_in(rsubs.implode()))
    # the sums: the adds reading a product of a rsub
    second = exact.filter(pl.col("producer").is_in(rsubs.implode()))["consumer"]
    sums = exact.filter(pl.col("producer").is_in(second.implode()))["consumer"]
    blend = pl.concat([rsubs, sums]).implode()
    assert rsubs.len() == STEPS and products.height == STEPS

    def pairs(edges: pl.DataFrame) -> set[tuple[int, int]]:
        into = edges.filter(pl.col("consumer").is_in(blend))
        return set(into.select("producer", "consumer").iter_rows())

    assert pairs(trace.dataflow) == pairs(exact)
