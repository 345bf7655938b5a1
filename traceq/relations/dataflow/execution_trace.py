"""Exact data flow from a PyTorch Execution Trace (ET), the Kineto trace's companion file.

`torch.profiler.ExecutionTraceObserver` records every op with the ids of the tensors it
read and wrote; Kineto records none. So where an ET was recorded beside a trace, the
producer of an op's input is a fact (the last op that wrote that tensor id before it), not
a guess from shapes and order. This module reads the ET (`load_execution_trace`), pairs
its nodes with the trace's ops (`match_ops`), and turns tensor ids into edges between the
semantic ops of `dataflow_ops` (`tensor_edges`, `replace_inferred`).

Pairing: an ET node's `rf_id` is the record-function id Kineto writes as `Record function
id` (PyTorch >= 2.1) or, in older traces, as `External id`. The two counters can be offset
per thread when the ET and the profiler did not start together, so each ET thread is
paired at the offset where most op names agree (all threads at one iteration, when the
trace repeats it), and a pair must agree on the name. Where the ids do not line up (no
`Record function id`, no constant offset to `External id`, or no `rf_id` in the ET), the
nodes are paired by op order and name instead, thread by thread (`paired_by_order`).
"""

from __future__ import annotations

import os
from collections import Counter
from difflib import SequenceMatcher
from typing import TYPE_CHECKING, Any, BinaryIO

import msgspec
import numpy as np
import polars as pl

from traceq.errors import TraceFormatError
from traceq.loader.decode import json_type
from traceq.loader.source import describe, read_bytes
from traceq.relations.dataflow.edges import EDGE_SCHEMA
from traceq.relations.dataflow.ops import dataflow_ops, semantic_root

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

CONFIDENCE_EXACT = 1.0
EVIDENCE = "tensor-id"
VOTERS = 1024
"""ET nodes per thread that vote for the rf_id offset: a whole iteration where it fits (64
voters paired 788 of linear_et's 928 nodes, all of them 883), capped so the name join
stays small on big traces."""
BY_ORDER_BELOW = 0.9
"""Pair by op order (`paired_by_order`) when the ids pair fewer than this share of the ET
nodes that could pair (those named like a trace op, at most as many as the trace has)."""
_TENSOR = pl.Struct({"index": pl.Int64, "tensor_id": pl.Int64, "storage_id": pl.Int64})
ET_SCHEMA = {
    "et_id": pl.Int64,
    "name": pl.String,
    "parent": pl.Int64,
    "rf_id": pl.Int64,
    "tid": pl.Int64,
    "inputs": pl.List(_TENSOR),
    "outputs": pl.List(_TENSOR),
}


class ExecutionTraceError(TraceFormatError):
    """The file is JSON, but not a PyTorch Execution Trace (no `nodes` with ids and names)."""


def load_execution_trace(
    src: str | os.PathLike[str] | BinaryIO, *, max_bytes: int | None = None
) -> pl.DataFrame:
    """One row per ET node, with the tensors it read and wrote, for `tensor_edges`.

    Columns: et_id (entry order: ids count up as ops start), name, parent (`ctrl_deps`),
    rf_id, tid (the ET's thread number, not the OS one), inputs and outputs (lists of
    {index: argument position, tensor_id, storage_id}; tensor lists such as `cat`'s give one
    entry per tensor at the list's position). Reads schema 1.0.x (top-level `rf_id`,
    `parent`) and 1.1.x-chakra (`attrs`, `ctrl_deps`). Raises `TraceFileError` for an
    unreadable file and `ExecutionTraceError` when the JSON is not an ET.
    """
    name = describe(src)
    data = read_bytes(src, max_bytes=max_bytes)
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ExecutionTraceError(f"not JSON ({exc})", source=name) from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise ExecutionTraceError("no `nodes` list: not a PyTorch Execution Trace", source=name)
    try:
        rows = [_node_row(node) for node in nodes]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise ExecutionTraceError(_node_problem(nodes), source=name) from None
    return pl.DataFrame(rows, schema=ET_SCHEMA, orient="row").sort("et_id")


# The node fields `_node_row` reads, and what JSON type each must be.
_NODE_FIELDS = {
    "id": ((int,), "an integer"),
    "name": ((str,), "a string"),
    "inputs": ((list, dict), "an array or an object"),
    "outputs": ((list, dict), "an array or an object"),
    "input_types": ((list,), "an array"),
    "output_types": ((list,), "an array"),
    "attrs": ((list,), "an array"),
}


