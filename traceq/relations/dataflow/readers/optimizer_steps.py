"""A stored gradient is read by the optimizer, once per parameter, and by no backward op.

AccumulateGrad stores each parameter's gradient as a `detach` of it (`param.grad`). The
backward pass never reads that value again: a norm's backward takes the *parameter*
(`native_layer_norm_backward(..., weight, bias, ...)`), which has no producer in the step,
but shape and order give its `[hidden]` slots the `detach`es of the same shape made just
before (`accumulated_gradient_reads`). Those edges go.

Then SGD's `param.add_(grad, alpha=-lr)`, one per parameter: the parameter has no
producer in the step, so the `add_` reads one value, its gradient. Shape and order read
two: slot 0 takes the most recent value of the shape (a norm's backward, the previous
`add_`, a weight's `t`), slot 1 a gradient, and the `add_`s of one shape read each other
as a chain. The optimizer walks `model.parameters()` (registration order, which is mostly
forward order) and the backward stores gradients in about the reverse order, layer by
layer, with a backward op of several gradients storing them in argument order (a norm's
weight, then its bias). So where the top-level `add_`s of a shape are as many as the
unread stored gradients of that shape before them, the k-th `add_` reads the k-th
gradient ordered by its producer latest first, then in the order stored; that one edge
replaces both.

Reads: SGD's `add_(param, grad)` (`torch.optim.SGD`, single-tensor), a norm backward's
weight and bias slots. Appears in: training steps with SGD without DDP (`gpt2_train_ce`,
`tp_train`; DDP's `ddp_train` reads bucket views, left as they are); corpus entries whose
edges it changes: `gpt2_train_ce`, `tp_train`. On the ET corpus: +11 right, -61 wrong,
-11 missed edges (`gpt2_train_ce` 0.795 / 0.781 -> 0.871 / 0.809, `tp_train` 0.741 / 0.715
-> 0.829 / 0.723; the training steps 0.775 / 0.704 without it, 0.841 / 0.719 with it
before `bias_gelu`).
The limit: a model that registers its parameters out of forward order (`tp_train`'s
layer: both biases before both norms) gets wrong gradients for parameters of one shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations import autograd
from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import CONFIDENCE, THREAD, shape_key

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

STORES_GRADIENT = "AccumulateGrad"
"""The autograd node that stores a parameter's gradient (`param.grad = grad.detach()`)."""
STEP = "add_"
"""SGD's update of one parameter: `param.add_(grad, alpha=-lr)`."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`optimizer_step_reads` as a reader (`readers.READERS`)."""
    return optimizer_step_reads(edges, flow.nodes, flow.all_ops)


def stored_gradients(nodes: pl.DataFrame, all_ops: pl.DataFrame) -> pl.DataFrame:
    """`event`: the `detach`es AccumulateGrad ran (the gradients it stored)."""
    frames = all_ops.filter(pl.col("name").str.contains(STORES_GRADIENT)).select(
        pl.col("event").cast(pl.Int64).alias("parent")
    )
    return (
        nodes.filter(shapes.base_name() == "detach")
        .join(frames, on="parent", how="semi")
        .select("event")
    )


def optimizer_step_reads(
    edges: pl.DataFrame, nodes: pl.DataFrame, all_ops: pl.DataFrame
) -> pl.DataFrame:
    """`edges` with no backward op reading a stored gradient, and each SGD `add_` reading
    its parameter's gradient alone (see the module's docstring)."""
    stored = stored_gradients(nodes, all_ops)
    if edges.height == 0 or stored.height == 0:
        return edges
    in_backward = all_ops.filter(
        autograd.is_node() & ~pl.col("name").str.contains(STORES_GRADIENT)
    ).select(pl.col("event").cast(pl.Int64).alias("parent"))
    backward_ops = nodes.join(in_backward, on="parent", how="semi").select("event")
    edges = edges.join(
        edges.join(stored, left_on="producer", right_on="event", how="semi")
        .join(backward_ops, left_on="consumer", right_on="event", how="semi")
        .select("producer", "consumer", "input_index"),
        on=["producer", "consumer", "input_index"],
        how="anti",
        nulls_equal=True,
    )
    return _sgd_steps(edges, nodes, stored)


def _sgd_steps(edges: pl.DataFrame, nodes: pl.DataFrame, stored: pl.DataFrame) -> pl.DataFrame:
    """Each top-level `add_` of two same-shaped tensors reads one stored gradient."""
    data = pl.col("data_inputs")
    first, second = (
        shape_key(data.list.get(i, null_on_oob=True).struct.field("shape")) for i in (0, 1)
    )
    steps = nodes.filter(
        (shapes.base_name() == STEP)
        & pl.col("parent").is_null()
        & (pl.col("_call") == -1)
        & (first == second).fill_null(False)
    ).select(*THREAD, "event", "_seq", first.alias("_shape"))
    if steps.height == 0:
        return edges
    # the stored gradients nothing but these steps reads, each with the op that made it
    others = edges.join(steps.select("event"), left_on="consumer", right_on="event", how="anti")
    made_by = edges.filter(pl.col("input_index") == 0).select(
        pl.col("consumer").alias("event"), pl.col("producer").alias("_maker")
    )
    seq = nodes.select(pl.col("event").alias("_maker"), pl.col("_seq").alias("_maker_seq"))
    gradients = (
        nodes.join(stored, on="event", how="semi")
        .join(others, left_on="event", right_on="producer", how="anti")
        .select(*THREAD, "event", "_seq", "_out_shape")
        .join(made_by.unique("event"), on="event", how="left")
        .join(seq, on="_maker", how="left")
        .rename({"_out_shape": "_shape"})
    )
    first_step = steps.group_by(*THREAD, "_shape").agg(pl.col("_seq").min().alias("_first"))
    gradients = gradients.join(first_step, on=[*THREAD, "_shape"]).filter(
        pl.col("_seq") < pl.col("_first")
    )
    counted = [*THREAD, "_shape"]
    ranked_steps = steps.sort("_seq").with_columns(
        pl.int_range(pl.len()).over(counted).alias("_rank"), pl.len().over(counted).alias("_n")
    )
    ranked_gradients = gradients.sort(
        pl.col("_maker_seq").fill_null(pl.col("_seq")), "_seq", descending=[True, False]
    ).with_columns(
        pl.int_range(pl.len()).over(counted).alias("_rank"), pl.len().over(counted).alias("_n")
    )
    paired = ranked_steps.join(ranked_gradients, on=[*counted, "_rank", "_n"], suffix="_g")
    if paired.height == 0:
        return edges
    shape_of = nodes.select(
        pl.col("event").alias("producer"), pl.col("output_shape").alias("shape")
    )
    read = (
        paired.select(
            pl.col("event_g").alias("producer"),
            pl.col("event").alias("consumer"),
            pl.lit(1, pl.Int64).alias("input_index"),
        )
        .join(shape_of, on="producer")
        .with_columns(
            pl.lit(CONFIDENCE["same-module"]).alias("confidence"),
            pl.lit("shape+optimizer-step").alias("evidence"),
        )
    )
    kept = edges.join(paired.select(pl.col("event").alias("consumer")), on="consumer", how="anti")
    return pl.concat([kept, read.select(edges.columns)], how="vertical_relaxed")
