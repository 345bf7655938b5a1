"""Inferred data flow: producer -> consumer edges recovered from a Kineto trace alone.

Kineto records no tensor ids, so producer -> consumer edges are inferred from what it does
record, and each edge says what it rests on (`evidence`) and how sure it is (`confidence`):

- the ops: data flow is between *semantic* ops, the dispatcher ops not nested in another
  one (`aten::linear`, not the `aten::addmm` inside it) plus Inductor's fused kernels
  (`ops.dataflow_ops`);
- shapes: an op reads a tensor of the shape an earlier op returned (`shapes` derives
  outputs), the most recent one on its thread within one `ProfilerStep`, ranked by the
  module tree (`matching`);
- program order between sibling ops where the trace has no shapes, and for Inductor's
  C++ kernels, which record no arguments at all (`_blind_edges`);
- a forward op whose backward reads its result, into its autograd node's work
  (`_fwdbwd_edges`), and 0-d values read at once (`readers.scalars.scalar_edges`);
- a GEMM mapping shape S to S is never credited as the producer of another GEMM's input:
  back-to-back projections of one input (q/k/v, gate/up) are far more common than a
  chain of square GEMMs with nothing in between.

Then each reader of `readers.READERS`, in order, reads one idiom that shape and order
read wrong as the models write it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceq.relations import autograd
from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.edges import EDGE_SCHEMA, Flow, unshaped
from traceq.relations.dataflow.matching import CONFIDENCE, THREAD, numel_key, shape_edges, shape_key
from traceq.relations.dataflow.ops import semantic_root
from traceq.relations.dataflow.readers import READERS
from traceq.relations.dataflow.readers.ddp_reducer import without_bucket_results
from traceq.relations.dataflow.readers.scalars import scalar_edges
from traceq.relations.nesting import enclosing

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

REDUCING_FUSED = r"(?i)(_red_|_per_|mean|sum|amax|amin|var|std|norm|softmax|argm)"
"""Fused kernels whose names say they reduce: their output shape is not their input's."""
RETURNS_INPUT = frozenset(
    {
        "aten::to",
        "aten::type_as",
        "aten::contiguous",
        "aten::dropout",
        "aten::feature_dropout",
        "aten::alpha_dropout",
        "aten::lift_fresh",
        "aten::resolve_conj",
        "aten::resolve_neg",
    }
)
"""Ops that return their input itself when they run no op of their own: `x.to(dtype)` with
x already of that dtype, `contiguous()` on a contiguous tensor, dropout in eval mode. Such
an op writes nothing (an Execution Trace records no output for it), so whoever reads its
result reads the tensor its input came from."""


def inferred_edges(trace: LoadedTrace, ops: pl.DataFrame) -> pl.DataFrame:
    """Inferred producer -> consumer edges between the rows of `ops` (`dataflow_ops`):
    `dataflow`'s frame, every edge `inferred`."""
    aliases = returned_inputs(trace, ops)
    nodes = _numbered(ops, module_calls(trace, ops), bool_factories(trace)).with_columns(
        pl.col("event").is_in(aliases.implode()).alias("_returns_input")
    )
    nodes = without_bucket_results(nodes, trace)
    blind = _blind_edges(nodes)
    nodes = _infer_blind_outputs(nodes, blind)
    parts = (shape_edges(nodes), blind, _fwdbwd_edges(trace.ops, nodes), scalar_edges(nodes))
    parts = [e for e in parts if e.height]
    if not parts:
        return pl.DataFrame(schema=EDGE_SCHEMA)
    edges = _through_returned_inputs(pl.concat(parts, how="diagonal_relaxed"), trace, ops)
    flow = Flow(nodes=nodes, ops=ops, all_ops=trace.ops, aliases=aliases, trace=trace)
    for reader in READERS:
        edges = reader(edges, flow)
    names = nodes.select("event", "name")
    return (
        edges.join(names.rename({"event": "producer", "name": "producer_name"}), on="producer")
        .join(names.rename({"event": "consumer", "name": "consumer_name"}), on="consumer")
        .with_columns(pl.lit(True).alias("inferred"))
        .select(list(EDGE_SCHEMA))
        .cast(EDGE_SCHEMA)
        .unique(["producer", "consumer", "input_index"], keep="first", maintain_order=True)
        .sort("consumer", "input_index", "producer", nulls_last=True)
    )


