"""Data flow between ops: which op's output another op reads.

`dataflow(trace)` gives producer -> consumer edges between the semantic ops of a trace:
inferred from shapes and order (Kineto records no tensor ids), or, where an Execution
Trace was recorded beside it, exact from tensor ids. The package, in reading order:

- `ops`: the ops data flow is defined over (`dataflow_ops`, `semantic_root`);
- `shapes`: what each op's signature says: kind, data inputs, output shape;
- `matching`: each input to the most recent output of its shape, ranked by the module
  tree (with `pieces`: the pieces of a split its caller still holds);
- `edges`: the edge frame's columns (`EDGE_SCHEMA`), what a reader is given (`Flow`), and
  the test for an edge matched past an op that recorded no shape (`passed_shapeless`);
- `inferred`: the orchestrator: shape, order, forward -> backward and 0-d edges, then
  each reader of `readers.READERS` in order;
- `readers/`: one module per idiom shape and order read wrong (a KV cache, rotary
  embeddings, a backward node's formulas, ...), each `reads(edges, flow) -> edges`;
- `execution_trace`: exact edges from an Execution Trace (tensor ids), the measure of
  the rest (`benchmarks/dataflow_accuracy.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceq.relations.dataflow.edges import EDGE_SCHEMA, Flow, passed_shapeless
from traceq.relations.dataflow.execution_trace import (
    ExecutionTraceError,
    ground_truth,
    load_execution_trace,
    match_ops,
    replace_inferred,
    tensor_edges,
)
from traceq.relations.dataflow.inferred import (
    bool_factories,
    inferred_edges,
    module_calls,
    returned_inputs,
)
from traceq.relations.dataflow.ops import dataflow_ops, is_semantic, semantic_root
from traceq.relations.dataflow.shapes import base_name

if TYPE_CHECKING:
    import polars as pl

    from traceq.loader.loaded import LoadedTrace

__all__ = [
    "EDGE_SCHEMA",
    "ExecutionTraceError",
    "Flow",
    "base_name",
    "bool_factories",
    "dataflow",
    "dataflow_ops",
    "ground_truth",
    "inferred_edges",
    "is_semantic",
    "load_execution_trace",
    "match_ops",
    "module_calls",
    "passed_shapeless",
    "replace_inferred",
    "returned_inputs",
    "semantic_root",
    "tensor_edges",
]


def dataflow(
    trace: LoadedTrace,
    ops: pl.DataFrame | None = None,
    execution_trace: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Producer -> consumer edges between rows of `dataflow_ops` (pass them in if built).

    Columns (`EDGE_SCHEMA`): producer, consumer (event ids), producer_name, consumer_name,
    input_index (null for order-only edges), shape, confidence (0..1], evidence
    ("shape+order", "gemm-output-shape+same-module", "numel+order", "order", ...), inferred
    (True: Kineto has no tensor ids). With an `execution_trace` (`load_execution_trace`),
    the edges into every op it pairs with are the exact ones instead ("tensor-id",
    inferred False).
    """
    ops = dataflow_ops(trace) if ops is None else ops
    edges = inferred_edges(trace, ops)
    if execution_trace is None:
        return edges
    return replace_inferred(edges, trace, execution_trace, ops)
