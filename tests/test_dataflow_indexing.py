"""The op right after advanced indexing (`relations/indexing.py`), against the ET.

`aten::index`'s result has no shape in Kineto, so the op after it took an older value of
the shape it reads: CLIP's text projection read the vision tower's norm (60 ops back),
Whisper's `to` the token embedding, Mixtral's router bookkeeping the values before its
`index`. The inferred edges into those ops are checked against the ET's tensor ids: none
is wrong (each such op's input is the index's result, which has no edge: unknown). The
test fails on the code before `indexed_reads`.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace

from traceq.relations.execution_trace import tensor_edges


@pytest.mark.parametrize("entry", ["clip", "whisper", "mixtral"])
def test_the_op_after_an_index_reads_no_older_value(entry: str) -> None:
    trace, et = corpus_trace(entry), corpus_et(entry)
    ops = trace.dataflow_ops.sort("pid", "tid", "ts_ns", "event")
    after = ops.filter(pl.col("name").shift(1).over("pid", "tid") == "aten::index")
    consumers = after["event"].implode()
    key = ["producer", "consumer"]
    exact = set(
        tensor_edges(trace, et).filter(pl.col("consumer").is_in(consumers)).select(key).iter_rows()
    )
    inferred = set(
        trace.dataflow.filter(pl.col("consumer").is_in(consumers)).select(key).iter_rows()
    )
    assert after.height >= 1
    assert inferred <= exact