def returned_inputs(trace: LoadedTrace, ops: pl.DataFrame) -> pl.Series:
    """Events of the `ops` that returned their input: named in `RETURNS_INPUT`, and every op
    they ran (two levels down: a no-op `type_as` runs a no-op `to`) is one too; a copying
    `to` runs `_to_copy`, a training dropout `bernoulli_`."""
    named = ops.filter(pl.col("name").is_in(list(RETURNS_INPUT))).select("event")
    if named.height == 0:
        return named["event"]
    tree = trace.ops.filter(pl.col("parent").is_not_null()).select(
        pl.col("event").cast(pl.Int64).alias("_child"),
        pl.col("parent").cast(pl.Int64).alias("event"),
        "name",
    )
    children = tree.join(named, on="event", how="semi")
    grandchildren = tree.join(
        children.select(pl.col("_child").alias("event"), pl.col("event").alias("_root")),
        on="event",
    ).select(pl.col("_root").alias("event"), "name")
    writing = pl.concat([children.select("event", "name"), grandchildren]).filter(
        ~pl.col("name").is_in(list(RETURNS_INPUT))
    )
    return named.join(writing, on="event", how="anti")["event"]


def _through_returned_inputs(
    edges: pl.DataFrame, trace: LoadedTrace, ops: pl.DataFrame, max_hops: int = 4
) -> pl.DataFrame:
    """Edges out of an op that returned its input (`returned_inputs`) start at that input's
    producer instead: `embedding -> to (no-op) -> pow` reads `embedding -> pow`. An input
    with no producer (a parameter, a graph input) leaves its readers with no edge."""
    aliases = returned_inputs(trace, ops)
    if aliases.len() == 0 or edges.height == 0:
        return edges
    alias = pl.DataFrame({"_alias": aliases})
    source = (
        edges.join(alias, left_on="consumer", right_on="_alias", how="semi")
        .sort("consumer", "input_index", "confidence", descending=[False, False, True])
        .unique("consumer", keep="first", maintain_order=True)
        .select(
            pl.col("consumer").alias("_alias"),
            pl.col("producer").alias("_source"),
            pl.col("confidence").alias("_source_confidence"),
        )
    )
    for _ in range(max_hops):
        out = edges.join(alias, left_on="producer", right_on="_alias", how="semi")
        if out.height == 0:
            break
        rewired = out.join(source, left_on="producer", right_on="_alias").select(
            pl.col("_source").alias("producer"),
            "consumer",
            "input_index",
            "shape",
            pl.min_horizontal("confidence", "_source_confidence").alias("confidence"),
            pl.concat_str("evidence", pl.lit("+returned-input")).alias("evidence"),
        )
        kept = edges.join(alias, left_on="producer", right_on="_alias", how="anti")
        edges = pl.concat([kept, rewired], how="diagonal_relaxed")
    return edges


FACTORY_DTYPE_AT = {"aten::full": 2, "aten::ones": 1, "aten::zeros": 1, "aten::empty": 1}
"""Where a factory's `dtype` argument is (`torch.full(size, fill, dtype=...)`)."""
BOOL_SCALAR_TYPE = "11"
"""`c10::ScalarType::Bool`, as the profiler records a `dtype` argument."""


def bool_factories(trace: LoadedTrace) -> pl.Series:
    """Events of the factory ops that made a bool tensor (`torch.full((n,), False,
    dtype=torch.bool)`, `generate`'s `this_peer_finished` masks)."""
    made = trace.ops.filter(pl.col("name").is_in(list(FACTORY_DTYPE_AT)))
    at = pl.col("name").replace_strict(FACTORY_DTYPE_AT, default=0)
    dtype = pl.col("concrete_inputs").list.get(at, null_on_oob=True)
    return made.filter((dtype == BOOL_SCALAR_TYPE).fill_null(False))["event"].cast(pl.Int64)


