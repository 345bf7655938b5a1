"""The ids an embedding lookup reads (`relations/lookups.py`), against the Execution Trace.

DiT's `CombinedTimestepLabelEmbeddings` hands the timestep to `Timesteps` and the class
labels, a graph input, to `LabelEmbedding`: by shape and order each lookup read the
timestep (6 wrong edges: three calls a step, two steps). The timestep was read already, in
a sibling module call, so the lookup reads nothing. Two lookups of sibling calls reading
one id tensor (BERT's, `generate`'s GPT-2) read neither: which one does is not recorded.
"""

from __future__ import annotations

import polars as pl
from conftest import corpus_et, corpus_trace

from traceq.relations.dataflow.execution_trace import tensor_edges


def _into_lookups(frame: pl.DataFrame, lookups: pl.Series) -> set[tuple[int, int]]:
    into = frame.filter(pl.col("consumer").is_in(lookups.implode()))
    return set(into.select("producer", "consumer").iter_rows())


def test_dit_label_lookups_read_no_timestep() -> None:
    trace, et = corpus_trace("dit"), corpus_et("dit")
    lookups = trace.dataflow_ops.filter(pl.col("name") == "aten::embedding")["event"]
    assert lookups.len() == 6
    assert _into_lookups(tensor_edges(trace, et), lookups) == set()  # the labels: an input
    assert _into_lookups(trace.dataflow, lookups) == set()


def test_bert_lookups_of_one_value_read_neither() -> None:
    """BERT's word and token-type lookups read the token-type ids by shape and order; the
    ET says only the second does (the first reads `input_ids`, a graph input). Which one
    is not recorded: neither gets the edge, and no lookup keeps a wrong one."""
    trace, et = corpus_trace("bert"), corpus_et("bert")
    lookups = trace.dataflow_ops.filter(
        (pl.col("name") == "aten::embedding") & pl.col("module").str.contains(r"Embedding_[01]$")
    )["event"]
    assert lookups.len() == 2
    exact = _into_lookups(tensor_edges(trace, et), lookups)
    assert len(exact) == 1
    inferred = _into_lookups(trace.dataflow, lookups)
    assert inferred == set()
    assert {p for p, _ in exact}.isdisjoint(p for p, _ in inferred)


def test_generate_position_lookup_reads_no_input_ids() -> None:
    """`generate`'s GPT-2: `wte(input_ids)` keeps its ids; `wpe`, whose position ids come
    from host-side bookkeeping, no longer reads `input_ids` too."""
    trace, et = corpus_trace("gpt2_generate"), corpus_et("gpt2_generate")
    ops = trace.dataflow_ops.filter(pl.col("name") == "aten::embedding")
    wte = ops.filter(pl.col("module").str.ends_with("Embedding_0"))["event"]
    wpe = ops.filter(pl.col("module").str.ends_with("Embedding_1"))["event"]
    assert wte.len() == wpe.len() == 4  # one forward per generated token
    wrong = _into_lookups(trace.dataflow, wpe) - _into_lookups(tensor_edges(trace, et), wpe)
    assert wrong == set()
