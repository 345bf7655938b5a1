"""What the ops of an autograd backward node can read: the gradient and what their forward op saved.

An autograd node (`AddmmBackward0`, ...) carries the sequence number of the forward op that
created it, and runs the derivative formulas of that op: each formula reads the incoming
gradient and the tensors the forward op saved, its inputs (or its result, `inferred`'s
`SAVES_RESULT`). Shape and order do not know that. In a backward pass every value has
the shape of a forward one, and the most recent value of a shape is often a forward
result the node never saw: the model's output (`linear`, `[batch, out]`) read as the
`grad_output` an `AddmmBackward0` sums for its bias, or as the input of the first layer's
weight gradient, a graph input with no producer (against the ET corpus: 2 of 2 such
edges wrong). So a forward value is read inside a backward node only where it is the
node's forward op or a value that op read.

The formulas of a GEMM's or a product's node are independent, too: `AddmmBackward0`'s
`grad @ W.t()` (the input's gradient) and `x.t() @ grad` (the weight's) each read the
gradient and a saved tensor, never each other's result, yet the first is the most recent
value of `x`'s shape when the second runs (`ddp_train`); `MulBackward0`'s `grad * other`
read as `self` by `grad * self` (HTA's MTIA trace, a fusion finding across the two). So
in such a node (`ONE_OP_FORMULAS`) an op reads no op of its name.

Reads: what a backward node's formulas read: the gradient and what their forward op saved,
never each other's results. Appears in: training steps (`ddp_train`; HTA's training
traces); corpus entries whose edges it changes: `ddp_train`. On the ET corpus: +0 right, -3
wrong, +0 missed edges (without it: precision 0.995, recall 0.962;
`benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations import autograd

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace
    from traceq.relations.dataflow.edges import Flow

ONE_OP_FORMULAS = frozenset(
    {"MulBackward0", "MmBackward0", "BmmBackward0", "AddmmBackward0", "BaddbmmBackward0"}
    | {"AddbmmBackward0", "MvBackward0", "AddmvBackward0"}
)
"""Nodes each of whose formulas is one op, on the gradient and one saved tensor:
`grad * other` and `grad * self`; `grad @ W.t()` and `x.t() @ grad`. Others chain ops of
one name (`DivBackward0`'s `(self / other) / other`, an inverse's `A^-T @ grad @ A^-T`)."""
MAX_DEPTH = 4
"""Ranges between an op and its node looked through (a formula's own helper ranges)."""


def backward_nodes(trace: LoadedTrace, ops: pl.DataFrame) -> pl.DataFrame:
    """Per op of `ops` run by an autograd node: event, `_node` (the node's range) and
    `_node_seq` (its sequence number: its forward op's)."""
    tree = trace.ops.select(
        pl.col("event").cast(pl.Int64),
        pl.col("parent").cast(pl.Int64),
        "name",
        "sequence_number",
    )
    nodes = tree.filter(autograd.is_formula() & pl.col("sequence_number").is_not_null()).select(
        pl.col("event").alias("_up"),
        pl.col("sequence_number").alias("_node_seq"),
        pl.col("name").str.replace(r"^.*: ", "").alias("_node_name"),
    )
    walk = ops.select("event", pl.col("parent").cast(pl.Int64).alias("_up"))
    found = []
    for _ in range(MAX_DEPTH):
        hit = walk.join(nodes, on="_up")
        found.append(hit.select("event", pl.col("_up").alias("_node"), "_node_seq", "_node_name"))
        walk = (
            walk.join(hit, on="event", how="anti")
            .join(
                tree.select(pl.col("event").alias("_up"), pl.col("parent").alias("_next")), on="_up"
            )
            .select("event", pl.col("_next").alias("_up"))
            .drop_nulls("_up")
        )
        if walk.height == 0:
            break
    return pl.concat(found).unique("event")


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`backward_reads` as a reader (`readers.READERS`)."""
    return backward_reads(edges, flow.trace, flow.ops)


def backward_reads(edges: pl.DataFrame, trace: LoadedTrace, ops: pl.DataFrame) -> pl.DataFrame:
    """`edges` without those into an op of a backward node from a forward value its
    forward op did not read or save, or, in a node of `ONE_OP_FORMULAS`, from an op of
    the consumer's name in the same node."""
    if edges.height == 0 or "sequence_number" not in trace.ops.columns:
        return edges
    in_node = backward_nodes(trace, ops)
    if in_node.height == 0:
        return edges
    # forward ops: the semantic ops that recorded autograd history (a sequence number, on
    # them or an op they ran) outside any backward node; a node's forward op is the last
    # of them with its number (`linear` for the `addmm` it ran)
    numbered = trace.ops.filter(pl.col("sequence_number").is_not_null()).select(
        pl.col("event").cast(pl.Int64), "sequence_number", "ts_ns"
    )
    forward = semantic_roots(numbered, trace, ops).join(in_node, on="event", how="anti")
    roots = (
        forward.sort("ts_ns")
        .group_by("sequence_number")
        .agg(pl.col("event").last().alias("_forward"))
    )
    forward = forward.select("event").unique()
    read_by_forward = edges.select(
        pl.col("producer"), pl.col("consumer").alias("_forward"), pl.lit(True).alias("_saved")
    ).unique(["producer", "_forward"])
    names = ops.select("event", "name")
    judged = (
        edges.with_row_index("_row")
        .join(in_node.rename({"event": "consumer"}), on="consumer")
        .join(roots.rename({"sequence_number": "_node_seq"}), on="_node_seq", how="left")
        .join(
            forward.select(pl.col("event").alias("producer"), pl.lit(True).alias("_pfwd")),
            on="producer",
            how="left",
        )
        .join(read_by_forward, on=["producer", "_forward"], how="left")
        .join(
            in_node.select(pl.col("event").alias("producer"), pl.col("_node").alias("_pnode")),
            on="producer",
            how="left",
        )
        .join(names.rename({"event": "producer", "name": "_pname"}), on="producer", how="left")
        .join(names.rename({"event": "consumer", "name": "_cname"}), on="consumer", how="left")
    )
    # its own result only where it saves it (`inferred` gave it a `fwdbwd` edge)
    saves_result = pl.col("producer").is_in(
        edges.filter(pl.col("evidence") == "fwdbwd")["producer"].implode()
    )
    unsaved = (
        pl.col("_pfwd").fill_null(False)
        & pl.col("_forward").is_not_null()
        & ~((pl.col("producer") == pl.col("_forward")) & saves_result)
        & ~pl.col("_saved").fill_null(False)
    )
    # a node whose formulas are one op each reads no op of its own name in the node
    sibling = (
        (pl.col("_pnode") == pl.col("_node"))
        & pl.col("_node_name").is_in(list(ONE_OP_FORMULAS))
        & (pl.col("_pname") == pl.col("_cname"))
    ).fill_null(False)
    dropped = judged.filter(unsaved | sibling).select("_row")
    return edges.with_row_index("_row").join(dropped, on="_row", how="anti").drop("_row")


def semantic_roots(numbered: pl.DataFrame, trace: LoadedTrace, ops: pl.DataFrame) -> pl.DataFrame:
    """`numbered` with `event` the op of `ops` each ran in: itself, or the nearest enclosing
    one within `MAX_DEPTH` levels (rows with none are dropped); other columns kept."""
    semantic = ops.select("event")
    parents = trace.ops.select(
        pl.col("event").cast(pl.Int64).alias("_up"), pl.col("parent").cast(pl.Int64).alias("_next")
    )
    walk = numbered.rename({"event": "_up"})
    kept = [c for c in walk.columns if c != "_up"]
    found = []
    for _ in range(MAX_DEPTH):
        hit = walk.join(semantic, left_on="_up", right_on="event", how="semi")
        found.append(hit.rename({"_up": "event"}))
        walk = (
            walk.join(hit, on="_up", how="anti")
            .join(parents, on="_up")
            .select(pl.col("_next").alias("_up"), *kept)
            .drop_nulls("_up")
        )
        if walk.height == 0:
            break
    return pl.concat(found)