def _numbered(
    ops: pl.DataFrame, calls: pl.DataFrame | None = None, made_bool: pl.Series | None = None
) -> pl.DataFrame:
    """Ops in thread order (`_seq`), with matching keys and the module call they ran in.

    `calls` (`module_calls`) gives each op `_call` (its innermost `nn.Module` call, -1 for
    none), `_top` (its outermost one) and `_scope_start`/`_scope_end`: the module call its
    result can still be read in (null: anywhere). `made_bool`: events of factory ops that
    made a bool tensor (`_made_bool`)."""
    nodes = (
        ops.sort("pid", "tid", "ts_ns", "event")
        .with_row_index("_seq")
        .with_columns(
            pl.col("_seq").cast(pl.Int64),
            pl.col("step").fill_null(-1).alias("_step"),
            pl.col("module").fill_null("").alias("_module"),
            pl.col("compiled").alias("_loose"),
            pl.col("parent").fill_null(-1).alias("_tree"),
            pl.lit(False).alias("_out_inferred"),
            pl.col("event")
            .is_in(
                (made_bool if made_bool is not None else pl.Series([], dtype=pl.Int64)).implode()
            )
            .alias("_made_bool"),
            pl.col("name")
            .str.replace(r"^\w+::", "")
            .str.replace(r"\..*$", "")
            .is_in(list(shapes.MULTI_OUTPUT | shapes.VALUES_AND_INDICES))
            .alias("_multi"),
            numel_key(pl.col("data_inputs").list.first().struct.field("shape")).alias("_in_numel"),
        )
    )
    nodes = nodes.join(_more_outputs(nodes), on="event", how="left")
    if calls is None:
        calls = pl.DataFrame(schema=_CALL_SCHEMA)
    nodes = nodes.join(calls, on="event", how="left").with_columns(
        pl.col("_call").fill_null(-1), pl.col("_top").fill_null(-1)
    )
    return _with_keys(nodes)


def _more_outputs(nodes: pl.DataFrame) -> pl.DataFrame:
    """`event`, `_more_outputs`: the outputs of an op beyond its `output_shape`, where
    they differ from it (`shapes.gradient_outputs`: a convolution's or a norm's backward
    returns the gradients of its weight and bias too); null for the other ops."""
    schema = {"event": pl.Int64, "_more_outputs": pl.List(pl.List(pl.Int64))}
    several = nodes.filter(shapes.base_name().is_in(list(shapes.GRADIENT_OUTPUTS)))
    rows = [
        (event, more)
        for event, name, dims, concrete in several.select(
            "event", "name", "input_dims", "concrete_inputs"
        ).iter_rows()
        if (more := shapes.more_outputs(name, dims, concrete))
    ]
    return pl.DataFrame(rows, schema=schema, orient="row")


_CALL_SCHEMA = {
    "event": pl.Int64,
    "_call": pl.Int64,
    "_top": pl.Int64,
    "_scope_start": pl.Int64,
    "_scope_end": pl.Int64,
    "_call_start": pl.Int64,
}


def module_calls(trace: LoadedTrace, ops: pl.DataFrame) -> pl.DataFrame:
    """The `nn.Module` call each op ran in, as call *instances* (event ids), not paths.

    A module path repeats: an ensemble or a `generate` loop calls the same model again, a
    block may be applied twice in one forward. Paths cannot tell those calls apart; the
    module call events (`with_stack`/`with_modules`) can. Columns: event, `_call`
    (innermost call), `_top` (outermost call: one forward of a model), and the scope of the
    op's result: the innermost call still open when the next op on the thread starts
    (a call that ended with the op may have returned its result; one that goes on keeps it
    inside: encapsulation), as `_scope_start`/`_scope_end` (null: visible anywhere), and
    `_call_start`: when `_call` started.
    """
    mods = trace.modules
    if mods.height == 0 or ops.height == 0:
        return pl.DataFrame(schema=_CALL_SCHEMA)
    mods = mods.sort("event")
    frame = ops.select(
        pl.col("event").cast(pl.Int64),
        "pid",
        "tid",
        "ts_ns",
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
    ).sort("pid", "tid", "ts_ns", "event")
    shared = set(frame["tid"].unique().to_list()) & set(mods["tid"].unique().to_list())
    keys = pl.concat([frame.select("pid", "tid"), mods.select("pid", "tid")]).unique()
    keys = keys.with_row_index("_g").with_columns(pl.col("_g").cast(pl.Int64))

    def group(f: pl.DataFrame) -> np.ndarray:
        if not shared:  # module frames on another thread id (tid 0): time alone decides
            return np.zeros(f.height, dtype=np.int64)
        return f.join(keys, on=["pid", "tid"], how="left", maintain_order="left")["_g"].to_numpy()

    mod_events = mods["event"].cast(pl.Int64).to_numpy()
    mod_parent_event = mods["parent"].fill_null(-1).cast(pl.Int64).to_numpy()
    pos = np.searchsorted(mod_events, mod_parent_event)
    pos = np.clip(pos, 0, len(mod_events) - 1)
    mod_parent = np.where((mod_parent_event >= 0) & (mod_events[pos] == mod_parent_event), pos, -1)
    starts, ends = mods["ts_ns"].to_numpy(), mods["end_ns"].to_numpy()
    fg = group(frame)
    inner = enclosing(
        (fg, frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy()),
        (group(mods), starts, ends),
        mod_parent,
    )
    top = inner.copy()
    live = np.flatnonzero(top >= 0)
    while live.size:
        up = mod_parent[top[live]]
        moved = up >= 0
        top[live[moved]] = up[moved]
        live = live[moved]
    # the scope: the innermost call still open when the next op on the thread starts
    ts = frame["ts_ns"].to_numpy()
    same_thread = np.r_[fg[1:] == fg[:-1], False]
    next_ts = np.where(same_thread, np.r_[ts[1:], 0], np.iinfo(np.int64).max)
    scope = inner.copy()
    live = np.flatnonzero(scope >= 0)
    while live.size:
        closed = ends[scope[live]] <= next_ts[live]
        live = live[closed]
        scope[live] = mod_parent[scope[live]]
        live = live[scope[live] >= 0]

    def events(at: np.ndarray) -> pl.Series:
        return pl.Series(np.where(at >= 0, mod_events[np.maximum(at, 0)], -1)).replace(-1, None)

    return (
        pl.DataFrame(
            {
                "event": frame["event"],
                "_call": events(inner),
                "_top": events(top),
                "_scope_start": pl.Series(np.where(scope >= 0, starts[np.maximum(scope, 0)], -1)),
                "_scope_end": pl.Series(np.where(scope >= 0, ends[np.maximum(scope, 0)], -1)),
                "_call_start": pl.Series(np.where(inner >= 0, starts[np.maximum(inner, 0)], -1)),
            }
        )
        .with_columns(
            pl.when(pl.col("_scope_start") >= 0).then(pl.col("_scope_start")).alias("_scope_start"),
            pl.when(pl.col("_scope_end") >= 0).then(pl.col("_scope_end")).alias("_scope_end"),
            pl.when(pl.col("_call_start") >= 0).then(pl.col("_call_start")).alias("_call_start"),
        )
        .cast(_CALL_SCHEMA)
    )


