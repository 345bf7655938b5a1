"""Advanced indexing (`x[idx]`, `aten::index`) read from the ops it runs (`relations/indexing.py`).

Kineto records the index tensors of `aten::index` as one untyped argument of no shape;
the op's children say what they are: `as_strided(self, size, ...)` has the result's size
and a `reshape` of each index tensor its shape. A Mixture of Experts dispatch indexes
three times per layer (`hidden[token_idx]`, `weights[perm]`, `out[inverse]`); checked
against the Execution Trace's tensor ids. Both tests fail on the code before `indexing.py`.
Where the result stays unknown, the op right after an unread `index` reads no older value
(`indexed_reads`; the last test fails on the code before it).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace, edges_into

import traceq
from traceq.relations.dataflow.execution_trace import tensor_edges


def test_index_reads_self_and_each_index_tensor(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    x, rows, cols = torch.randn(5, 7), torch.tensor([0, 3, 3]), torch.tensor([6, 1, 2])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = x[rows, cols]
    path = tmp_path / "index.json"
    prof.export_chrome_trace(str(path))
    index = (
        traceq.load(path).dataflow_ops.filter(pl.col("name") == "aten::index").row(0, named=True)
    )
    assert index["output_shape"] == list(out.shape)
    assert index["data_inputs"] == [
        {"index": 0, "shape": [5, 7]},
        {"index": 1, "shape": [3]},
        {"index": 1, "shape": [3]},
    ]


def test_mixtral_dispatch_index_edges_are_the_ets() -> None:
    """Out of the `index` ops every inferred edge is the ET's, as are those into their
    indices but for `weights[perm]`, whose `perm` (`sort`'s indices) shares its shape
    with `perm // k` made after it."""
    trace, et = corpus_trace("mixtral"), corpus_et("mixtral")
    index = trace.dataflow_ops.filter(pl.col("name") == "aten::index")["event"]
    assert index.len() == 3 * 2  # three per MoE layer, two layers
    exact, inferred = tensor_edges(trace, et), trace.dataflow

    def pairs(frame: pl.DataFrame, side: str, at: int | None = None) -> set:
        frame = frame.filter(pl.col(side).is_in(index.implode()))
        if at is not None:
            frame = frame.filter(pl.col("input_index") == at)
        return set(frame.select("producer", "consumer").iter_rows())

    out_exact, out_inferred = pairs(exact, "producer"), pairs(inferred, "producer")
    assert out_inferred <= out_exact and len(out_inferred) >= 4
    ids_exact, ids_inferred = pairs(exact, "consumer", 1), pairs(inferred, "consumer", 1)
    assert len(ids_exact) == 6
    assert len(ids_inferred & ids_exact) >= 4 and len(ids_inferred - ids_exact) <= 2


def test_index_with_no_recorded_size_stays_unknown() -> None:
    """An older profiler records no concrete inputs (HTA's MTIA trace: `as_strided`'s size
    is `''`): the index's result stays unknown instead of failing the load."""
    from traceq.relations.dataflow.readers.indexing import index_results

    frame = pl.DataFrame(
        {
            "event": [7],
            "name": ["aten::index"],
            "output_shape": [None],
            "input_types": [["double", ""]],
            "data_inputs": [[{"index": 0, "shape": [21708]}]],
        },
        schema_overrides={"output_shape": pl.List(pl.Int64)},
    )
    ops = pl.DataFrame(
        {
            "event": [8, 9],
            "parent": [7, 7],
            "name": ["aten::as_strided", "aten::reshape"],
            "shapes": [[[21708], [], [], []], [[1024], []]],
            "input_types": [["double", "", "", ""], ["long int", ""]],
            "concrete_inputs": [["", "", "", ""], ["", ""]],
        }
    )
    row = index_results(frame, ops).row(0, named=True)
    assert row["output_shape"] is None
    assert row["data_inputs"][-1] == {"index": 1, "shape": [1024]}


# Mixtral's `weights[perm]` follows an index and reads `perm // k` (one shape, made after
# `perm`): the known wrong edge of test_mixtral_dispatch_index_edges_are_the_ets.
@pytest.mark.parametrize("entry", ["clip", "whisper"])
def test_the_op_after_an_index_reads_no_older_value(entry: str) -> None:
    trace, et = corpus_trace(entry), corpus_et(entry)
    ops = trace.dataflow_ops.sort("pid", "tid", "ts_ns", "event")
    after = ops.filter(pl.col("name").shift(1).over("pid", "tid") == "aten::index")
    inferred, exact = edges_into(trace, et, after["event"])
    assert after.height >= 1
    assert inferred <= exact
