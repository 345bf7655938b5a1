"""The ops and edges the fusion rules match over, and the op-group shapes several rules share.

`fusion_ops` gives the analysis' semantic ops, classified (`op_classes`), with their time
and the model call they ran in; `fusion_edges` the data flow between them. Two shapes recur
in several rules and are resolved here once: edges that pass through views (`GEMM -> view ->
add` is still "the GEMM's output goes into the add"), and activations written out as
pointwise ops (GPT-2's `gelu_new`, `x * sigmoid(x)`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.perf.traffic import numel
from traceq.relations import autograd
from traceq.relations.dataflow import module_calls
from traceq.rules.details import DETAIL_COLUMNS
from traceq.rules.op_classes import ACTIVATION_OPS, ATEN_BASE, GEMM_WITH_ACTIVATION, classify

if TYPE_CHECKING:
    from traceq.rules.base import Context


#: Spans in which `torch.compile` traces and compiles (Dynamo bytecode tracing, AOT
#: autograd, Inductor's fake-tensor propagation): the ops inside run the model on fake or
#: example inputs to build the compiled graph; they are not its runtime work.
COMPILE_SPANS = (
    r"\(dynamo_timed\)$|^(dynamo|entire_frame_compile|backend_compile|inductor_compile"
    r"|bytecode_tracing|create_aot_dispatcher_function|fx_codegen_and_compile|compile_fx\b.*"
    r"|_compile\.compile_inner|OutputGraph\.call_user_compiler|aot_collect_metadata)$"
)


def compile_time(ops: pl.DataFrame, spans: pl.DataFrame) -> pl.Series:
    """True for each row of `ops` that runs inside a compile span (`COMPILE_SPANS`) of
    `spans` (the trace's ops) on its thread: outermost spans, then one as-of join."""
    marks = (
        spans.filter(pl.col("name").str.contains(COMPILE_SPANS))
        .select("pid", "tid", pl.col("ts_ns").alias("_start"), pl.col("end_ns").alias("_end"))
        .sort("pid", "tid", "_start")
    )
    if marks.height == 0 or ops.height == 0:
        return pl.Series("compile_time", [False] * ops.height, dtype=pl.Boolean)
    reach = pl.col("_end").cum_max().shift(1).over("pid", "tid")
    outermost = marks.filter(reach.is_null() | (pl.col("_start") > reach))
    probe = ops.select("pid", "tid", "ts_ns").with_row_index("_row").sort("ts_ns")
    found = probe.join_asof(
        outermost.sort("_start"),
        left_on="ts_ns",
        right_on="_start",
        by=["pid", "tid"],
        check_sortedness=False,  # both sides are sorted on time above
    )
    inside = (pl.col("_end").is_not_null() & (pl.col("ts_ns") < pl.col("_end"))).alias("inside")
    return found.sort("_row").select(inside)["inside"].alias("compile_time")


def fusion_ops(ctx: Context) -> pl.DataFrame:
    """The analysis' semantic ops, `classify`d, with `time_ns`: the GPU time of their
    kernels on a GPU trace, their CPU time on a CPU-only one, and `call`: the outermost
    module call the op ran in (one forward of a model; null outside any), which no fusion
    finding crosses. Ops run while `torch.compile` compiles (`compile_time`) are left out.
    Computed once per analysis."""

    def build() -> pl.DataFrame:
        ops = ctx.ops
        ops = ops.filter(~compile_time(ops, ctx.trace.ops))
        if "concrete_inputs" not in ops.columns:
            concrete = ctx.trace.ops.select(pl.col("event").cast(pl.Int64), "concrete_inputs")
            ops = ops.join(concrete, on="event", how="left")
        gpu = ctx.device.kind == "gpu"
        time = "gpu_ns" if gpu else "cpu_ns"
        calls = module_calls(ctx.trace, ops).select("event", pl.col("_top").alias("call"))
        nodes = ctx.trace.ops.filter(autograd.is_node())["event"].cast(pl.Int64)
        classified = (
            classify(ops)
            .join(calls, on="event", how="left", maintain_order="left")
            .with_columns(
                pl.col(time).fill_null(0).alias("time_ns"),
                # run by an autograd node: the backward pass's work (`autograd_work`)
                pl.col("parent").is_in(nodes.implode()).fill_null(False).alias("backward"),
            )
        )
        if gpu:
            return classified
        # on the CPU `_addmm_activation` runs `addmm` then `gelu_` / `relu_`: no epilogue
        return classified.with_columns(
            (pl.col("epilogue_act") & ~ATEN_BASE.is_in(GEMM_WITH_ACTIVATION)).alias("epilogue_act")
        )

    return ctx.cached("fusion.ops", build)


def inner_activations(ctx: Context) -> pl.DataFrame:
    """Activations a GEMM op runs as a child op of its own, unfused: on the CPU,
    `_addmm_activation` calls `addmm` and then `gelu_` / `relu_` on its result, while on a
    GPU cuBLASLt applies them in the epilogue. One row per child: `gemm` (the GEMM op's
    event) and the child's `event`, `name` and `activation`, with the `fusion_ops` columns
    (`DETAIL_COLUMNS`) a finding describes it by — its own CPU time, and the traffic of
    reading and writing the GEMM's output once."""
    ops = fusion_ops(ctx)
    gemms = ops.filter(ATEN_BASE.is_in(GEMM_WITH_ACTIVATION) & ~pl.col("epilogue_act")).select(
        pl.exclude("name", "ts_ns", "time_ns", "kernel_events", "kernel_names")
    )
    children = ctx.trace.ops.filter(
        ATEN_BASE.is_in(list(ACTIVATION_OPS)) & pl.col("parent").is_in(gemms["event"].implode())
    ).select(
        pl.col("event").cast(pl.Int64).alias("_child"),
        "name",
        "ts_ns",
        pl.col("dur_ns").alias("time_ns"),
        pl.col("parent").cast(pl.Int64).alias("event"),
        ATEN_BASE.replace_strict(ACTIVATION_OPS, default=None).alias("_activation"),
    )
    return (
        children.join(gemms, on="event")
        .with_columns(
            pl.col("event").alias("gemm"),
            pl.col("_child").alias("event"),
            pl.col("_activation").alias("activation"),
            pl.lit([], dtype=pl.List(pl.Int64)).alias("kernel_events"),
            pl.lit([], dtype=pl.List(pl.String)).alias("kernel_names"),
            (2 * numel(pl.col("output_shape")) * pl.col("itemsize")).alias("traffic_bytes"),
        )
        .select("gemm", "activation", *DETAIL_COLUMNS)
    )


def autograd_work(ctx: Context) -> pl.Series:
    """Events of the fusion ops an autograd node runs: the backward pass's work."""
    nodes = ctx.trace.ops.filter(autograd.is_node()).select(
        pl.col("event").cast(pl.Int64).alias("parent")
    )
    return fusion_ops(ctx).join(nodes, on="parent", how="semi")["event"]


def backward_of(ctx: Context, forward: pl.Series) -> pl.Series:
    """Events of the fusion ops autograd runs for the gradients of the `forward` ops: the
    work of the nodes (and of their engine frames) that carry a forward op's sequence
    number (Kineto's `Sequence number`, shared by an op and the node it recorded, on the
    same process).

    A fix that removes forward ops (a written-out GELU replaced by `F.gelu`, a GLU fused)
    removes their backward too, so the backward ops are the same problem, not another
    chain: on `gpt2_train_ce` the backward of GPT-2's `gelu_new` is nine pointwise ops
    whose edges shape matching guesses (every gradient there has one shape), a chain TQ104
    reported with other members on inferred and on exact data flow."""
    ops = ctx.trace.ops
    if "sequence_number" not in ops.columns or forward.len() == 0:
        return pl.Series("event", [], dtype=pl.Int64)
    seq = pl.col("sequence_number")
    # an op run with grad off inside a custom `autograd.Function`'s forward records no
    # number; the Function's range around it (`BiasGeLU`) records its node's
    enclosing = ops.select(
        pl.col("event").cast(pl.Int64).alias("parent"), seq.alias("_enclosing_seq")
    )
    recorded = (
        ops.filter(pl.col("event").cast(pl.Int64).is_in(forward.cast(pl.Int64).implode()))
        .join(enclosing, on="parent", how="left")
        .select(
            "pid",
            pl.when(seq >= 0).then(seq).otherwise("_enclosing_seq").alias("sequence_number"),
        )
        .filter(seq.is_not_null() & (seq >= 0))
        .unique()
    )
    nodes = (
        ops.filter(autograd.is_node())
        .join(recorded, on=["pid", "sequence_number"], how="semi")
        .select(pl.col("event").cast(pl.Int64).alias("parent"))
    )
    return fusion_ops(ctx).join(nodes, on="parent", how="semi")["event"]


def fusion_edges(ctx: Context) -> pl.DataFrame:
    """The analysis' data-flow edges with views bypassed (`through_views`), once."""
    return ctx.cached("fusion.edges", lambda: through_views(fusion_ops(ctx), ctx.edges))


def through_views(ops: pl.DataFrame, edges: pl.DataFrame, max_hops: int = 4) -> pl.DataFrame:
    """Data-flow edges with views bypassed: `GEMM -> view -> add` becomes `GEMM -> add`.

    Each edge keeps the consumer's `input_index` and `shape`; `via` lists the view ops it
    passed through (empty for a direct edge), `confidence` is the weakest along the way and
    `evidence` what each hop was matched on, producer side first ("shape+order > shape+order",
    "numel+same-module", "tensor-id"; null where the edges carry none).
    Edges into a view are dropped (they reappear as the view's bypassed edges).
    """
    views = ops.filter(pl.col("role") == "view").select("event")
    cols = ["producer", "consumer", "input_index", "shape", "confidence"]
    evidence = pl.col("evidence") if "evidence" in edges.columns else pl.lit(None, dtype=pl.String)
    current = edges.select(*cols, evidence.alias("evidence")).with_columns(
        pl.lit([], dtype=pl.List(pl.Int64)).alias("via")
    )
    into_view = current.join(views, left_on="consumer", right_on="event", how="semi")
    done = current.join(views, left_on="consumer", right_on="event", how="anti")
    feed = into_view.select(
        pl.col("consumer").alias("view"),
        pl.col("producer").alias("source"),
        pl.col("confidence").alias("source_confidence"),
        pl.col("via").alias("source_via"),
        pl.col("evidence").alias("source_evidence"),
    )
    resolved = done
    for _ in range(max_hops):
        from_view = resolved.join(views, left_on="producer", right_on="event", how="semi")
        if from_view.height == 0:
            break
        settled = resolved.join(views, left_on="producer", right_on="event", how="anti")
        stepped = from_view.join(feed, left_on="producer", right_on="view", how="inner").select(
            pl.col("source").alias("producer"),
            "consumer",
            "input_index",
            "shape",
            pl.min_horizontal("confidence", "source_confidence").alias("confidence"),
            pl.concat_str("source_evidence", "evidence", separator=" > ").alias("evidence"),
            pl.concat_list("source_via", pl.col("producer").cast(pl.Int64), "via").alias("via"),
        )
        resolved = pl.concat([settled, stepped])
    return resolved.join(views, left_on="producer", right_on="event", how="anti").unique(
        ["producer", "consumer", "input_index"], keep="first", maintain_order=True
    )


def reached_forward(
    edges: pl.DataFrame,
    start: pl.DataFrame,
    frontier: pl.DataFrame,
    key: list[str],
    until: str,
    max_hops: int,
) -> pl.DataFrame:
    """Every op reached forward along `edges` from each `frontier` row's op `_at`, as rows
    of `key` and `_at`: a breadth-first walk of at most `max_hops` edges that never steps to
    an op started (`start`: `event`, `ts_ns`) after the row's `until` column (an op that
    started later cannot lie between)."""
    forward = edges.select(pl.col("producer").alias("_at"), pl.col("consumer").alias("_next"))
    forward = forward.unique().join(start.rename({"event": "_next", "ts_ns": "_n_ts"}), on="_next")
    seen = frontier.select(*key, "_at")
    reached = []
    for _ in range(max_hops):
        frontier = (
            frontier.join(forward, on="_at")
            .filter(pl.col("_n_ts") <= pl.col(until))
            .select(*key, until, pl.col("_next").alias("_at"))
            .unique()
            .join(seen, on=[*key, "_at"], how="anti")
        )
        if frontier.height == 0:
            break
        seen = pl.concat([seen, frontier.select(*key, "_at")])
        reached.append(frontier.select(*key, "_at"))
    return pl.concat(reached) if reached else seen.clear()


def written_out_activations(
    ops: pl.DataFrame, edges: pl.DataFrame, max_ops: int = 8
) -> pl.DataFrame:
    """Activations spelled as pointwise ops on a GEMM's output: GPT-2's `gelu_new`
    (`0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))`), erf-GELU, `x * sigmoid(x)` (SiLU)
    and `x * sigmoid(1.702 * x)` (QuickGELU, named `quick_gelu`).

    A region is the set of elementwise ops reachable from the GEMM through same-shaped
    edges (one size: a view may sit in between) whose every tensor input that data flow
    explains comes from the GEMM or from the region itself (so it is a function of the
    GEMM output alone; an input with no edge at all is unknown, not outside), holding a
    tanh, erf or sigmoid and at least two ops. One row per GEMM: `gemm`, `ops` (the
    region's event ids), `output` (the op whose result leaves the region), `activation`
    ("gelu" or "silu").

    `ops` must be `classify`d; `edges` should be `through_views`.
    """
    # sizes, not shapes: a view may sit between the GEMM and the activation (GPT-2's Conv1D
    # runs `addmm` on [B*T, 4H] and views the result as [B, T, 4H] before `gelu_new`)
    # a forward GEMM's region stays in the forward pass: its backward reads the GEMM's
    # output too (GPT-2's `PowBackward0` recomputes `x ** 2` from the saved x), and with
    # exact data flow the region grew into it and had two results (`fusion_ops`' `backward`)
    backward = pl.col("backward") if "backward" in ops.columns else pl.lit(False)
    pointwise = ops.filter(
        pl.col("role").is_in(["elementwise", "activation"]) & ~pl.col("generated")
    ).select(
        "event",
        "name",
        numel(pl.col("output_shape")).alias("_size"),
        "tensor_inputs",
        backward.alias("_backward"),
    )
    gemms = ops.filter(pl.col("role") == "gemm").select(
        pl.col("event").alias("gemm"),
        numel(pl.col("output_shape")).alias("gemm_size"),
        backward.alias("_gemm_backward"),
    )
    same = edges.select("producer", "consumer", "input_index")
    same_side = (pl.col("_size") == pl.col("gemm_size")) & (
        pl.col("_backward") == pl.col("_gemm_backward")
    )
    # grow each GEMM's region along same-sized pointwise consumers
    region = (
        same.join(gemms, left_on="producer", right_on="gemm", how="inner")
        .join(pointwise, left_on="consumer", right_on="event", how="inner")
        .filter(same_side)
        .select(
            pl.col("producer").alias("gemm"),
            pl.col("consumer").alias("op"),
            "gemm_size",
            "_gemm_backward",
        )
        .unique()
    )
    for _ in range(max_ops):
        grown = (
            region.join(same, left_on="op", right_on="producer", how="inner")
            .join(pointwise, left_on="consumer", right_on="event", how="inner")
            .filter(same_side)
            .select("gemm", pl.col("consumer").alias("op"), "gemm_size", "_gemm_backward")
        )
        merged = pl.concat([region, grown]).unique()
        if merged.height == region.height:
            break
        region = merged
    # prune ops with a tensor input from outside the region, until nothing changes; an
    # input no edge explains is unknown, not outside: shape matching misses one of the two
    # reads of `x * (...)` where every value in the region has x's shape (Megatron's
    # bias-GELU on `tp_block`: 5 of 9 ops read x, the inferred flow finds 3 of those reads)
    #
    # and a guess into the region from a value older than the GEMM's own input (not a
    # GEMM's output) is unknown too: without tensor ids, shape matching gave T5's
    # `gelu_new` (`x + 0.044715 * x**3`, x read three times) the previous layer's GLU
    # product, of x's shape, as the add's x on a trace recorded without stacks; the region
    # lost the add, and the GeGLU read as a TQ104 chain. A GLU's up GEMM, or a value made
    # while the block ran (HTA's `sigmoid(a) * sigmoid(linear(h))`), stays outside.
    explained = _explained_inputs(ops, edges, region)
    for _ in range(max_ops):
        inside = pl.concat(
            [
                region.select("gemm", pl.col("op").alias("member")),
                region.select("gemm", pl.col("gemm").alias("member")).unique(),
            ]
        )
        fed = (
            region.join(same, left_on="op", right_on="consumer", how="inner")
            .join(inside, left_on=["gemm", "producer"], right_on=["gemm", "member"], how="semi")
            .group_by("gemm", "op")
            .agg(pl.col("input_index").n_unique().alias("fed"))
        )
        kept = (
            region.join(fed, on=["gemm", "op"], how="inner")
            .join(pointwise.select("event", "tensor_inputs"), left_on="op", right_on="event")
            .join(explained, on=["gemm", "op"], how="left")
            .filter(pl.col("fed") >= pl.min_horizontal("tensor_inputs", "_known"))
            .select("gemm", "op", "gemm_size", "_gemm_backward")
        )
        if kept.height == region.height:
            break
        region = kept
    named = region.join(
        pointwise.select("event", "name", "tensor_inputs"), left_on="op", right_on="event"
    ).join(explained, on=["gemm", "op"], how="left")
    internal = same.join(
        region.select("gemm", pl.col("op").alias("producer")), on="producer", how="inner"
    ).join(region.select("gemm", pl.col("op").alias("consumer")), on=["gemm", "consumer"])
    sinks = region.join(
        internal.select("gemm", pl.col("producer").alias("op")).unique(),
        on=["gemm", "op"],
        how="anti",
    )
    base = ATEN_BASE
    groups = named.group_by("gemm").agg(
        pl.col("op").sort().alias("ops"),
        base.is_in(["tanh", "erf"]).any().alias("_gelu"),
        (base == "sigmoid").any().alias("_sigmoid"),
        # QuickGELU, `x * sigmoid(1.702 * x)` (CLIP): the sigmoid reads x scaled by a Python
        # number (a `mul` with one tensor input; the profiler records no scalar's value).
        # Not SiLU, `x * sigmoid(x)`: suggesting `F.silu` would change the model's numerics.
        ((base == "mul") & (pl.col("tensor_inputs") == 1)).any().alias("_quick"),
        pl.len().alias("_n"),
        # ops kept with an input no edge explains: the region must stand without them (a
        # 2-op `tanh(h) * g` whose g data flow lost is a gate, not a GELU)
        (pl.col("_known").fill_null(0) < pl.col("tensor_inputs")).sum().alias("_unknown"),
    )
    return (
        groups.filter(
            (pl.col("_n") >= 2)
            & ((pl.col("_unknown") == 0) | (pl.col("_n") - pl.col("_unknown") >= 3))
            & (pl.col("_gelu") | pl.col("_sigmoid"))
        )
        .join(
            sinks.group_by("gemm").agg(pl.col("op").max().alias("output"), pl.len().alias("_s")),
            on="gemm",
        )
        .filter(pl.col("_s") == 1)
        .select(
            "gemm",
            "ops",
            "output",
            pl.when("_gelu")
            .then(pl.lit("gelu"))
            .when("_quick")
            .then(pl.lit("quick_gelu"))
            .otherwise(pl.lit("silu"))
            .alias("activation"),
        )
        .sort("gemm")
    )


def _explained_inputs(ops: pl.DataFrame, edges: pl.DataFrame, region: pl.DataFrame) -> pl.DataFrame:
    """`gemm`, `op`, `_known`: how many of each region op's inputs data flow explains, less
    the shape-matched guesses from a value made before the region's GEMM read its input
    (older than that input's producer), and not by a GEMM (`written_out_activations`).
    Edges from the Execution Trace ("tensor-id") are kept; a GEMM with no input edge (a
    graph input) has no guesses."""
    exact = (
        pl.col("evidence").str.contains("tensor-id").fill_null(False)
        if "evidence" in edges.columns
        else pl.lit(True)
    )
    when = ops.select("event", "ts_ns", (pl.col("role") == "gemm").alias("_made_by_gemm"))
    gemm_input = (
        edges.join(region.select(pl.col("gemm").alias("consumer")).unique(), on="consumer")
        .join(when.select(pl.col("event").alias("producer"), "ts_ns"), on="producer")
        .group_by(pl.col("consumer").alias("gemm"))
        .agg(pl.col("ts_ns").max().alias("_in_ts"))
    )
    into = (
        region.select("gemm", "op")
        .join(
            edges.select("producer", "consumer", "input_index", exact.alias("_exact")),
            left_on="op",
            right_on="consumer",
        )
        .join(when.rename({"ts_ns": "_p_ts"}), left_on="producer", right_on="event", how="left")
        .join(gemm_input, on="gemm", how="left")
    )
    guess = (
        ~pl.col("_exact")
        & (pl.col("_p_ts") < pl.col("_in_ts")).fill_null(False)
        & ~pl.col("_made_by_gemm").fill_null(False)
    )
    return (
        into.filter(~guess)
        .group_by("gemm", "op")
        .agg(pl.col("input_index").n_unique().alias("_known"))
    )


def first_gemm_reading(ops: pl.DataFrame, edges: pl.DataFrame, alias: str) -> pl.DataFrame:
    """`producer` and `alias`: the first GEMM (lowest event id) reading each op's output."""
    gemms = ops.filter(pl.col("role") == "gemm").select(pl.col("event").alias("consumer"))
    return (
        edges.join(gemms, on="consumer")
        .group_by("producer")
        .agg(pl.col("consumer").min().alias(alias))
    )


def parent_module() -> pl.Expr:
    """`parent_module`: an op's `module` less its last dotted part."""
    return pl.col("module").str.replace(r"\.[^.]*$", "").alias("parent_module")