def _with_keys(nodes: pl.DataFrame) -> pl.DataFrame:
    return nodes.with_columns(
        shape_key(pl.col("output_shape")).alias("_out_shape"),
        numel_key(pl.col("output_shape")).alias("_out_numel"),
    )


def _blind_edges(nodes: pl.DataFrame) -> pl.DataFrame:
    """Edges into ops that recorded no inputs (no `record_shapes`, Inductor C++ kernels).

    Such an op reads its previous sibling (same thread, step and enclosing op). A fused
    kernel also reads every earlier sibling result since the previous blind op that no
    op had read by shape before it (a GLU kernel reads both the gate and the up GEMM).
    """
    scope = [*THREAD, "_tree"]
    ordered = nodes.sort("_seq").with_columns(
        pl.col("event").shift(1).over(scope).alias("producer"),
        pl.col("input_dims").is_null().alias("_blind"),
    )
    previous = ordered.filter(
        pl.col("_blind") & pl.col("producer").is_not_null() & (pl.col("kind") != shapes.FACTORY)
    ).select(
        "producer",
        pl.col("event").alias("consumer"),
        *unshaped(
            pl.when(pl.col("kind") == shapes.FUSED)
            .then(CONFIDENCE["compiled-order"])
            .otherwise(CONFIDENCE["order"]),
            "order",
        ),
    )
    fused = ordered.filter(pl.col("_blind") & (pl.col("kind") == shapes.FUSED))
    if fused.height == 0:
        return previous
    by_shape = shape_edges(nodes)
    if by_shape.height == 0:
        by_shape = pl.DataFrame(schema={"producer": pl.Int64, "consumer": pl.Int64})
    read = by_shape.select("producer", pl.col("consumer").alias("_reader"))
    readers = read.join(nodes.select(pl.col("event").alias("_reader"), "_seq"), on="_reader")
    first_read = readers.group_by("producer").agg(pl.col("_seq").min().alias("_read_seq"))
    segment = ordered.with_columns(
        pl.col("_blind").cast(pl.Int64).cum_sum().shift(1).fill_null(0).over(scope).alias("_seg")
    )
    kernels = segment.filter(pl.col("_blind") & (pl.col("kind") == shapes.FUSED)).select(
        *scope, "_seg", pl.col("event").alias("consumer"), pl.col("_seq").alias("_cseq")
    )
    unread = (
        segment.filter(~pl.col("_blind") & pl.col("output_shape").is_not_null())
        .join(first_read, left_on="event", right_on="producer", how="left")
        .select(*scope, "_seg", pl.col("event").alias("producer"), "_seq", "_read_seq")
    )
    extra = (
        kernels.join(unread, on=[*scope, "_seg"])
        .filter(
            (pl.col("_seq") < pl.col("_cseq"))
            & (pl.col("_read_seq").is_null() | (pl.col("_read_seq") > pl.col("_cseq")))
        )
        .join(previous.select("producer", "consumer"), on=["producer", "consumer"], how="anti")
        .select("producer", "consumer", *unshaped(pl.lit(CONFIDENCE["unread"]), "order+unread"))
    )
    return pl.concat([previous, extra])


