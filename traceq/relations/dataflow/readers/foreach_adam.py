"""Multi-tensor Adam reads its tensor lists as `torch.optim` writes them.

`torch.optim.Adam(foreach=True)` (and AdamW; the default on a GPU) updates every parameter
of a group with one `_foreach_*` op per formula (`adam._multi_tensor_adam`):

    _foreach_add_(state_steps, 1)                       # step += 1
    _foreach_lerp_(exp_avgs, grads, 1 - beta1)          # m = lerp(m, g)
    _foreach_mul_(exp_avg_sqs, beta2)                   # v = beta2 * v ...
    _foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)  # ... + (1 - beta2) g * g
    step.item() per parameter, twice                    # the bias corrections
    denom = _foreach_sqrt(exp_avg_sqs)
    _foreach_div_(denom, ...); _foreach_add_(denom, eps)
    _foreach_addcdiv_(params, exp_avgs, denom, step_size)

The gradients, both moments, the parameters and the denominators are lists of one and the
same list of shapes, so shape and order cannot tell them apart, and list arguments get
no edge at all: the optimizer's ops read nothing and are read by nothing. An in-place op
writes its first list, so the ops above, read in that order, say which op last wrote each
list: the moments and the parameters were written before the step (no producer in it),
the gradients are the values AccumulateGrad stored (`optimizer_steps.stored_gradients`),
`item` reads the steps `_foreach_add_` wrote. The L2 and decoupled weight decay
(`_foreach_add(grads, params)`, AdamW's `_foreach_mul_(params, ...)`), `maximize`
(`_foreach_neg(grads)`) and `amsgrad` (`_foreach_maximum_`) are read too; a run of
foreach ops that holds an op not in `ROLES` (`capturable=True`'s `_foreach_pow`) gets no
edges (unknown beats wrong).

Reads: `torch.optim.Adam`/`AdamW` with `foreach=True`, `capturable=False`. Appears in: GPU
training steps with Adam (`cnn_train`); corpus entries whose edges it changes:
`cnn_train`. On the ET corpus: +47 right, +0 wrong, -47 missed edges (without it:
precision 0.986, recall 0.949; `cnn_train` 0.906 / 0.471 -> 0.950 / 0.931, the training
steps 0.921 / 0.841 without it, 0.926 / 0.903 with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import CONFIDENCE, THREAD, edge_rows, shape_key
from traceq.relations.dataflow.readers.optimizer_steps import stored_gradients

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

PHASES = ("decay", "moments", "denominator")
"""Where `_multi_tensor_adam` is: before the first moment's `lerp_`, up to the square
root, after it."""
ROLES: dict[tuple[str, str], tuple[tuple[str, ...], str, str]] = {
    ("_foreach_neg", "decay"): (("grads",), "grads", "decay"),  # maximize
    ("_foreach_add", "decay"): (("grads", "params"), "grads", "decay"),  # L2 decay
    ("_foreach_add_", "decay"): (("grads", "params"), "grads", "decay"),  # ... maximized
    ("_foreach_mul_", "decay"): (("params",), "params", "decay"),  # AdamW
    ("_foreach_lerp_", "decay"): (("exp_avgs", "grads"), "exp_avgs", "moments"),
    ("_foreach_mul_", "moments"): (("exp_avg_sqs",), "exp_avg_sqs", "moments"),
    ("_foreach_addcmul_", "moments"): (("exp_avg_sqs", "grads", "grads"), "exp_avg_sqs", "moments"),
    ("_foreach_maximum_", "moments"): (
        ("max_exp_avg_sqs", "exp_avg_sqs"),
        "max_exp_avg_sqs",
        "moments",
    ),
    ("_foreach_sqrt", "moments"): (("second_moment",), "denom", "denominator"),
    ("_foreach_div_", "denominator"): (("denom",), "denom", "denominator"),
    ("_foreach_add_", "denominator"): (("denom",), "denom", "denominator"),
    ("_foreach_addcdiv_", "denominator"): (("params", "exp_avgs", "denom"), "params", "done"),
}
"""Per foreach op and phase: the role of each of its `TensorList` arguments, the list it
writes (its first, or its result), and the phase after it. `second_moment`: the
running maximum under `amsgrad`, else `exp_avg_sqs`."""
STEPS = "_foreach_add_"
"""`_foreach_add_(state_steps, 1)`: a list of 0-d step counters; it starts each group's update."""
READS_STEP = "item"
"""`_get_value(step)`: each bias correction reads one step counter."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`foreach_adam_reads` as a reader (`readers.READERS`)."""
    return foreach_adam_reads(edges, flow.nodes, flow.all_ops)


