"""The query of attention with a KV cache, against the Execution Trace (`list_pieces`).

`sdpa(q, cat([past_k, k]), cat([past_v, v]))`: q, k and v share a shape and k, v are made
after q, so by shape and order the query read `v` (or `k`), which a `cat` had just taken
in: one tensor read twice, once through the cache (llama_mha, whisper's decoder, t5's
decoder: 2 wrong edges each). The edges into every attention op are checked against the
ET's tensor ids; the test fails on the code before `list_pieces.query_reads`.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace, edges_into


@pytest.mark.parametrize("entry", ["llama_mha", "whisper", "t5"])
def test_attention_with_a_kv_cache_reads_q_and_the_caches(entry: str) -> None:
    trace, et = corpus_trace(entry), corpus_et(entry)
    attention = trace.dataflow_ops.filter(pl.col("name").str.contains("scaled_dot_product"))
    inferred, exact = edges_into(trace, et, attention["event"])
    assert len(exact) >= 3 * attention.height
    assert inferred <= exact
    assert len(exact - inferred) <= 1  # t5's cross-attention mask: a `zeros` of a layer before