def _node_problem(nodes: list[Any]) -> str:
    """The first malformed node and what is wrong with it, in JSON's words."""
    for index, node in enumerate(nodes):
        try:
            _node_row(node)
        except KeyError as exc:
            return f"ET node {index} has no {exc.args[0]!r}"
        except (TypeError, ValueError, IndexError, AttributeError):
            if not isinstance(node, dict):
                return f"ET node {index} is {json_type(node)}, not an object"
            for key, (types, wanted) in _NODE_FIELDS.items():
                if key in node and not isinstance(node[key], types):
                    return f"ET node {index}: {key!r} is {json_type(node[key])}, not {wanted}"
            return f"ET node {index} has a value of the wrong type inside it"
    return "malformed ET node"


def _node_row(node: dict[str, Any]) -> tuple[Any, ...]:
    """One ET node as a row; the two schemas differ only in where fields live."""
    attrs = {a["name"]: a["value"] for a in node.get("attrs", ())}
    if isinstance(node["inputs"], dict):  # 1.1.x: {values, shapes, types}
        inputs = _tensors(node["inputs"]["values"], node["inputs"]["types"])
        outputs = _tensors(node["outputs"]["values"], node["outputs"]["types"])
        parent = node.get("ctrl_deps")
    else:  # 1.0.x: parallel lists
        inputs = _tensors(node["inputs"], node["input_types"])
        outputs = _tensors(node["outputs"], node["output_types"])
        parent = node.get("parent")
    schema = str(attrs.get("op_schema", node.get("op_schema", "")))
    if "!" not in schema and not str(node["name"]).endswith("_"):
        # An op that returns an input (`resolve_conj`, a no-op `to`) wrote nothing new;
        # only a mutating one (`Tensor(a!)`, `add_`) writes the tensor it returns.
        read = {(t["tensor_id"], t["storage_id"]) for t in inputs}
        outputs = [t for t in outputs if (t["tensor_id"], t["storage_id"]) not in read]
    rf_id = attrs.get("rf_id", node.get("rf_id"))
    tid = attrs.get("tid", node.get("tid"))
    return (int(node["id"]), str(node["name"]), parent, rf_id, tid, inputs, outputs)


def _tensors(values: list[Any], types: list[str]) -> list[dict[str, Any]]:
    """Tensor arguments as {index, tensor_id, storage_id}; an ET tensor value is
    [tensor_id, storage_id, offset, numel, itemsize, device].

    A tensor is known by both ids: the observer hands a freed tensor's id to the next
    tensor made at its address, and only the storage id tells the two apart (keyed by id
    alone, the corpus's UNet read a `conv2d` output freed long before as a `div` input).
    """
    found = []
    for index, (value, kind) in enumerate(zip(values, types, strict=False)):
        if kind.startswith("Tensor") and isinstance(value, list) and value:
            found.append({"index": index, **_tensor_key(value)})
        elif kind.startswith("GenericList[Tensor") and isinstance(value, list):
            found.extend(
                {"index": index, **_tensor_key(item)}
                for item in value
                if isinstance(item, list) and item
            )
    return found


def _tensor_key(value: list[Any]) -> dict[str, int]:
    """`tensor_id` and `storage_id` of one ET tensor value (-1: no storage recorded)."""
    storage = value[1] if len(value) > 1 and isinstance(value[1], int) else -1
    return {"tensor_id": int(value[0]), "storage_id": int(storage)}


# -- pairing ET nodes with trace ops -------------------------------------------------------


def match_ops(trace: LoadedTrace, et: pl.DataFrame) -> pl.DataFrame:
    """Pairs of (event, et_id): trace op and ET node of one op call.

    Key: Kineto's `Record function id` when the trace has it, else `External id`; per ET
    thread, the offset between the counters is the one most of the first `VOTERS` nodes
    agree on by name, and a pair must share the name. Each op and each node is paired at
    most once. A trace of many iterations gives each thread one equally good offset per
    iteration: the thread with the most votes takes the one nearest 0 (the counters
    started together), and every other thread the one whose ops ran nearest it in time,
    on the side the ET's order puts them (the backward thread after the forward one),
    so all threads pair with the same iteration. Where that pairs fewer than
    `BY_ORDER_BELOW` of the nodes that could pair (ids that do not line up: an ET or a
    trace from another PyTorch, or edited), nodes are paired by order (`paired_by_order`).
    """
    by_id = _paired_by_id(trace, et)
    names = trace.ops["name"].unique().implode()
    could = min(et.filter(pl.col("name").is_in(names)).height, trace.ops.height)
    if by_id.height >= BY_ORDER_BELOW * could:
        return by_id
    by_order = paired_by_order(trace, et)
    return by_order if by_order.height > by_id.height else by_id


