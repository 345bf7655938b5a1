"""Data flow through 0-d tensors: the few reads of a scalar-in-a-tensor the trace settles.

Shape matching (`matching`) leaves 0-d tensors out: every 0-d value has the one shape
`[]`, and host-side arithmetic keeps several alive at once (a DDIM step holds
`alpha_prod_t`, `alpha_prod_t_prev`, `beta_prod_t`, ... side by side, each read later and
out of order), so "the most recent value of the shape" is wrong about as often as right:
against the Execution Trace corpus, shape matching on 0-d inputs made 132 wrong edges for
117 right ones (edge precision 0.960 -> 0.935). Nor can a 0-d `long int` input be told
from a wrapped Python int (`t - 20` records the 20 as a 0-d `long int` tensor too; a
Python float is recorded as `double`).

What is left is the read of the value computed by the op just before, in three cases
where the trace says that value is an operand and not a variable kept for later:

- a 0-d bool made to be tested: `if (t >= 0):`, `while not done.any():`,
  `flag.item()` run `is_nonzero` / `item` right after the comparison or reduction;
- a power of a 0-d value, `alpha_t ** 0.5`, used as a coefficient at once
  (`alpha_t ** 0.5 * x`, `(1 - a - s ** 2)`): Python evaluates an operand right before
  the operator that reads it;
- `torch.tensor(v)` building a 0-d tensor: `empty`, then `to`, `lift_fresh` and
  `detach_`, each on what the one before returned (`TENSOR_STEPS`);
- `loss.backward()` seeding the gradient: `ones_like(loss)` right after the loss, read
  by the first op of the backward pass at its 0-d gradient argument (`gradient_seed_edges`).

The consumer reads it at its last 0-d tensor argument of that dtype (the operand
evaluated last). Against the corpus these rules make 75 edges (26 tested bools, 24
powers, 25 `torch.tensor` steps), all of them right (the ET's tensor ids); a variable
assigned from a power and read two statements later (`s = a ** 0.5; b = 1 - c; s * b`)
would be read wrong, and none of the corpus has one.

Reads: a weighted sum of two products with 0-d coefficients, `a * x + b * y` (the reader is
`weighted_sum_reads`; `scalar_edges` is one of `inferred`'s base edges). Appears in:
diffusion schedulers' updates (DDIM in DiT and the UNet); corpus entries whose edges it
changes: `dit`, `unet`. On the ET corpus: +8 right, -12 wrong, -8 missed edges (without it:
precision 0.993, recall 0.960; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import THREAD, edge_of, returns_bool

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

CONFIDENCE = 0.75
"""One adjacent op, of a kind whose result the corpus always saw read at once."""
EVIDENCE = "scalar+previous-op"
WRAPPED_FLOAT = "double"
"""The `Input type` of a Python float passed where a tensor goes (`x * 0.5`)."""
POWERS = ("pow", "square")
COEFFICIENT_DTYPES = ("float", "c10::Half", "c10::BFloat16")
"""Dtypes a 0-d coefficient tensor is told from a wrapped Python number by (`double`)."""
TENSOR_STEPS = frozenset({"aten::to", "aten::lift_fresh", "aten::detach_", "aten::detach"})
"""What `torch.tensor(v)` runs on the 0-d tensor it just made (`empty`, then these, each
on the tensor the one before returned): `generate`'s `pad_token_id` and EOS tensors."""


def scalar_edges(nodes: pl.DataFrame) -> pl.DataFrame:
    """Edges into 0-d tensor inputs from the op just before (same thread, step and
    enclosing op): producer, consumer, input_index, shape ([]), confidence, evidence."""
    scope = [*THREAD, "_tree"]
    base = shapes.base_name()
    ordered = nodes.sort("_seq").with_columns(
        pl.col("event").shift(1).over(scope).alias("producer")
    )
    producers = nodes.filter(pl.col("output_shape").list.len() == 0).select(
        pl.col("event").alias("producer"),
        returns_bool().alias("_pbool"),
        base.is_in(POWERS).alias("_ppow"),
        pl.col("dtype").alias("_pdtype"),
    )
    zero_dim = (
        ordered.select(
            "event",
            "producer",
            "input_types",
            "data_inputs",
            pl.col("name").is_in(TENSOR_STEPS).alias("_step"),
            pl.col("name").is_in(SEEDS).alias("_seed"),
        )
        .drop_nulls("producer")
        .explode("data_inputs")
        .unnest("data_inputs")
        .filter(pl.col("shape").list.len() == 0)
        .with_columns(
            pl.col("input_types").list.get(pl.col("index"), null_on_oob=True).alias("_dtype")
        )
        .filter(pl.col("_dtype") != WRAPPED_FLOAT)
    )
    tested = pl.col("_pbool") & (pl.col("_dtype") == "bool")
    seeded = pl.col("_seed") & (pl.col("_dtype") == pl.col("_pdtype"))
    coefficient = pl.col("_ppow") & (pl.col("_dtype") == pl.col("_pdtype"))
    made = pl.col("_step") & (pl.col("_pdtype").is_null() | (pl.col("_dtype") == pl.col("_pdtype")))
    seed = gradient_seed_edges(nodes)
    return pl.concat(
        [
            zero_dim.join(producers, on="producer")
            .filter((tested | coefficient | made | seeded).fill_null(False))
            .sort("index")
            .unique("event", keep="last")
            .select(
                "producer",
                pl.col("event").alias("consumer"),
                pl.col("index").alias("input_index"),
                pl.col("shape").cast(pl.List(pl.Int64)),
                pl.lit(CONFIDENCE).alias("confidence"),
                pl.lit(EVIDENCE).alias("evidence"),
            ),
            seed,
        ]
    )


