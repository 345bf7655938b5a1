"""A GEMM's backward node reads the operands its forward GEMM saved, as the formulas write them.

`AddmmBackward0`, `MmBackward0` and `BmmBackward0` compute each operand's gradient from
the gradient and the *other* operand, saved in the forward (`FunctionsManual.cpp`):

    mat1's: grad.mm(mat2.t())
    mat2's: mat1.t().mm(grad), or grad.t().mm(mat1).t() where mat2 is column-major
            (a `linear`'s `weight.t()`)
    bmm:    grad.bmm(mat2.transpose(1, 2)); self.transpose(1, 2).bmm(grad)

A saved operand was made long before the backward, and by shape the `t`, `transpose` or
`mm` reading it finds a value of the backward made just before (the previous node's
gradient, the node's own other `t`), or nothing once `backward_reads` has judged that
one. Each `t` or `transpose` of the node is read with the GEMM it feeds, the op right
after it: its result is that GEMM's second operand (`grad @ mat2.t()`) or, with the GEMM's
first, `mat1.t() @ grad` (or `grad.t() @ mat1`, by mat2's recorded strides). The
saved operand is the forward GEMM's argument: its producer where the forward op passed
an input straight through (`addmm(b, x, w)`, `matmul` of 2-d inputs, `linear`'s 2-d
input), else the forward op itself, which made it (`linear`'s `weight.t()` and the
flattened 3-d input, `matmul`'s batched reshapes, an autocast copy: the backward reads
another dtype than the forward op was given).

Reads: the saved operands of GEMM backward nodes (`t`, `transpose`, `mm`), the node's
gradient (every formula reads the one value), and a value of the node nothing reads once
those are set: the first read of its shape right after it (`TBackward0`'s `t` of the
weight's gradient). Appears in: every training step through `linear`, `addmm`, `matmul` or
`bmm`; corpus entries whose edges it changes: `cnn_train`, `ddp_train`, `gpt2_train_ce`,
`tp_train`. On the ET corpus: +59 right, -24 wrong, -59 missed edges (without it: precision
0.982, recall 0.948; `gpt2_train_ce` 0.871 / 0.809 -> 0.914 / 0.869, `tp_train` 0.885 /
0.819 -> 0.928 / 0.920, `ddp_train` 60 -> 62 right; the training steps 0.889 / 0.828
without it, 0.926 / 0.903 with it).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import CONFIDENCE
from traceq.relations.dataflow.readers.backward_reads import backward_nodes, semantic_roots

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

OPERANDS = {"addmm": (1, 2), "mm": (0, 1), "bmm": (0, 1)}
"""The forward GEMMs whose nodes are read here, and where their two operands are."""
NODES = {"AddmmBackward0": "addmm", "MmBackward0": "mm", "BmmBackward0": "bmm"}
"""Each node and the forward GEMM whose sequence number it carries."""
GEMM_IN_NODE = {"addmm": "mm", "mm": "mm", "bmm": "bmm"}
"""The GEMM each node's formulas run."""
TRANSPOSES = ("t", "transpose")
"""What a formula applies to a saved operand (or the gradient) before its GEMM."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`saved_operand_reads` as a reader (`readers.READERS`)."""
    return saved_operand_reads(edges, flow)