def _paired_by_id(trace: LoadedTrace, et: pl.DataFrame) -> pl.DataFrame:
    """`match_ops` by the record-function id (or `External id`) and name."""
    key = (
        "record_function_id"
        if trace.ops["record_function_id"].null_count() < trace.ops.height
        else "external_id"
    )
    ops = trace.ops.select(
        pl.col("event").cast(pl.Int64),
        "name",
        pl.col("tid").alias("_ktid"),
        pl.col(key).cast(pl.Int64).alias("_key"),
        pl.col("ts_ns").alias("_ts"),
    ).drop_nulls("_key")
    nodes = et.select("et_id", "name", "rf_id", "tid").drop_nulls(["rf_id", "tid"])
    if ops.height == 0 or nodes.height == 0:
        return pl.DataFrame(schema={"event": pl.Int64, "et_id": pl.Int64})
    voters = nodes.sort("rf_id").group_by("tid", maintain_order=True).head(VOTERS)
    offsets = _thread_offsets(voters, ops)
    return (
        nodes.join(offsets, on="tid")
        .with_columns((pl.col("rf_id") + pl.col("_offset")).alias("_key"))
        .join(ops.drop("_ts"), on=["_key", "name", "_ktid"])
        .unique("event", keep="first")
        .unique("et_id", keep="first")
        .select("event", "et_id")
        .sort("event")
    )


def paired_by_order(trace: LoadedTrace, et: pl.DataFrame) -> pl.DataFrame:
    """Pairs of (event, et_id) by op order and name alone, thread by thread: no ids.

    Both files list one program's op calls in the order they started (ET ids count up as
    ops start; Kineto ops by start time, the enclosing op first), each with a few the
    other lacks (the ET's own markers, `ProfilerStep`, an op outside the other's window).
    Each ET thread goes with the trace thread that shares the most op names with it, and
    the two name sequences are aligned (`difflib.SequenceMatcher`: the longest runs of
    names in common, in order); an op pairs with the node at its place in a common run.
    """
    ops = trace.ops.select(
        pl.col("event").cast(pl.Int64), "name", pl.col("tid").alias("_ktid"), "ts_ns", "dur_ns"
    ).sort(["_ktid", "ts_ns", "dur_ns", "event"], descending=[False, False, True, False])
    nodes = et.select("et_id", "name", "tid").drop_nulls("tid").sort("et_id")
    if ops.height == 0 or nodes.height == 0:
        return pl.DataFrame(schema={"event": pl.Int64, "et_id": pl.Int64})
    ids = {name: i for i, name in enumerate(set(ops["name"]) | set(nodes["name"]))}
    trace_threads = {
        tid: (group["event"].to_list(), [ids[n] for n in group["name"]])
        for (tid,), group in ops.group_by("_ktid", maintain_order=True)
    }
    et_threads = {
        tid: (group["et_id"].to_list(), [ids[n] for n in group["name"]])
        for (tid,), group in nodes.group_by("tid", maintain_order=True)
    }
    shared = sorted(
        (
            (sum((Counter(e[1]) & Counter(k[1])).values()), etid, ktid)
            for etid, e in et_threads.items()
            for ktid, k in trace_threads.items()
        ),
        reverse=True,
    )
    pairs: list[tuple[int, int]] = []
    taken_et, taken_trace = set(), set()
    for common, etid, ktid in shared:
        if common == 0 or etid in taken_et or ktid in taken_trace:
            continue
        taken_et.add(etid)
        taken_trace.add(ktid)
        (et_ids, et_names), (events, names) = et_threads[etid], trace_threads[ktid]
        runs = SequenceMatcher(None, et_names, names, autojunk=False).get_matching_blocks()
        for a, b, size in runs:
            pairs.extend(zip(events[b : b + size], et_ids[a : a + size], strict=True))
    return pl.DataFrame(pairs, schema={"event": pl.Int64, "et_id": pl.Int64}, orient="row").sort(
        "event"
    )


