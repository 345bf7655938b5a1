"""SGD walks `model.parameters()`: a module's own parameters, then its submodules'.

`optimizer_steps` pairs the k-th SGD `add_(param, grad)` of a shape with the k-th stored
gradient of that shape, latest-made first: the backward runs about in reverse of the
forward, and the forward about in registration order. A module that uses its own
parameters between its submodules' calls breaks that: Megatron's layer registers its
row-parallel biases itself, and its two LayerNorms as submodules, so `parameters()` yields
both biases before both norms' weights and biases although the forward uses them
interleaved (`ln1`, `dense_b`, `ln2`, `down_b`), and steps of one shape read each other's
gradients.

`model.parameters()` is `named_modules()` in pre-order, each module's own `_parameters`
first. The trace says which module each gradient belongs to: AccumulateGrad runs as soon
as the node that made the gradient returns (the engine ranks it above every numbered
node), so the node run last before it made the gradient; that node carries its forward
op's sequence number, and the forward op its module path (`with_modules`). So each
stored gradient gets the key (first call of each module of its path, in order; then the
parameter's own use: its forward op, then the order the node stored them in: a norm's
weight before its bias), and where every gradient of a shape has one, the k-th step of
the shape reads the k-th gradient by that key.

Reads: SGD's `add_(param, grad)` paired by `optimizer_steps`. Appears in: models that
register parameters of one shape out of forward order (Megatron's layer, any module with
parameters of its own beside submodules); corpus entries whose edges it changes:
`tp_train`. On the ET corpus: +12 right, -12 wrong, -12 missed edges (without it:
precision 0.987, recall 0.957; `tp_train` 0.928 / 0.920 -> 0.960 / 0.952, every one of its
24 steps the ET's; the training steps 0.937 / 0.912 without it, 0.953 / 0.928 with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations import autograd
from traceq.relations.dataflow.readers.optimizer_steps import STORES_GRADIENT

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

EVIDENCE = "shape+optimizer-step"
"""What `optimizer_steps` calls an SGD step's read of its gradient."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`parameter_order_reads` as a reader (`readers.READERS`)."""
    return parameter_order_reads(edges, flow)


def parameter_order_reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`edges` with SGD's steps of each shape reading the stored gradients in
    `model.parameters()` order (see the module's docstring)."""
    steps = edges.filter(pl.col("evidence") == EVIDENCE)
    if steps.height < 2 or "sequence_number" not in flow.all_ops.columns:
        return edges
    keys = _parameter_keys(steps["producer"], flow)
    if not keys:
        return edges
    shape_of = dict(flow.nodes.select("event", "_out_shape").iter_rows())
    seq_of = dict(flow.nodes.select("event", "_seq").iter_rows())
    groups: dict[object, list[tuple[int, int]]] = {}
    for producer, consumer in steps.select("producer", "consumer").iter_rows():
        groups.setdefault(shape_of.get(producer), []).append((producer, consumer))
    moved = []
    # one row per parameter: a handful to a few hundred, each group sorted once
    for pairs in groups.values():
        gradients = [producer for producer, _ in pairs]
        if len(pairs) < 2 or any(g not in keys for g in gradients):
            continue
        ordered = sorted(gradients, key=lambda g: (keys[g], seq_of[g]))
        in_order = sorted((consumer for _, consumer in pairs), key=seq_of.__getitem__)
        moved += [(g, c) for g, c in zip(ordered, in_order, strict=True)]
    if not moved:
        return edges
    paired = pl.DataFrame(moved, schema={"producer": pl.Int64, "consumer": pl.Int64}, orient="row")
    read = (
        steps.drop("producer")
        .join(paired, on="consumer")
        .drop("shape")
        .join(
            flow.nodes.select(
                pl.col("event").alias("producer"), pl.col("output_shape").alias("shape")
            ),
            on="producer",
        )
    )
    kept = edges.join(paired.select("consumer"), on="consumer", how="anti")
    step_reads = edges.join(paired.select("consumer"), on="consumer").filter(
        pl.col("evidence") != EVIDENCE
    )
    return pl.concat([kept, step_reads, read.select(edges.columns)], how="vertical_relaxed")


def _parameter_keys(gradients: pl.Series, flow: Flow) -> dict[int, tuple[int, ...]]:
    """Per stored gradient (`detach` event) whose parameter's module is known: the
    `parameters()` sort key (first call of each module on its path, -1, its forward op's
    start)."""
    ops = flow.all_ops.select(
        pl.col("event").cast(pl.Int64),
        pl.col("parent").cast(pl.Int64),
        "name",
        "pid",
        "tid",
        "ts_ns",
        "sequence_number",
        "module",
    )
    frames = ops.filter(pl.col("name").str.contains(STORES_GRADIENT)).select(
        pl.col("event").alias("_frame"), "pid", "tid", "ts_ns"
    )
    stored = (
        flow.nodes.filter(pl.col("event").is_in(gradients.implode()))
        .select("event", pl.col("parent").cast(pl.Int64).alias("_frame"))
        .join(frames, on="_frame")
    )
    numbered = (
        ops.filter(
            pl.col("name").str.starts_with(autograd.ENGINE_FRAME)
            & pl.col("sequence_number").is_not_null()
        )
        .select("pid", "tid", "ts_ns", pl.col("sequence_number").alias("_node_seq"))
        .sort("ts_ns")
    )
    forward = (
        ops.filter(pl.col("module").is_not_null() & pl.col("sequence_number").is_not_null())
        .sort("ts_ns")
        .unique("sequence_number", keep="first")
        .select(
            pl.col("sequence_number").alias("_node_seq"),
            pl.col("module").alias("_path"),
            pl.col("ts_ns").alias("_forward_ts"),
        )
    )
    made = (
        stored.sort("ts_ns")
        .join_asof(
            numbered, on="ts_ns", by=["pid", "tid"], strategy="backward", check_sortedness=False
        )
        .join(forward, on="_node_seq")
    )
    first_call = dict(flow.trace.modules.group_by("path").agg(pl.col("ts_ns").min()).iter_rows())
    keys = {}
    for event, path, forward_ts in made.select("event", "_path", "_forward_ts").iter_rows():
        parts = path.split(".")
        starts = [first_call.get(".".join(parts[: i + 1])) for i in range(len(parts))]
        if None not in starts:
            keys[event] = (*starts, -1, forward_ts)
    return keys
