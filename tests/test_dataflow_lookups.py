"""The ids an embedding lookup reads (`relations/lookups.py`), against the Execution Trace.

DiT's `CombinedTimestepLabelEmbeddings` hands the timestep to `Timesteps` and the class
labels, a graph input, to `LabelEmbedding`: by shape and order each lookup read the
timestep (6 wrong edges: three calls a step, two steps). The timestep was read already, in
a sibling module call, so the lookup reads nothing. Two lookups reading one id tensor say
nothing of each other: BERT's token-type lookup keeps the ids its embeddings module made.
"""

from __future__ import annotations

import polars as pl
from conftest import corpus_et, corpus_trace

from traceq.relations.execution_trace import tensor_edges


def _into_lookups(frame: pl.DataFrame, lookups: pl.Series) -> set[tuple[int, int]]:
    into = frame.filter(pl.col("consumer").is_in(lookups.implode()))
    return set(into.select("producer", "consumer").iter_rows())


def test_dit_label_lookups_read_no_timestep() -> None:
    trace, et = corpus_trace("dit"), corpus_et("dit")
    lookups = trace.dataflow_ops.filter(pl.col("name") == "aten::embedding")["event"]
    assert lookups.len() == 6
    assert _into_lookups(tensor_edges(trace, et), lookups) == set()  # the labels: an input
    assert _into_lookups(trace.dataflow, lookups) == set()


def test_bert_token_type_lookup_reads_its_ids() -> None:
    trace, et = corpus_trace("bert"), corpus_et("bert")
    lookups = trace.dataflow_ops.filter(
        (pl.col("name") == "aten::embedding") & pl.col("module").str.ends_with("Embedding_1")
    )["event"]
    assert lookups.len() == 1
    exact = _into_lookups(tensor_edges(trace, et), lookups)
    assert len(exact) == 1
    assert _into_lookups(trace.dataflow, lookups) == exact