def _thread_offsets(voters: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """`tid`, `_ktid`, `_offset` per ET thread: its best-voted offsets (one per iteration),
    narrowed to one iteration shared by all threads (see `match_ops`)."""
    votes = (
        voters.join(ops, on="name")
        .with_columns((pl.col("_key") - pl.col("rf_id")).alias("_offset"))
        .group_by("tid", "_ktid", "_offset")
        .agg(pl.len(), pl.col("_ts").median().alias("_at"))
        .join(voters.group_by("tid").agg(pl.col("et_id").min().alias("_first")), on="tid")
        .with_columns(pl.col("_offset").abs().alias("_far"))
    )
    best = votes.filter(pl.col("len") == pl.col("len").max().over("tid"))
    anchor = best.sort(["len", "_far", "tid"], descending=[True, False, False]).row(0, named=True)
    delta = pl.col("_at") - anchor["_at"]
    wrong_side = delta * (pl.col("_first") - anchor["_first"]).sign() < 0
    return (
        best.with_columns(wrong_side.alias("_wrong_side"), delta.abs().alias("_gap"))
        .sort(["_wrong_side", "_gap", "_far"])
        .group_by("tid", maintain_order=True)
        .first()
        .select("tid", "_ktid", "_offset")
    )


# -- edges -------------------------------------------------------------------------------


def tensor_edges(
    trace: LoadedTrace, et: pl.DataFrame, ops: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Exact producer -> consumer edges between `dataflow_ops` rows, from tensor ids.

    The producer of a consumer's input is the semantic op enclosing the last ET node that
    wrote that tensor id before the consumer started (ET ids count up in start order; a
    node inside the consumer starts after it, so the consumer's own work never counts).
    A write by an ET node the trace lacks still hides older writers, so a missing op
    loses its edge instead of crediting a stale one; an edge whose producer starts after
    its consumer in the trace (threads paired at different iterations) is dropped.
    Same columns as `dataflow`, with confidence 1.0, evidence "tensor-id", inferred False.
    """
    ops = dataflow_ops(trace) if ops is None else ops
    return _exact_edges(_rooted(trace, et), ops)


def ground_truth(
    trace: LoadedTrace, et: pl.DataFrame, ops: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, pl.Series]:
    """`tensor_edges` and the events of the ops the ET describes (only their edges are
    known), pairing once: what a measurement of inferred data flow compares against."""
    ops = dataflow_ops(trace) if ops is None else ops
    nodes = _rooted(trace, et)
    return _exact_edges(nodes, ops), _matched(nodes, ops)


def _exact_edges(nodes: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """`tensor_edges` from `_rooted` nodes, so a caller that has them pairs only once."""
    semantic = ops.select(pl.col("event").cast(pl.Int64))
    consumers = nodes.filter(pl.col("event") == pl.col("root")).join(
        semantic, on="event", how="semi"
    )
    reads = (
        consumers.select(pl.col("event").alias("consumer"), pl.col("et_id").alias("_at"), "inputs")
        .explode("inputs")
        .drop_nulls("inputs")
        .unnest("inputs")
        .sort("_at")
    )
    writes = (
        nodes.filter(pl.col("event").is_null() | pl.col("root").is_not_null())
        .select(pl.col("root").alias("producer"), pl.col("et_id").alias("_at"), "outputs")
        .explode("outputs")
        .drop_nulls("outputs")
        .select("producer", "_at", pl.col("outputs").struct.field("tensor_id", "storage_id"))
        .sort("_at")
    )
    if reads.height == 0 or writes.height == 0:
        return pl.DataFrame(schema=EDGE_SCHEMA)
    names = ops.select(pl.col("event").cast(pl.Int64), "name")
    starts = ops.select(pl.col("event").cast(pl.Int64), pl.col("ts_ns").alias("_ts"))
    return (
        reads.join_asof(
            writes,
            on="_at",
            by=["tensor_id", "storage_id"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .drop_nulls("producer")
        .filter(pl.col("producer") != pl.col("consumer"))
        .join(starts.rename({"event": "producer", "_ts": "_pts"}), on="producer")
        .join(starts.rename({"event": "consumer", "_ts": "_cts"}), on="consumer")
        .filter(pl.col("_pts") <= pl.col("_cts"))  # a pairing at the wrong iteration
        .join(semantic.rename({"event": "producer"}), on="producer", how="semi")
        .join(names.rename({"event": "producer", "name": "producer_name"}), on="producer")
        .join(names.rename({"event": "consumer", "name": "consumer_name"}), on="consumer")
        .join(_input_shapes(ops), on=["consumer", "index"], how="left")
        .select(
            "producer",
            "consumer",
            "producer_name",
            "consumer_name",
            pl.col("index").alias("input_index"),
            "shape",
            pl.lit(CONFIDENCE_EXACT).alias("confidence"),
            pl.lit(EVIDENCE).alias("evidence"),
            pl.lit(False).alias("inferred"),
        )
        .cast(EDGE_SCHEMA)
        .unique(["producer", "consumer", "input_index"], maintain_order=True)
        .sort("consumer", "input_index", "producer")
    )


def _matched(nodes: pl.DataFrame, ops: pl.DataFrame) -> pl.Series:
    """Events of the `dataflow_ops` rows the ET describes: their edges are all exact.

    A node that records no tensor at all describes nothing: Inductor's kernels
    (`graph_0_cpp_fused_gelu_0`) appear in an ET as a record-function node without their
    arguments, so they keep their inferred edges."""
    tensors = pl.col("inputs").list.len() + pl.col("outputs").list.len()
    return (
        nodes.filter((pl.col("event") == pl.col("root")) & (tensors > 0))
        .join(ops.select(pl.col("event").cast(pl.Int64)), on="event", how="semi")["event"]
        .unique()
        .sort()
    )


def replace_inferred(
    edges: pl.DataFrame, trace: LoadedTrace, et: pl.DataFrame, ops: pl.DataFrame
) -> pl.DataFrame:
    """`edges` (inferred) with every edge into an ET-matched op replaced by the exact ones.

    An op the ET pairs with keeps only tensor-id edges, even none (it read only
    parameters or inputs made before the trace): the ET is the fact. Ops it does not pair
    with (outside its window, or a thread it did not record) keep their inferred edges.
    """
    return replaced_and_paired(edges, trace, et, ops)[0]


def replaced_and_paired(
    edges: pl.DataFrame, trace: LoadedTrace, et: pl.DataFrame, ops: pl.DataFrame
) -> tuple[pl.DataFrame, pl.Series]:
    """`replace_inferred`, and the events of the ops the ET paired (made exact): what
    `Trace.dataflow` reports as "N of M ops paired"."""
    nodes = _rooted(trace, et)  # pairing ET nodes with ops is the costly part: done once
    matched = _matched(nodes, ops)
    exact = _exact_edges(nodes, ops)
    kept = edges.filter(~pl.col("consumer").is_in(matched.implode()))
    replaced = pl.concat([kept, exact.select(edges.columns)]).sort(
        "consumer", "input_index", "producer", nulls_last=True
    )
    return replaced, matched


def _rooted(trace: LoadedTrace, et: pl.DataFrame) -> pl.DataFrame:
    """ET nodes with their trace op (`event`, null if unpaired) and its semantic root
    (null when the op is not inside a semantic op, e.g. an autograd node)."""
    ordered = trace.ops.sort("event")
    root = semantic_root(ordered)
    events = ordered["event"].cast(pl.Int64)
    roots = pl.DataFrame(
        {
            "event": events,
            "root": pl.Series(np.where(root >= 0, events.to_numpy()[np.maximum(root, 0)], -1)),
        }
    ).with_columns(pl.when(pl.col("root") >= 0).then(pl.col("root")).alias("root"))
    return (
        et.select("et_id", "inputs", "outputs")
        .join(match_ops(trace, et), on="et_id", how="left")
        .join(roots, on="event", how="left")
    )


def _input_shapes(ops: pl.DataFrame) -> pl.DataFrame:
    """Shape of each recorded input of each op (Kineto's `Input Dims`), by position."""
    return (
        ops.select(pl.col("event").cast(pl.Int64).alias("consumer"), "shapes")
        .drop_nulls("shapes")
        .with_columns(pl.int_ranges(pl.col("shapes").list.len()).alias("index"))
        .explode("shapes", "index")
        .select("consumer", pl.col("index").cast(pl.Int64), pl.col("shapes").alias("shape"))
    )