def foreach_adam_reads(
    edges: pl.DataFrame, nodes: pl.DataFrame, all_ops: pl.DataFrame
) -> pl.DataFrame:
    """`edges` with each recognised multi-tensor Adam update's ops reading the lists the
    update's code gives them (see the module's docstring)."""
    name = shapes.base_name()
    top = nodes.filter(pl.col("parent").is_null())
    foreach = top.filter(name.str.starts_with("_foreach_"))
    if edges.height == 0 or foreach.height == 0:
        return edges
    ops = (
        top.filter(name.str.starts_with("_foreach_") | (name == READS_STEP))
        .sort("_seq")
        .select(*THREAD, "event", "_seq", name.alias("_op"), "data_inputs", "input_types")
    )
    gradients = (
        nodes.join(stored_gradients(nodes, all_ops), on="event", how="semi")
        .select(*THREAD, "event", "_seq", "output_shape")
        .sort("_seq")
    )
    made = nodes.sort("_seq").select(*THREAD, "_seq", "event", "output_shape")
    rows = []
    for (pid, tid, step), group in ops.group_by(THREAD, maintain_order=True):
        grads = gradients.filter(
            (pl.col("pid") == pid) & (pl.col("tid") == tid) & (pl.col("_step") == step)
        )
        before = made.filter(
            (pl.col("pid") == pid) & (pl.col("tid") == tid) & (pl.col("_step") == step)
        )
        rows += _updates(group, grads, before)
    if not rows:
        return edges
    read = edge_rows(rows).with_columns(
        pl.lit(None, dtype=pl.List(pl.Int64)).alias("shape"),
        pl.lit(CONFIDENCE["same-module"]).alias("confidence"),
        pl.lit("list+foreach-adam").alias("evidence"),
    )
    read = read.join(
        nodes.select(pl.col("event").alias("producer"), pl.col("output_shape").alias("_made")),
        on="producer",
        how="left",
    ).with_columns(pl.coalesce("shape", "_made").alias("shape"))
    kept = edges.join(read.select("consumer").unique(), on="consumer", how="anti")
    return pl.concat([kept, read.select(edges.columns)], how="vertical_relaxed")


def _lists(data_inputs: list[dict], types: list[str]) -> list[tuple[int, list[list[int]]]]:
    """(argument index, element shapes) of each `TensorList` argument."""
    at = [i for i, t in enumerate(types or []) if t == "TensorList"]
    return [(i, [d["shape"] for d in data_inputs or [] if d["index"] == i]) for i in at]


def _updates(ops: pl.DataFrame, grads: pl.DataFrame, made: pl.DataFrame) -> list[tuple]:
    """(producer, consumer, input index) of each recognised update among one thread's ops.

    A handful of rows per optimizer step: the update is read as a small state machine."""
    edges: list[tuple] = []
    runs: list[list[dict]] = []
    for row in ops.iter_rows(named=True):
        lists = _lists(row["data_inputs"], row["input_types"])
        counters = row["_op"] == STEPS and lists and all(s == [] for s in lists[0][1])
        if counters or not runs:
            runs.append([])
        runs[-1].append(row)
    for run in runs:
        edges += _update(run, grads, made)
    return edges


def _update(run: list[dict], grads: pl.DataFrame, made: pl.DataFrame) -> list[tuple]:
    """The reads of one group's update (`run`: its ops from the steps' `_foreach_add_`), or
    none where an op is not one `ROLES` knows or the update is not complete."""
    writer: dict[str, int] = {}
    phase, out = "decay", []
    first = run[0]
    lists = _lists(first["data_inputs"], first["input_types"])
    if first["_op"] != STEPS or not lists or any(s != [] for s in lists[0][1]):
        return []
    writer["steps"] = first["event"]
    out += _counter_increment(first, made)
    for row in run[1:]:
        if row["_op"] == READS_STEP:
            out.append((writer["steps"], row["event"], 0))
            continue
        later = PHASES[PHASES.index(phase) :] if phase in PHASES else ()
        role = next((ROLES[(row["_op"], p)] for p in later if (row["_op"], p) in ROLES), None)
        lists = _lists(row["data_inputs"], row["input_types"])
        if role is None or len(lists) != len(role[0]):
            return []
        for (index, shapes_of), what in zip(lists, role[0], strict=True):
            if what == "second_moment":
                what = "max_exp_avg_sqs" if "max_exp_avg_sqs" in writer else "exp_avg_sqs"
            if what in writer:
                out.append((writer[what], row["event"], index))
            elif what == "grads":
                out += [(g, row["event"], index) for g in _gradients(shapes_of, grads, row["_seq"])]
        writer[role[1]] = row["event"]
        phase = role[2]
    return out if phase == "done" else []


def _gradients(shapes_of: list[list[int]], grads: pl.DataFrame, seq: int) -> list[int]:
    """The stored gradients a gradient list holds: of each shape, all those stored before
    the op where they are as many as the list's tensors of that shape (else none)."""
    stored = grads.filter(pl.col("_seq") < seq).with_columns(
        shape_key(pl.col("output_shape")).alias("_key")
    )
    wanted = pl.DataFrame({"output_shape": shapes_of}, schema={"output_shape": pl.List(pl.Int64)})
    counts = wanted.group_by(shape_key(pl.col("output_shape")).alias("_key")).len("_want")
    have = stored.group_by("_key").len("_have")
    whole = counts.join(have, on="_key").filter(pl.col("_want") == pl.col("_have"))
    return stored.join(whole, on="_key", how="semi")["event"].to_list()


def _counter_increment(steps: dict, made: pl.DataFrame) -> list[tuple]:
    """`_foreach_add_(state_steps, torch.tensor(1.0))` on CPU: the 0-d tensor made by the
    op just before it."""
    types = steps["input_types"] or []
    if len(types) < 2 or types[1] in ("Scalar", "ScalarList"):
        return []
    previous = made.filter(pl.col("_seq") < steps["_seq"]).tail(1)
    if (
        previous.height == 0
        or previous["output_shape"][0] is None
        or len(previous["output_shape"][0])
    ):
        return []
    return [(previous["event"][0], steps["event"], 1)]
