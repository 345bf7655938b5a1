"""Fewer wrong inferred edges (issue 10, edge precision): each rule against the ET corpus.

Every test reads the corpus' Execution Traces (`fixtures/corpus/`, recorded together with
their Kineto traces by `fixtures/record_corpus.py`) and checks inferred edges against what
the ET recorded: tensor ids (`tensor_edges`) or, read straight from the raw ET JSON, the
dtypes of the tensors an op read and wrote. Each test fails on the code before its fix.
"""

from __future__ import annotations

import gzip
import json
from functools import cache

import polars as pl
import pytest
from conftest import corpus_et, corpus_paths, corpus_trace

import traceq
from traceq.relations.dataflow.execution_trace import match_ops, tensor_edges


@cache
def _raw_nodes(name: str) -> dict[int, dict]:
    """The raw ET JSON's nodes by id (read here, not through traceq's ET loader)."""
    with gzip.open(corpus_paths(name)[1], "rt") as f:
        return {int(node["id"]): node for node in json.load(f)["nodes"]}


def _exact_pairs(name: str) -> set[tuple[int, int]]:
    exact = tensor_edges(corpus_trace(name), corpus_et(name))
    return set(exact.select("producer", "consumer").iter_rows())


# -- a float result is never read as an integer -------------------------------------------

INTEGER = ("Tensor(long int)", "Tensor(int)", "Tensor(bool)")


def _float_into_integer(name: str) -> tuple[int, list[tuple[int, int, str, str]]]:
    """(inferred edges into an ET-recorded integer argument, those whose producer wrote
    only float tensors), by the raw ET's recorded types."""
    trace, nodes = corpus_trace(name), _raw_nodes(name)
    et_id = dict(match_ops(trace, corpus_et(name)).iter_rows())
    edges = trace.dataflow.filter(pl.col("input_index").is_not_null())
    into_integer, wrong = 0, []
    for p, c, i, pname, cname in edges.select(
        "producer", "consumer", "input_index", "producer_name", "consumer_name"
    ).iter_rows():
        if p not in et_id or c not in et_id:
            continue
        types = nodes[et_id[c]]["inputs"]["types"]
        if i >= len(types) or types[i] not in INTEGER:
            continue
        into_integer += 1
        written = nodes[et_id[p]]["outputs"]["types"]
        if written and all(t == "Tensor(float)" for t in written):
            wrong.append((p, c, pname, cname))
    return into_integer, wrong


@pytest.mark.parametrize("name", ["mixtral", "gpt2_generate", "llama_generate", "t5", "dit"])
def test_a_float_result_is_not_read_as_an_integer(name: str) -> None:
    """Mixtral's router `reshape`s `topk`'s indices (long), not the weights that `div_`
    normalized in place just before (float, the same `[tokens, k]`): by shape and order the
    reshape read the weights, and the experts' `empty_like`/`index_put_` after it."""
    into_integer, wrong = _float_into_integer(name)
    assert into_integer > 0  # the entry does read integer tensors
    assert wrong == []


def test_router_reshape_edges_are_the_ets() -> None:
    exact = _exact_pairs("mixtral")
    edges = corpus_trace("mixtral").dataflow
    router = edges.filter(pl.col("producer_name") == "aten::div_")
    assert router.height > 0
    assert set(router.select("producer", "consumer").iter_rows()) <= exact


# -- the residual stream skips a modulated norm ---------------------------------------------


def _residual_adds(trace: traceq.Trace, module: str) -> pl.Series:
    """Events of the `aten::add`s of two same-shaped tensors in calls of `module`."""
    shapes = pl.col("data_inputs").list.eval(pl.element().struct.field("shape"))
    return trace.dataflow_ops.filter(
        (pl.col("name") == "aten::add")
        & pl.col("module").str.ends_with(module)
        & (shapes.list.len() == 2)
        & (shapes.list.first() == shapes.list.last())
    )["event"]