SEEDS = frozenset({"aten::ones_like"})
"""What `loss.backward()` runs first: the gradient of the loss, `ones_like(loss)`."""


def gradient_seed_edges(nodes: pl.DataFrame) -> pl.DataFrame:
    """The seed gradient -> the first op of the backward pass that reads a 0-d tensor of
    its dtype (`mse_loss_backward(grad, input, target)`), on its thread and step.

    The backward pass runs in autograd nodes, not beside the seed, so "the op just before"
    does not reach it; but the engine starts with the loss's node, whose first op that
    takes a 0-d gradient is the seed's reader. This is the path from a loss to its
    backward: the backward node's own ops read the loss's inputs, not its result."""
    seeds = nodes.filter(
        pl.col("name").is_in(SEEDS) & (pl.col("output_shape").list.len() == 0)
    ).select(*THREAD, pl.col("event").alias("producer"), pl.col("_seq").alias("_pseq"), "dtype")
    if seeds.height == 0:
        return pl.DataFrame(schema=_SEED_SCHEMA)
    types = pl.col("input_types")
    readers = (
        nodes.filter(pl.col("parent").is_not_null())
        .select(*THREAD, "event", "_seq", "input_types", "data_inputs")
        .explode("data_inputs")
        .unnest("data_inputs")
        .filter(pl.col("shape").list.len() == 0)
        .with_columns(types.list.get(pl.col("index"), null_on_oob=True).alias("dtype"))
        .sort("_seq")
    )
    first = seeds.sort("_pseq").join_asof(
        readers,
        left_on="_pseq",
        right_on="_seq",
        by=[*THREAD, "dtype"],
        strategy="forward",
        allow_exact_matches=False,
        check_sortedness=False,
    )
    return first.drop_nulls("event").select(
        "producer",
        pl.col("event").alias("consumer"),
        pl.col("index").alias("input_index"),
        pl.col("shape").cast(pl.List(pl.Int64)),
        pl.lit(CONFIDENCE).alias("confidence"),
        pl.lit("gradient-seed").alias("evidence"),
    )