def saved_operand_reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`edges` with each read of a saved operand in a GEMM's backward node starting at
    the operand's maker (see the module's docstring)."""
    if edges.height == 0 or "sequence_number" not in flow.all_ops.columns:
        return edges
    in_node = backward_nodes(flow.trace, flow.ops)
    if in_node.height == 0:
        return edges
    any_node, in_node = in_node, in_node.filter(pl.col("_node_name").is_in(list(NODES)))
    gemms = _forward_gemms(flow)
    if in_node.height == 0 or gemms.height == 0:
        return edges
    node_ops = (
        flow.nodes.join(in_node, on="event")
        .join(gemms, left_on="_node_seq", right_on="sequence_number")
        .sort("_seq")
        .select(
            "event",
            "_seq",
            "_node",
            shapes.base_name().alias("_op"),
            "shapes",
            "input_types",
            "output_shape",
            "_gemm",
            "_gemm_name",
            "_gemm_dims",
            "_gemm_types",
            "_gemm_strides",
            "_forward",
            "_forward_name",
            "_forward_dims",
            "_forward_types",
        )
    )
    rows, grads, feeds = [], [], []
    for (node,), ops in node_ops.group_by("_node", maintain_order=True):
        saved, grad, feed = _node_reads(ops.to_dicts())
        rows += saved
        grads += [(node, *g) for g in grad]
        feeds += feed
    if not rows:
        return edges
    wanted = pl.DataFrame(
        rows,
        schema={
            "consumer": pl.Int64,
            "input_index": pl.Int64,
            "_forward": pl.Int64,
            "_operand": pl.Int64,
            "_inside": pl.Boolean,
        },
        orient="row",
    )
    into_forward = edges.filter(pl.col("input_index").is_not_null()).select(
        pl.col("consumer").alias("_forward"),
        pl.col("input_index").alias("_operand"),
        pl.col("producer").alias("_passed"),
    )
    read = (
        wanted.join(
            into_forward.unique(["_forward", "_operand"]), on=["_forward", "_operand"], how="left"
        )
        .with_columns(
            pl.when(pl.col("_inside"))
            .then(pl.col("_forward"))
            .otherwise(pl.col("_passed"))
            .alias("producer")
        )
        .select("producer", "consumer", "input_index")
    )
    read = pl.concat([read, _gradient_reads(edges, grads, node_ops, flow.nodes)])
    read = read.join(
        flow.nodes.select(pl.col("event").alias("consumer"), "data_inputs"), on="consumer"
    ).with_columns(
        pl.col("data_inputs")
        .list.get(pl.col("input_index"), null_on_oob=True)
        .struct.field("shape")
        .alias("shape"),
        pl.lit(CONFIDENCE["fwdbwd"]).alias("confidence"),
        pl.lit("shape+saved-operand").alias("evidence"),
    )
    key = ["consumer", "input_index"]
    fed = pl.DataFrame(feeds, schema={"producer": pl.Int64, "_gemm": pl.Int64}, orient="row")
    astray = edges.join(fed, on="producer").filter(pl.col("consumer") != pl.col("_gemm"))
    kept = edges.join(read.select(key), on=key, how="anti").join(
        astray.select("producer", "consumer"), on=["producer", "consumer"], how="anti"
    )
    result = pl.concat(
        [kept, read.drop_nulls("producer").select(edges.columns)], how="vertical_relaxed"
    )
    freed = (
        node_ops.select(pl.col("event").alias("producer"))
        .vstack(edges.select("producer").unique())
        .unique()
        .join(result, on="producer", how="anti")
    )
    return _reoffered(result, freed, flow.nodes, any_node)


def _gradient_reads(
    edges: pl.DataFrame, grads: list[tuple], node_ops: pl.DataFrame, nodes: pl.DataFrame
) -> pl.DataFrame:
    """Every read of the gradient in a node reads one value: the one that most of them
    read now from outside the node (of those as many, the most recent)."""
    schema = {"producer": pl.Int64, "consumer": pl.Int64, "input_index": pl.Int64}
    if not grads:
        return pl.DataFrame(schema=schema)
    reads = pl.DataFrame(
        grads,
        schema={"_node": pl.Int64, "consumer": pl.Int64, "input_index": pl.Int64},
        orient="row",
    )
    inside = node_ops.select(pl.col("event").alias("producer"), "_node")
    source = (
        reads.join(
            edges.select("producer", "consumer", "input_index"), on=["consumer", "input_index"]
        )
        .join(inside, on=["producer", "_node"], how="anti")
        .join(nodes.select(pl.col("event").alias("producer"), "_seq"), on="producer")
        .group_by("_node", "producer")
        .agg(pl.len(), pl.col("_seq").first())
        .sort("len", "_seq", descending=[True, True])
        .unique("_node", keep="first")
        .select("_node", "producer")
    )
    return reads.join(source, on="_node").select(list(schema))


REOFFER_REACH = 6
"""How many ops after a value whose reader a formula took away the next read of its
shape may run (the next node's first op)."""


def _reoffered(
    edges: pl.DataFrame, freed: pl.DataFrame, nodes: pl.DataFrame, in_node: pl.DataFrame
) -> pl.DataFrame:
    """A value of a GEMM's node, or one whose reader reads a saved operand now, that
    nothing reads goes to the first op within `REOFFER_REACH` after it with an input of
    its shape that reads nothing, in another backward node (`in_node`) or none: a
    formula's result leaves its node."""
    if freed.height == 0:
        return edges
    seq = nodes.select("event", "pid", "tid", "_step", "_seq", "output_shape", "data_inputs")
    made = seq.join(freed.rename({"producer": "event"}), on="event").drop_nulls("output_shape")
    inputs = (
        seq.select("event", "pid", "tid", "_step", "_seq", "data_inputs")
        .explode("data_inputs")
        .unnest("data_inputs")
        .filter(pl.col("shape").list.len() > 0)
        .join(
            edges.select(pl.col("consumer").alias("event"), "input_index").drop_nulls(),
            left_on=["event", "index"],
            right_on=["event", "input_index"],
            how="anti",
        )
    )
    offered = (
        made.select(
            pl.col("event").alias("producer"),
            "pid",
            "tid",
            "_step",
            pl.col("_seq").alias("_pseq"),
            pl.col("output_shape").alias("shape"),
        )
        .join(inputs, on=["pid", "tid", "_step", "shape"])
        .join(in_node.select("event", "_node"), on="event", how="left")
        .join(
            in_node.select(pl.col("event").alias("producer"), pl.col("_node").alias("_pnode")),
            on="producer",
            how="left",
        )
        .filter(
            (pl.col("_node") != pl.col("_pnode")).fill_null(True)
            & (pl.col("_seq") > pl.col("_pseq"))
            & (pl.col("_seq") - pl.col("_pseq") <= REOFFER_REACH)
        )
        .sort("_seq")
        .unique("producer", keep="first")
        .unique(["event", "index"], keep="first")
        .select(
            "producer",
            pl.col("event").alias("consumer"),
            pl.col("index").alias("input_index"),
            "shape",
            pl.lit(CONFIDENCE["contested"]).alias("confidence"),
            pl.lit("shape+saved-operand-freed").alias("evidence"),
        )
    )
    return pl.concat([edges, offered.select(edges.columns)], how="vertical_relaxed")


def _forward_gemms(flow: Flow) -> pl.DataFrame:
    """Per sequence number of a forward GEMM of `OPERANDS`: its dims, types, strides
    (`_gemm_*`), and `_forward`, the semantic op it ran in, with that op's dims and
    types (`_forward_dims`, `_forward_types`)."""
    gemms = (
        flow.all_ops.filter(
            pl.col("sequence_number").is_not_null()
            & shapes.base_name().is_in(list(OPERANDS))
            & pl.col("shapes").is_not_null()
        )
        .sort("ts_ns")
        .unique("sequence_number", keep="first")
        .select(
            pl.col("event").cast(pl.Int64),
            "sequence_number",
            pl.col("event").cast(pl.Int64).alias("_gemm"),
            shapes.base_name().alias("_gemm_name"),
            pl.col("shapes").alias("_gemm_dims"),
            pl.col("input_types").alias("_gemm_types"),
            pl.col("input_strides").alias("_gemm_strides"),
        )
    )
    found = semantic_roots(gemms, flow.trace, flow.ops).rename({"event": "_forward"})
    forward = flow.nodes.select(
        pl.col("event").alias("_forward"),
        shapes.base_name().alias("_forward_name"),
        pl.col("shapes").alias("_forward_dims"),
        pl.col("input_types").alias("_forward_types"),
    )
    return found.join(forward, on="_forward")


def _node_reads(ops: list[dict]) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """One node's reads, in its order: of a saved operand (consumer, input index, forward
    op, forward input index, made inside the forward op), of the gradient (consumer,
    input index), and each transpose with the GEMM it feeds (`t`, GEMM)."""
    saved, grad, feeds = [], [], []
    for before, op in itertools.pairwise(ops):
        if before["_op"] not in TRANSPOSES or op["_op"] != GEMM_IN_NODE[op["_gemm_name"]]:
            continue
        dims, made = op["shapes"] or [], before["output_shape"]
        if len(dims) < 2 or made is None or dims[0] == dims[1]:
            continue
        first, second = OPERANDS[op["_gemm_name"]]
        feeds.append((before["event"], op["event"]))
        if made == dims[1]:  # grad @ mat2.t()
            saved.append(_saved(before, 0, second))
            grad.append((op["event"], 0))
        elif made == dims[0] and _column_major(op, second):  # grad.t() @ mat1
            saved.append(_saved(op, 1, first))
            grad.append((before["event"], 0))
        elif made == dims[0]:  # mat1.t() @ grad
            saved.append(_saved(before, 0, first))
            grad.append((op["event"], 1))
    return [row for row in saved if row is not None], grad, feeds


def _column_major(op: dict, at: int) -> bool:
    """Whether the forward GEMM's operand `at` was column-major (`weight.t()`)."""
    if op["_gemm_name"] == "bmm":
        return False
    dims, strides = op["_gemm_dims"], op["_gemm_strides"]
    if not dims or not strides or at >= len(dims) or at >= len(strides):
        return False
    size, stride = dims[at], strides[at]
    return len(size) == 2 and len(stride) == 2 and stride[0] == 1 and stride[1] == size[0]


def _saved(op: dict, index: int, at: int) -> tuple | None:
    """The read of the forward GEMM's operand `at` by `op`'s input `index`: the forward
    op's own input where it passed one straight through, else the forward op (it made it)."""
    gemm_dims, gemm_types = op["_gemm_dims"] or [], op["_gemm_types"] or []
    if at >= len(gemm_dims) or not op["shapes"] or index >= len(op["shapes"]):
        return None
    if op["shapes"][index] != gemm_dims[at]:
        return None  # the backward reads another shape than the forward GEMM saved
    read_type = (op["input_types"] or [None] * (index + 1))[index]
    forward_dims, forward_types = op["_forward_dims"] or [], op["_forward_types"] or []
    if op["_gemm"] == op["_forward"]:
        passed = at if at < len(gemm_types) and gemm_types[at] == read_type else None
    else:
        same = [
            j
            for j, (d, t) in enumerate(zip(forward_dims, forward_types, strict=False))
            if d == gemm_dims[at] and t == read_type
        ]
        # a `linear` passes its input through at most (its GEMM reads `weight.t()`)
        linear = op["_forward_name"] == "linear"
        passed = same[0] if len(same) == 1 and (not linear or same[0] == 0) else None
    if passed is None:
        return (op["event"], index, op["_forward"], -1, True)
    return (op["event"], index, op["_forward"], passed, False)