def test_dit_residual_adds_read_the_stream_not_the_modulated_norm() -> None:
    """DiT's adaLN-Zero block: `x + gate_msa * attn(norm(x) * (1 + scale) + shift)`, then
    `h + gate_mlp * ff(...)`. By shape and order each add read the modulated norm (the
    most recent value of the shape); the ET has the block's input and the first sum."""
    trace = corpus_trace("dit")
    adds = pl.concat([_residual_adds(trace, f"BasicTransformerBlock_{i}") for i in (0, 1)])
    assert adds.len() == 8  # two blocks, two residual adds each, two denoising steps
    inferred = trace.dataflow.filter(pl.col("consumer").is_in(adds.implode()))
    exact = tensor_edges(trace, corpus_et("dit")).filter(pl.col("consumer").is_in(adds.implode()))
    assert set(inferred.select("producer", "consumer").iter_rows()) == set(
        exact.select("producer", "consumer").iter_rows()
    )


# -- a ResNet block's shortcut --------------------------------------------------------------


def test_unet_resnet_blocks_add_their_input_or_its_shortcut() -> None:
    """diffusers' `ResnetBlock2D`: `(shortcut(x) + conv2(act(norm2(conv1(act(norm1(x))) +
    temb)))) / scale`. By shape and order the add read `conv1(...) + temb` (the block's own
    value) and the 1x1 shortcut conv `act(norm1(x))`; the ET has `x` (or the shortcut's
    result) and `conv2`'s, in all 8 blocks of both denoising steps. The `Transformer2DModel`
    between them adds `proj_out(h) + residual` (it read `h` and `proj_out(h)`)."""
    trace = corpus_trace("unet")
    ops = trace.dataflow_ops
    in_block = pl.col("module").str.contains(
        r"(ResnetBlock2D_\d+(\.Conv2d_\d+)?|\.Transformer2DModel_\d+)$"
    )
    adds = _residual_adds(trace, "")
    consumers = ops.filter(
        in_block & (pl.col("event").is_in(adds.implode()) | (pl.col("name") == "aten::conv2d"))
    )["event"]
    # per step 8 blocks: add, conv1 and conv2 each, 5 shortcut convs (channels change), and
    # the mid block's Transformer2DModel: `proj_out(h) + residual`
    assert consumers.len() == 2 * (8 * 3 + 5 + 1)
    inferred = trace.dataflow.filter(pl.col("consumer").is_in(consumers.implode()))
    exact = tensor_edges(trace, corpus_et("unet")).filter(
        pl.col("consumer").is_in(consumers.implode())
    )
    assert set(inferred.select("producer", "consumer").iter_rows()) == set(
        exact.select("producer", "consumer").iter_rows()
    )


# -- a KV cache's cat may have read the queued values ---------------------------------------


def test_gpt2_attention_with_a_kv_cache_reads_q_not_k() -> None:
    """GPT-2's attention with a KV cache: `k`, `v`, then `q` are transposed, `k` and `v` go
    into the cache's `cat`s, and `sdpa(q, k_all, v_all)` reads the cats. The oldest-first
    queue of unread values (the `cat`s' reads are not recorded) gave `k` to `q`'s argument;
    the ET has `q` in each layer of each step that has a cache."""
    trace = corpus_trace("gpt2_generate")
    sdpa = trace.dataflow_ops.filter(pl.col("name") == "aten::scaled_dot_product_attention")
    cached = sdpa.filter(
        pl.col("data_inputs").list.get(0).struct.field("shape")
        != pl.col("data_inputs").list.get(1).struct.field("shape")
    )["event"]
    assert cached.len() == 6  # 2 layers, 3 steps with a cache
    query = pl.col("consumer").is_in(cached.implode()) & (pl.col("input_index") == 0)
    inferred = trace.dataflow.filter(query)
    exact = tensor_edges(trace, corpus_et("gpt2_generate")).filter(query)
    assert exact.height == cached.len()
    assert set(inferred.select("producer", "consumer").iter_rows()) == set(
        exact.select("producer", "consumer").iter_rows()
    )