_SEED_SCHEMA = {
    "producer": pl.Int64,
    "consumer": pl.Int64,
    "input_index": pl.Int64,
    "shape": pl.List(pl.Int64),
    "confidence": pl.Float64,
    "evidence": pl.String,
}


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`weighted_sum_reads` as a reader (`readers.READERS`)."""
    return weighted_sum_reads(edges, flow.nodes)


def weighted_sum_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`a * x + b * y` with `a`, `b` 0-d tensors: both products are the sum's operands.

    A scheduler's update is a weighted sum of tensors of one shape (DDIM's `prev_sample =
    alpha_prev ** 0.5 * x0 + direction`, with `direction = c ** 0.5 * eps` computed just
    before). By shape and order the second product reads the first (`b * (a * x)`) and the
    sum reads an older value beside it. Where a `mul` of a 0-d tensor and a value of shape
    S (the first product) is read only by a second such `mul`, which an `add` of two values
    of shape S then reads beside another value, the two products are the sum's operands:
    the second product reads what the first was given, and the first product's own input,
    some older value of S, is left without an edge (unknown beats wrong). Written that way
    (`b * (a * x) + z`, two 0-d coefficients in a row) nothing in the corpus has it; the
    weighted sum is in both diffusion entries, twice each (the ET: every such reading was
    wrong). The sum's argument order is not known: the first product takes the slot of the
    value it replaces. A coefficient is a 0-d tensor of the product's own floating dtype:
    `x * 0.5 * 2.0 + z` records its Python floats as `double` and stays as read.
    """
    if edges.height == 0:
        return edges
    base = shapes.base_name()
    inputs = pl.col("data_inputs")
    scalar = inputs.list.eval(pl.element().struct.field("shape").list.len() == 0).list.sum()
    types = pl.col("input_types")
    info = nodes.select(
        "event",
        base.alias("_base"),
        scalar.alias("_n_scalar"),
        (inputs.list.len() - scalar).alias("_n_tensor"),
        "_out_shape",
        types.list.get(0, null_on_oob=True).alias("_t0"),
        types.list.get(1, null_on_oob=True).alias("_t1"),
    )
    # a 0-d tensor of the product's own floating dtype: a wrapped Python number is
    # recorded as `double` (a float) or `long int` (an int), never as `float`
    coefficient = (pl.col("_t0") == pl.col("_t1")) & pl.col("_t0").is_in(COEFFICIENT_DTYPES)
    scaled = info.filter(
        (pl.col("_base") == "mul")
        & (pl.col("_n_scalar") == 1)
        & (pl.col("_n_tensor") == 1)
        & coefficient.fill_null(False)
    ).select("event", "_out_shape")
    sums = info.filter((pl.col("_base") == "add") & (pl.col("_n_tensor") == 2)).select(
        "event", "_out_shape"
    )
    tensor_edges = edges.filter(pl.col("shape").list.len() > 0)
    readers = tensor_edges.group_by("producer").agg(pl.len().alias("_readers"))
    first = tensor_edges.join(scaled, left_on="producer", right_on="event").join(
        scaled, left_on="consumer", right_on="event", suffix="_c"
    )
    first = (
        first.filter(pl.col("_out_shape") == pl.col("_out_shape_c"))
        .join(readers.filter(pl.col("_readers") == 1), on="producer", how="semi")
        .select(
            pl.col("producer").alias("_m1"),
            pl.col("consumer").alias("_m2"),
            pl.col("input_index").alias("_m2_index"),
            "_out_shape",
        )
    )
    into_sum = tensor_edges.join(sums, left_on="consumer", right_on="event").select(
        "producer", "consumer", "input_index", "_out_shape"
    )
    found = (
        first.join(
            into_sum.select(pl.col("producer").alias("_m2"), pl.col("consumer").alias("_sum")),
            on="_m2",
        )
        .join(
            into_sum.rename(
                {"producer": "_beside", "consumer": "_sum", "input_index": "_sum_index"}
            ),
            on=["_sum", "_out_shape"],
        )
        .filter((pl.col("_beside") != pl.col("_m2")) & (pl.col("_beside") != pl.col("_m1")))
        .unique("_m1", keep="first")
    )
    if found.height == 0:
        return edges
    given = tensor_edges.select(
        pl.col("consumer").alias("_m1"), pl.col("producer").alias("_given")
    ).unique("_m1", keep="first")
    found = found.join(given, on="_m1", how="left")
    key = ["producer", "consumer", "input_index"]
    dropped = pl.concat(
        [
            found.select(
                *edge_of("_m1", "_m2", "_m2_index"),
            ),
            found.select(
                *edge_of("_beside", "_sum", "_sum_index"),
            ),
            found.drop_nulls("_given").select(*edge_of("_given", "_m1")),
        ],
        how="diagonal_relaxed",
    )
    moved = pl.concat(
        [
            found.drop_nulls("_given").select(
                *edge_of("_given", "_m2", "_m2_index", _from="_m1"),
            ),
            found.select(
                *edge_of("_m1", "_sum", "_sum_index", _from="_beside"),
            ),
        ]
    )
    # the moved edges keep the confidence and evidence of the edges they replace
    old = edges.select(
        pl.col("producer").alias("_from"),
        "consumer",
        "input_index",
        "shape",
        "confidence",
        pl.concat_str("evidence", pl.lit("+weighted-sum")).alias("evidence"),
    )
    rewired = moved.join(old, on=["_from", "consumer", "input_index"]).drop("_from")
    kept = edges.join(
        dropped.filter(pl.col("input_index").is_not_null()), on=key, how="anti", nulls_equal=True
    ).join(
        dropped.filter(pl.col("input_index").is_null()).select("producer", "consumer"),
        on=["producer", "consumer"],
        how="anti",
    )
    return pl.concat([kept, rewired.select(edges.columns)], how="vertical_relaxed")
