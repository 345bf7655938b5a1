"""TQ105 in a compiled graph: a GEMM with no input edge after an Inductor kernel.

`fixtures/corpus/llama_compiled` (a `torch.compile`d LLaMA layer, CPU): Inductor's C++
kernels record no arguments in Kineto and no outputs in the Execution Trace, so neither
data flow has an edge into the graph's GEMMs. Checked against the raw ET (json and gzip):
which storage each GEMM's activation operand lives in.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import polars as pl
from conftest import corpus_paths

import traceq
from traceq.relations.dataflow import dataflow
from traceq.relations.dataflow.execution_trace import load_execution_trace, tensor_edges
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.tq105_parallel_gemms import after_argless_ops


def _findings(exact: bool) -> set[frozenset[int]]:
    kineto, et = corpus_paths("llama_compiled")
    trace = traceq.load(kineto, execution_trace=False)
    if exact:
        frame = load_execution_trace(et)
        trace.__dict__["dataflow"] = dataflow(trace, trace.dataflow_ops, execution_trace=frame)
    return {frozenset(f.ops) for f in run(trace, Config(select=["TQ105"])).findings}


def test_no_group_of_gemms_that_read_different_buffers() -> None:
    """The ET: the Inductor kernels write nothing it records, and the graph's GEMMs read
    their activation operand from 4 storages (q/k/v one, o_proj/gate/up one, down and the
    LM head one each). The "graph input" group the old rule made on ET data flow (q, k, v,
    o_proj, up, LM head) read 3; every group either data flow makes reads one storage,
    and the two agree."""
    kineto, et_path = corpus_paths("llama_compiled")
    with gzip.open(et_path, "rt") as f:
        nodes = json.load(f)["nodes"]
    kernels = [n for n in nodes if n["name"].startswith("graph_0_cpp_fused")]
    assert kernels and all(not n["outputs"]["values"] for n in kernels)
    storage_of = {}  # rf_id -> the storage of the GEMM's first operand
    for node in nodes:
        if node["name"] == "aten::mm":
            rf_id = next(a["value"] for a in node["attrs"] if a["name"] == "rf_id")
            storage_of[rf_id] = node["inputs"]["values"][0][1]
    by_storage = defaultdict(list)
    for rf_id, storage in sorted(storage_of.items()):
        by_storage[storage].append(rf_id)
    assert sorted(len(v) for v in by_storage.values()) == [1, 1, 3, 3]
    trace = traceq.load(kineto)
    rf = dict(
        trace.ops.select(pl.col("event").cast(pl.Int64), "record_function_id")
        .drop_nulls()
        .iter_rows()
    )
    inferred, exact = _findings(exact=False), _findings(exact=True)
    assert inferred == exact
    for group in inferred | exact:
        assert len({storage_of[rf[e]] for e in group}) == 1, sorted(group)


def test_ops_after_an_argless_kernel_in_their_graph() -> None:
    """Per thread and enclosing op: the ops from the first one that recorded no arguments on."""
    ops = pl.DataFrame(
        {
            "event": [1, 2, 3, 4, 5, 6],
            "pid": [1] * 6,
            "tid": [1] * 6,
            "parent": [10, 10, 10, 20, 20, None],
            "_seq": [1, 2, 3, 4, 5, 6],
            "input_dims": ["[[2, 4]]", None, "[[2, 4]]", "[[2, 4]]", None, "[[2, 4]]"],
        }
    )
    assert sorted(after_argless_ops(ops).to_list()) == [2, 3, 5]


def test_extern_calls_read_nothing_made_before_a_kernel_that_ran_since() -> None:
    """In the compiled LLaMA, each GEMM's activation operand is, by the ET's storages, what
    the C++ kernel right before it wrote or what an op with recorded outputs wrote with no
    kernel between: an edge from an older value (v_proj from q's rotary kernel, the gate,
    up and LM head GEMMs from the attention or the down GEMM, read by element count) is
    one the trace cannot support. Every inferred edge into the graph's extern calls comes
    from the op or kernel right before, or is the ET's own (tensor ids)."""
    kineto, et_path = corpus_paths("llama_compiled")
    trace = traceq.load(kineto, execution_trace=False)
    ops = trace.dataflow_ops.sort("ts_ns", "event")
    order = {e: i for i, e in enumerate(ops["event"].to_list())}
    argless = ops.filter(pl.col("input_dims").is_null())["event"].to_list()
    externs = ops.filter(pl.col("name").str.starts_with("aten::"))["event"]
    exact = set(
        tensor_edges(trace, load_execution_trace(et_path))
        .select("producer", "consumer")
        .iter_rows()
    )
    edges = trace.dataflow.filter(pl.col("consumer").is_in(externs.implode()))
    assert edges.height >= 4
    for p, c in edges.select("producer", "consumer").iter_rows():
        kernels_between = [k for k in argless if order[p] < order[k] < order[c]]
        assert not kernels_between or (p, c) in exact, (p, c)