def _infer_blind_outputs(nodes: pl.DataFrame, blind: pl.DataFrame) -> pl.DataFrame:
    """A pointwise fused kernel with no recorded arguments returns its input's shape."""
    targets = nodes.filter(
        (pl.col("kind") == shapes.FUSED)
        & pl.col("output_shape").is_null()
        & ~pl.col("name").str.contains(REDUCING_FUSED)
    )
    if targets.height == 0 or blind.height == 0:
        return nodes
    read_shapes = (
        blind.filter(pl.col("evidence") == "order")
        .join(
            nodes.select(pl.col("event").alias("producer"), pl.col("output_shape").alias("_in")),
            on="producer",
        )
        .select(pl.col("consumer").alias("event"), "_in")
        .join(targets.select("event"), on="event", how="semi")
        .drop_nulls("_in")
    )
    patched = (
        nodes.join(read_shapes, on="event", how="left")
        .with_columns(
            pl.coalesce("output_shape", "_in").alias("output_shape"),
            (pl.col("_out_inferred") | pl.col("_in").is_not_null()).alias("_out_inferred"),
        )
        .drop("_in")
    )
    return _with_keys(patched)


SAVES_RESULT = frozenset(
    {"relu", "relu_", "threshold", "sigmoid", "tanh", "exp", "sqrt", "rsqrt", "elu", "softmax"}
    | {"_softmax", "log_softmax", "_log_softmax", "dropout", "native_dropout", "layer_norm"}
    | {"native_layer_norm", "group_norm", "native_group_norm", "batch_norm", "rms_norm"}
    | {"native_batch_norm", "_fused_rms_norm", "scaled_dot_product_attention", "max_pool2d"}
    | {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}
    | {"_scaled_dot_product_cudnn_attention", "max_pool2d_with_indices"}
)
"""Forward ops whose backward reads what they returned: the result (`relu`'s
`threshold_backward(grad, result)`, `sigmoid`, `softmax`) or the statistics, mask or
indices they return beside it (a norm's mean and rstd, dropout's mask, attention's
logsumexp). The others' backward reads only their inputs: a GEMM's, `gelu`'s, a loss's."""


def _fwdbwd_edges(all_ops: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Forward op -> the ops of its autograd backward node, by the autograd sequence number,
    for a forward op whose backward reads what it returned (`SAVES_RESULT`).

    The node (`AddmmBackward0`, ...) carries the sequence number of the forward op that
    created it; its work (`aten::mm`, `aten::gelu_backward`, ...) reads the gradient and
    the tensors the forward op saved. Views and allocations in the node are left out. A
    GEMM's backward reads the GEMM's inputs, never its result: against the ET corpus each
    edge out of a `linear`, `gelu` or `mse_loss` into its backward was wrong (5 of 5).
    """
    numbered = all_ops.filter(pl.col("sequence_number").is_not_null())
    if numbered.height == 0:
        return pl.DataFrame()
    ordered = all_ops.sort("event")
    root = pl.Series(semantic_root(ordered))
    ordered = ordered.with_columns(
        ordered["event"].cast(pl.Int64).gather(root.clip(0)).alias("_root"),
        (root >= 0).alias("_has_root"),
    )
    saves = shapes.base_name().is_in(SAVES_RESULT)
    forward = (
        ordered.filter(pl.col("sequence_number").is_not_null() & pl.col("_has_root"))
        .group_by("sequence_number")
        .agg(pl.col("_root").sort_by("ts_ns").last().alias("producer"))
        .join(nodes.filter(saves).select(pl.col("event").alias("producer")), on="producer")
    )
    backward = ordered.filter(
        pl.col("sequence_number").is_not_null()
        & ~pl.col("_has_root")
        & autograd.is_node()
        & ~autograd.is_frame()
    ).select(pl.col("event").cast(pl.Int64).alias("parent"), "sequence_number")
    work = nodes.filter(~pl.col("kind").is_in([shapes.VIEW, shapes.COPY, shapes.FACTORY])).select(
        pl.col("event").alias("consumer"), "parent"
    )
    return (
        backward.join(forward, on="sequence_number")
        .join(work, on="parent")
        .select("producer", "consumer", *unshaped(pl.lit(CONFIDENCE["fwdbwd"]), "fwdbwd"))
    )
