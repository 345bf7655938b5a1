"""What each semantic op is, for the fusion rules: a GEMM, an activation, an elementwise op,
a view, or something a compiler or library already fused.

The fusion rules (TQ101–TQ105) look for patterns in the data flow between ops; which ops
can take part is decided here, once, by op name (and the concrete scalar inputs where the
name alone does not tell: `clamp(min=0)` is a ReLU, `clamp(min=-1)` is not). Kernel names
never decide what an op is — cuBLAS picks `..._gemm_relu_...` kernels for plain Linear
layers — except for compiler- or library-generated kernels (Inductor's
`triton_poi_fused_..._gelu_mul_0`, `cpp_fused_...`, Liger's `_geglu_...`, vLLM's
`silu_and_mul`), whose names are the only record of what they fused.

It also resolves the two op-group shapes several rules share: edges that pass through views
(`GEMM -> view -> add` is still "the GEMM's output goes into the add"), and activations
written out as pointwise ops (GPT-2's `gelu_new`, `x * sigmoid(x)`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.kernel_names import decode
from traceq.relations import autograd
from traceq.relations.dataflow import module_calls
from traceq.rules.common import common_module

if TYPE_CHECKING:
    from traceq.rules.base import Context

# -- vocabularies ------------------------------------------------------------------------

#: GEMM ops -> (index of the activation operand `x`, index of the weight, index of the bias
#: or -1). `x` is what the GEMM reads from upstream; `w` gives K and N.
GEMM_OPERANDS: dict[str, tuple[int, int, int]] = {
    "linear": (0, 1, 2),
    "addmm": (1, 2, 0),
    "mm": (0, 1, -1),
    "matmul": (0, 1, -1),
    "bmm": (0, 1, -1),
    "baddbmm": (1, 2, 0),
    "_addmm_activation": (1, 2, 0),
    "_scaled_mm": (0, 1, -1),
    "_int_mm": (0, 1, -1),
}
#: GEMMs whose weight is laid out [N, K] (nn.Linear's layout); the others are [.., K, N].
WEIGHT_NK = ("linear",)
#: GEMMs that already apply an activation in their epilogue.
GEMM_WITH_ACTIVATION = ("_addmm_activation",)

#: Eager activation ops (in-place variants end in `_` and map the same way).
ACTIVATION_OPS: dict[str, str] = {
    "relu": "relu",
    "gelu": "gelu",
    "silu": "silu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
}
#: Ops that are a ReLU only for particular scalar arguments (checked on `concrete_inputs`).
RELU_LIKE = ("clamp", "clamp_min", "threshold")

#: Activation tokens in compiler-generated kernel names (`triton_poi_fused_gelu_0`).
ACTIVATION_TOKENS = ("gelu", "silu", "relu", "sigmoid", "tanh")

#: Elementwise ops: each reads and writes whole tensors with no reduction, so a chain of
#: them can run as one kernel. Casts move data only when the dtype changes (see `CASTS`).
ELEMENTWISE_OPS = frozenset(
    {
        "add",
        "sub",
        "rsub",
        "mul",
        "div",
        "true_divide",
        "pow",
        "neg",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log1p",
        "log2",
        "sqrt",
        "rsqrt",
        "abs",
        "reciprocal",
        "square",
        "sin",
        "cos",
        "erf",
        "erfc",
        "sign",
        "floor",
        "ceil",
        "round",
        "trunc",
        "fmod",
        "remainder",
        "clamp",
        "clamp_min",
        "clamp_max",
        "minimum",
        "maximum",
        "where",
        "addcmul",
        "addcdiv",
        "lerp",
        "masked_fill",
        "threshold",
        "leaky_relu",
        "hardtanh",
        "hardswish",
        "hardsigmoid",
        "softplus",
        "mish",
        "elu",
        *ACTIVATION_OPS,
    }
)
#: Casts: elementwise copies that count as their own kernel only when they launched one.
CASTS = frozenset({"to", "_to_copy", "type_as"})
#: Ops that only re-describe a tensor (no data moved): data flow passes through them.
VIEW_OPS = frozenset(
    {
        "view",
        "reshape",
        "_unsafe_view",
        "_reshape_alias",
        "flatten",
        "unflatten",
        "squeeze",
        "unsqueeze",
        "expand",
        "chunk",
        "split",
        "split_with_sizes",
        "unsafe_chunk",
        "unsafe_split",
        "slice",
        "narrow",
        "select",
        "detach",
        "alias",
    }
)

#: Kernels and custom ops that already compute `act(gate) * up` in one pass.
FUSED_GLU = (
    r"(?i)(silu_and_mul|gelu_and_mul|gelu_tanh_and_mul|gelu_fast_and_mul|gelu_new_and_mul"
    r"|act_and_mul|swiglu|geglu|reglu|liger|^zoo::)"
)
#: Compiler-generated kernels: Inductor's Triton (`triton_poi_fused_...`, `triton_tem_...`)
#: and C++ (`cpp_fused_...`, `graph_0_cpp_fused_...`) kernels.
COMPILED = r"(?:^|_)(?:triton|cpp)_(?:(?:poi|red|per|tem)_)?fused"
COMPILED_TOKENS = r"fused_+(.*?)(?:_\d+)?$"
TEMPLATE_GEMM = r"(?:^|_)triton_tem_"

#: Bytes per element of the dtype strings the profiler writes in `Input type`.
ITEMSIZE: dict[str, int] = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
}


#: Integer and boolean dtypes: tensors of indices, positions and masks, not activations.
INTEGRAL = ("long int", "int", "short int", "signed char", "unsigned char", "bool")


# -- expressions -------------------------------------------------------------------------


def base_name(name: pl.Expr | str = "name") -> pl.Expr:
    """`aten::relu_` -> `relu`: the op without namespace and in-place suffix."""
    col = pl.col(name) if isinstance(name, str) else name
    return col.str.replace(r"^aten::", "").str.replace(r"([a-z0-9])_$", "$1")


def numel(shape: pl.Expr) -> pl.Expr:
    """Elements of a shape list ([] is a 0-d tensor: 1 element)."""
    return shape.list.eval(pl.element().product()).list.first().cast(pl.Int64)


def itemsize(dtype: pl.Expr) -> pl.Expr:
    """Bytes per element of a profiler dtype string; 4 when unknown (fp32 is the default)."""
    return dtype.replace_strict(ITEMSIZE, default=4, return_dtype=pl.Int64)


def _scalar_is(values: pl.Expr, index: int, target: float) -> pl.Expr:
    return values.list.get(index, null_on_oob=True).cast(pl.Float64, strict=False) == target


def _scalar_absent(values: pl.Expr, index: int) -> pl.Expr:
    item = values.list.get(index, null_on_oob=True)
    return item.is_null() | (item == "") | (item == "None")


#: What `classify` reads: ops that agree on these are classified once (a trace repeats a
#: few hundred signatures thousands of times).
SIGNATURE = (
    "name",
    "shapes",
    "input_types",
    "concrete_inputs",
    "dtype",
    "data_inputs",
    "output_shape",
)


def classify(ops: pl.DataFrame) -> pl.DataFrame:
    """`ops` (semantic ops, see `traceq.relations.dataflow.dataflow_ops`, plus `concrete_inputs`)
    with the columns the fusion rules match on (`_classified`), computed once per distinct
    signature and joined back."""
    signatures = ops.select(SIGNATURE).unique(maintain_order=True)
    classified = _classified(signatures)
    added = [c for c in classified.columns if c not in SIGNATURE]
    return ops.drop(added, strict=False).join(
        classified,
        on=list(SIGNATURE),
        how="left",
        nulls_equal=True,
        maintain_order="left",
    )


def _classified(ops: pl.DataFrame) -> pl.DataFrame:
    """`ops` with the columns the fusion rules match on:

    - `role`: "gemm", "activation", "elementwise", "cast", "view", "fused" (a kernel or op
      that already fuses several ops) or "other";
    - `activation`: relu / gelu / silu / tanh / sigmoid, or null;
    - `generated`: a compiler-generated kernel (Inductor), which the user did not write;
    - `glu_fused`: the op already computes `act(gate) * up` (never flag its GLU);
    - `gemm_x`, `gemm_w`, `gemm_bias`: operand indices of a GEMM (null otherwise),
      `has_bias`, and `epilogue_act` (the GEMM already applies an activation);
    - `x_shape`, `k`, `n`: a GEMM's activation operand shape, reduction size, out features;
    - `tensor_inputs`: how many inputs carry tensor data (`data_inputs`, 0-d wrapped
      scalars left out);
    - `itemsize`: bytes per element of the op's dtype; `traffic_bytes`: what the op reads
      and writes if every tensor input and its output go through memory once;
    - `integral`: every tensor input is of an integer or boolean dtype (index, position
      and mask arithmetic).
    """
    name = pl.col("name")
    base = base_name("name")
    concrete = pl.col("concrete_inputs")
    compiled = name.str.contains(COMPILED)
    tokens = (
        name.str.extract(COMPILED_TOKENS)
        .str.split("_")
        .list.eval(pl.element().filter(pl.element() != ""))
    )
    token_act = tokens.list.eval(
        pl.element().filter(pl.element().is_in(ACTIVATION_TOKENS))
    ).list.first()
    token_mul = tokens.list.contains("mul")

    eager_act = base.replace_strict(ACTIVATION_OPS, default=None, return_dtype=pl.String)
    relu_like = (
        ((base == "clamp") & _scalar_is(concrete, 1, 0.0) & _scalar_absent(concrete, 2))
        | ((base == "clamp_min") & _scalar_is(concrete, 1, 0.0))
        | ((base == "threshold") & _scalar_is(concrete, 1, 0.0) & _scalar_is(concrete, 2, 0.0))
    )
    activation = (
        pl.when(compiled)
        .then(token_act)
        .when(relu_like.fill_null(False))
        .then(pl.lit("relu"))
        .otherwise(eager_act)
    )
    template = name.str.contains(TEMPLATE_GEMM)
    glu_fused = name.str.contains(FUSED_GLU) | (compiled & token_act.is_not_null() & token_mul)
    glu_fused = glu_fused.fill_null(False)
    is_gemm = base.is_in(list(GEMM_OPERANDS)) | template
    role = (
        pl.when(is_gemm)
        .then(pl.lit("gemm"))
        .when(glu_fused)
        .then(pl.lit("fused"))
        .when(compiled & token_act.is_not_null())
        .then(pl.lit("activation"))
        .when(compiled)
        .then(pl.lit("fused"))
        .when(activation.is_not_null())
        .then(pl.lit("activation"))
        .when(base.is_in(list(ELEMENTWISE_OPS)))
        .then(pl.lit("elementwise"))
        .when(base.is_in(list(CASTS)))
        .then(pl.lit("cast"))
        .when(base.is_in(list(VIEW_OPS)))
        .then(pl.lit("view"))
        .otherwise(pl.lit("other"))
    )
    gemm_x = base.replace_strict({k: v[0] for k, v in GEMM_OPERANDS.items()}, default=None)
    gemm_w = base.replace_strict({k: v[1] for k, v in GEMM_OPERANDS.items()}, default=None)
    gemm_b = base.replace_strict({k: v[2] for k, v in GEMM_OPERANDS.items()}, default=None)
    shapes = pl.col("shapes")
    w_shape = shapes.list.get(pl.col("gemm_w"), null_on_oob=True)
    bias_shape = shapes.list.get(pl.col("gemm_bias"), null_on_oob=True)
    nk = base.is_in(list(WEIGHT_NK))
    gemm = pl.col("role") == "gemm"
    # 0-d inputs are Python scalars wrapped as tensors (`x * 2`): passed by value, no traffic
    data = pl.col("data_inputs").list.eval(
        pl.element().filter(pl.element().struct.field("shape").list.len() > 0)
    )
    input_elems = data.list.eval(numel(pl.element().struct.field("shape")).sum()).list.first()
    output_elems = numel(pl.col("output_shape"))

    return ops.with_columns(
        role.alias("role"),
        activation.alias("activation"),
        compiled.alias("generated"),
        glu_fused.alias("glu_fused"),
        gemm_x.cast(pl.Int64).alias("gemm_x"),
        gemm_w.cast(pl.Int64).alias("gemm_w"),
        pl.when(gemm_b >= 0).then(gemm_b).cast(pl.Int64).alias("gemm_bias"),
        (base.is_in(list(GEMM_WITH_ACTIVATION)) | (template & token_act.is_not_null()))
        .fill_null(False)
        .alias("epilogue_act"),
        data.list.len().fill_null(0).cast(pl.Int64).alias("tensor_inputs"),
        itemsize(pl.col("dtype")).alias("itemsize"),
        _integral(pl.col("input_types")).alias("integral"),
    ).with_columns(
        pl.when(gemm).then(shapes.list.get(pl.col("gemm_x"), null_on_oob=True)).alias("x_shape"),
        pl.when(gemm)
        .then(
            pl.when(nk).then(w_shape.list.last()).otherwise(w_shape.list.get(-2, null_on_oob=True))
        )
        .alias("k"),
        pl.when(gemm)
        .then(pl.when(nk).then(w_shape.list.first()).otherwise(w_shape.list.last()))
        .alias("n"),
        # a TorchInductor template GEMM fuses its epilogue: count it as biased
        ((bias_shape.list.len() > 0).fill_null(False) | template).alias("has_bias"),
        ((input_elems.fill_null(0) + output_elems.fill_null(0)) * pl.col("itemsize")).alias(
            "traffic_bytes"
        ),
    )


def _integral(types: pl.Expr) -> pl.Expr:
    """True where every tensor dtype in `types` (profiler `Input type`s; scalars and
    non-tensors left out) is integral, and there is one."""
    tensors = types.list.eval(pl.element().filter(pl.element().is_in(list(ITEMSIZE))))
    return (
        (tensors.list.len() > 0) & tensors.list.eval(pl.element().is_in(list(INTEGRAL))).list.all()
    ).fill_null(False)


def input_bytes(ops: pl.DataFrame) -> pl.DataFrame:
    """One row per tensor input of each op: `event`, `input_index`, `bytes`."""
    return (
        ops.select("event", "data_inputs", "itemsize")
        .explode("data_inputs")
        .drop_nulls("data_inputs")
        .unnest("data_inputs")
        .filter(pl.col("shape").list.len() > 0)
        .select(
            "event",
            pl.col("index").alias("input_index"),
            (numel(pl.col("shape")) * pl.col("itemsize")).alias("bytes"),
        )
    )


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
        classified = (
            classify(ops)
            .join(calls, on="event", how="left", maintain_order="left")
            .with_columns(pl.col(time).fill_null(0).alias("time_ns"))
        )
        if gpu:
            return classified
        # on the CPU `_addmm_activation` runs `addmm` then `gelu_` / `relu_`: no epilogue
        return classified.with_columns(
            (pl.col("epilogue_act") & ~base_name("name").is_in(GEMM_WITH_ACTIVATION)).alias(
                "epilogue_act"
            )
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
    gemms = ops.filter(
        base_name("name").is_in(GEMM_WITH_ACTIVATION) & ~pl.col("epilogue_act")
    ).select(pl.exclude("name", "ts_ns", "time_ns", "kernel_events", "kernel_names"))
    children = ctx.trace.ops.filter(
        base_name("name").is_in(list(ACTIVATION_OPS))
        & pl.col("parent").is_in(gemms["event"].implode())
    ).select(
        pl.col("event").cast(pl.Int64).alias("_child"),
        "name",
        "ts_ns",
        pl.col("dur_ns").alias("time_ns"),
        pl.col("parent").cast(pl.Int64).alias("event"),
        base_name("name").replace_strict(ACTIVATION_OPS, default=None).alias("_activation"),
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


AUTOGRAD_NODE = rf"{autograd.NODE}|^{autograd.ENGINE_FRAME} |^{autograd.ANONYMISED_NODE}$"
"""An autograd node as the profiler names it (`AddmmBackward0`, the engine's frame around
one, or a trace's anonymised `<backward op>`)."""


def autograd_work(ctx: Context) -> pl.Series:
    """Events of the fusion ops an autograd node runs: the backward pass's work."""
    nodes = ctx.trace.ops.filter(pl.col("name").str.contains(AUTOGRAD_NODE)).select(
        pl.col("event").cast(pl.Int64).alias("parent")
    )
    return fusion_ops(ctx).join(nodes, on="parent", how="semi")["event"]


def fusion_edges(ctx: Context) -> pl.DataFrame:
    """The analysis' data-flow edges with views bypassed (`through_views`), once."""
    return ctx.cached("fusion.edges", lambda: through_views(fusion_ops(ctx), ctx.edges))


# -- op groups ---------------------------------------------------------------------------


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


def written_out_activations(
    ops: pl.DataFrame, edges: pl.DataFrame, max_ops: int = 8
) -> pl.DataFrame:
    """Activations spelled as pointwise ops on a GEMM's output: GPT-2's `gelu_new`
    (`0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))`), erf-GELU, `x * sigmoid(x)` (SiLU)
    and `x * sigmoid(1.702 * x)` (QuickGELU, named `quick_gelu`).

    A region is the set of elementwise ops reachable from the GEMM through same-shaped
    edges (one size: a view may sit in between) whose every tensor input comes from the
    GEMM or from the region itself (so it is
    a function of the GEMM output alone), holding a tanh, erf or sigmoid and at least two
    ops. One row per GEMM: `gemm`, `ops` (the region's event ids), `output` (the op whose
    result leaves the region), `activation` ("gelu" or "silu").

    `ops` must be `classify`d; `edges` should be `through_views`.
    """
    # sizes, not shapes: a view may sit between the GEMM and the activation (GPT-2's Conv1D
    # runs `addmm` on [B*T, 4H] and views the result as [B, T, 4H] before `gelu_new`)
    pointwise = ops.filter(
        pl.col("role").is_in(["elementwise", "activation"]) & ~pl.col("generated")
    ).select(
        "event",
        "name",
        numel(pl.col("output_shape")).alias("_size"),
        "tensor_inputs",
    )
    gemms = ops.filter(pl.col("role") == "gemm").select(
        pl.col("event").alias("gemm"), numel(pl.col("output_shape")).alias("gemm_size")
    )
    same = edges.select("producer", "consumer", "input_index")
    # grow each GEMM's region along same-sized pointwise consumers
    region = (
        same.join(gemms, left_on="producer", right_on="gemm", how="inner")
        .join(pointwise, left_on="consumer", right_on="event", how="inner")
        .filter(pl.col("_size") == pl.col("gemm_size"))
        .select(pl.col("producer").alias("gemm"), pl.col("consumer").alias("op"), "gemm_size")
        .unique()
    )
    for _ in range(max_ops):
        grown = (
            region.join(same, left_on="op", right_on="producer", how="inner")
            .join(pointwise, left_on="consumer", right_on="event", how="inner")
            .filter(pl.col("_size") == pl.col("gemm_size"))
            .select("gemm", pl.col("consumer").alias("op"), "gemm_size")
        )
        merged = pl.concat([region, grown]).unique()
        if merged.height == region.height:
            break
        region = merged
    # prune ops with a tensor input from outside the region, until nothing changes
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
            .filter(pl.col("fed") >= pl.col("tensor_inputs"))
            .select("gemm", "op", "gemm_size")
        )
        if kept.height == region.height:
            break
        region = kept
    named = region.join(
        pointwise.select("event", "name", "tensor_inputs"), left_on="op", right_on="event"
    )
    internal = same.join(
        region.select("gemm", pl.col("op").alias("producer")), on="producer", how="inner"
    ).join(region.select("gemm", pl.col("op").alias("consumer")), on=["gemm", "consumer"])
    sinks = region.join(
        internal.select("gemm", pl.col("producer").alias("op")).unique(),
        on=["gemm", "op"],
        how="anti",
    )
    base = base_name("name")
    groups = named.group_by("gemm").agg(
        pl.col("op").sort().alias("ops"),
        base.is_in(["tanh", "erf"]).any().alias("_gelu"),
        (base == "sigmoid").any().alias("_sigmoid"),
        # QuickGELU, `x * sigmoid(1.702 * x)` (CLIP): the sigmoid reads x scaled by a Python
        # number (a `mul` with one tensor input; the profiler records no scalar's value).
        # Not SiLU, `x * sigmoid(x)`: suggesting `F.silu` would change the model's numerics.
        ((base == "mul") & (pl.col("tensor_inputs") == 1)).any().alias("_quick"),
        pl.len().alias("_n"),
    )
    return (
        groups.filter((pl.col("_n") >= 2) & (pl.col("_gelu") | pl.col("_sigmoid")))
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


# -- findings ----------------------------------------------------------------------------

DETAIL_COLUMNS = (
    "event",
    "name",
    "ts_ns",
    "step",
    "module",
    "shapes",
    "dtype",
    "output_shape",
    "kernel_events",
    "kernel_names",
    "time_ns",
    "traffic_bytes",
    "itemsize",
)


def details(ops: pl.DataFrame, events: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The rows of `ops` for `events`, by event id: what a finding needs to describe them.

    Rules match patterns with joins; only the (few) ops that end up in findings are turned
    into Python values, once each.
    """
    wanted = pl.Series("event", sorted(set(events)), dtype=pl.Int64)
    rows = ops.filter(pl.col("event").is_in(wanted.implode())).select(DETAIL_COLUMNS)
    return {row["event"]: row for row in rows.iter_rows(named=True)}


def located(ctx: Context, rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The fields every fusion finding shares: where it is (step, module), what it is made
    of (ops, kernels, their names), and what it costs now (`time_us`: GPU time of the
    kernels on a GPU trace, CPU time of the ops on a CPU-only one)."""
    rows = sorted(rows, key=lambda r: (r["ts_ns"], r["event"]))
    kernel_names = [n for r in rows for n in r["kernel_names"]]
    evidence: dict[str, Any] = {
        "op_names": [r["name"] for r in rows],
        "kernel_names": kernel_names,
        "op_time_us": [round(r["time_ns"] / 1000, 3) for r in rows],
        "time_basis": "gpu kernels" if ctx.device.kind == "gpu" else "cpu ops",
    }
    decoded = decode_kernels(kernel_names)
    if decoded:
        evidence["decoded"] = decoded
    return {
        "step": rows[0]["step"],
        "module": common_module([r["module"] for r in rows]),
        "ops": [r["event"] for r in rows],
        "kernels": [k for r in rows for k in r["kernel_events"]],
        "dtype": next((r["dtype"] for r in rows if r["dtype"]), None),
        "time_us": sum(r["time_ns"] for r in rows) / 1000,
        "evidence": evidence,
    }


def decode_kernels(names: list[str]) -> list[str]:
    """One line per distinct kernel name saying what the name encodes (library, arch,
    dtype, tile, layout, epilogue, fused ops): evidence a reader can check, never the
    classification itself."""
    return [decode(name).describe() for name in dict.fromkeys(names)]


def scaled_saving_us(removed_us: float, unfused_bytes: float, fused_bytes: float) -> float:
    """Measured time of the ops a fusion replaces, scaled by the memory traffic it keeps.

    These ops are memory-bound, so their time follows the bytes they move: a fused kernel
    that moves `fused_bytes` where the separate ops moved `unfused_bytes` takes about
    `removed_us * fused / unfused`, and the rest is saved. With nothing left to move (an
    activation folded into a GEMM epilogue) the whole measured time is saved.
    """
    if fused_bytes <= 0:
        return removed_us
    if unfused_bytes <= 0:
        return 0.0
    return removed_us * max(0.0, 1.0 - fused_bytes / unfused_bytes)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.1f} KiB"


def shape_text(shape: list[int] | None) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]" if shape is not None else "[?]"
