"""Pairing an Execution Trace with its Kineto trace when the ids do not line up.

The corpus pairs ET nodes with trace ops by record-function id. Traces from elsewhere may
lack `Record function id` (PyTorch < 2.1), have `External id`s at no constant offset from
the ET's `rf_id`s, or come with an ET that records no `rf_id`: then the nodes pair by op
order and name, thread by thread (`execution_trace.paired_by_order`). Each test takes a
corpus entry, breaks its ids on purpose, and checks the pairing and the measurement are
what the intact ids give.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import polars as pl
import pytest
from conftest import corpus_et, corpus_paths, corpus_trace

import traceq
from traceq.relations.dataflow.execution_trace import (
    _paired_by_id,
    ground_truth,
    load_execution_trace,
    match_ops,
    paired_by_order,
)

ENTRIES = ["tp_train", "cnn_train", "llama_generate"]  # backward, foreach lists, 5 calls


def _pairs(frame: pl.DataFrame) -> set[tuple[int, int]]:
    return set(frame.select("event", "et_id").iter_rows())


def _without_ids(name: str, folder: Path) -> traceq.Trace:
    """The entry's Kineto trace with no `Record function id` and `External id`s moved by a
    random amount each (no constant offset to the ET's `rf_id`)."""
    kineto, _ = corpus_paths(name)
    doc = json.loads(gzip.decompress(kineto.read_bytes()))
    jitter = random.Random(0)
    for event in doc["traceEvents"]:
        args = event.get("args") or {}
        args.pop("Record function id", None)
        if "External id" in args:
            args["External id"] += jitter.randrange(1, 10_000)
    path = folder / f"{name}.pt.trace.json"
    path.write_text(json.dumps(doc))
    return traceq.load(path)


def _et_rewritten(name: str, folder: Path, rf_id) -> pl.DataFrame:
    """The entry's ET with each node's `rf_id` attribute set to `rf_id(old)` (None drops it)."""
    _, et = corpus_paths(name)
    doc = json.loads(gzip.decompress(et.read_bytes()))
    for node in doc["nodes"]:
        attrs = [a for a in node.get("attrs", ()) if a["name"] != "rf_id"]
        old = next((a["value"] for a in node.get("attrs", ()) if a["name"] == "rf_id"), None)
        new = rf_id(old) if old is not None else None
        if new is not None:
            attrs.append({"name": "rf_id", "type": "uint64", "value": new})
        node["attrs"] = attrs
    path = folder / f"{name}.et.json"
    path.write_text(json.dumps(doc))
    return load_execution_trace(path)


@pytest.mark.parametrize("name", ENTRIES)
def test_order_pairs_like_the_ids_on_intact_files(name: str) -> None:
    trace, et = corpus_trace(name), corpus_et(name)
    by_id = _pairs(_paired_by_id(trace, et))
    assert len(by_id) >= 400
    assert _pairs(paired_by_order(trace, et)) == by_id


@pytest.mark.parametrize("name", ENTRIES)
def test_trace_without_record_function_ids_pairs_by_order(name: str, tmp_path: Path) -> None:
    """No `Record function id`, `External id`s at random offsets: the ids pair almost
    nothing (before the fallback, the measurement had no ground truth); by order, every
    pair the intact ids make."""
    intact = _pairs(match_ops(corpus_trace(name), corpus_et(name)))
    trace = _without_ids(name, tmp_path)
    assert trace.ops["record_function_id"].null_count() == trace.ops.height
    assert _paired_by_id(trace, corpus_et(name)).height < 0.1 * len(intact)
    assert _pairs(match_ops(trace, corpus_et(name))) == intact


@pytest.mark.parametrize("name", ENTRIES)
def test_et_with_shuffled_or_no_rf_ids_pairs_by_order(name: str, tmp_path: Path) -> None:
    """An ET whose `rf_id`s are shuffled, or absent, measures the same edges."""
    trace = corpus_trace(name)
    exact, matched = ground_truth(trace, corpus_et(name), trace.dataflow_ops)
    shuffle = random.Random(1)
    for rf_id in (lambda old: old * 7 + shuffle.randrange(1000), lambda old: None):
        et = _et_rewritten(name, tmp_path, rf_id)
        got, got_matched = ground_truth(trace, et, trace.dataflow_ops)
        assert got_matched.to_list() == matched.to_list()
        assert got.select("producer", "consumer", "input_index").equals(
            exact.select("producer", "consumer", "input_index")
        )
