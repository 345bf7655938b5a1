"""What each semantic op is, for the fusion rules: a GEMM, an activation, an elementwise op,
a view, or something a compiler or library already fused.

The fusion rules (TQ101–TQ105) look for patterns in the data flow between ops; which ops
can take part is decided here, once, by op name (and the concrete scalar inputs where the
name alone does not tell: `clamp(min=0)` is a ReLU, `clamp(min=-1)` is not). Kernel names
never decide what an op is — cuBLAS picks `..._gemm_relu_...` kernels for plain Linear
layers — except for compiler- or library-generated kernels (Inductor's
`triton_poi_fused_..._gelu_mul_0`, `cpp_fused_...`, Liger's `_geglu_...`, vLLM's
`silu_and_mul`), whose names are the only record of what they fused.
"""

from __future__ import annotations

import polars as pl

from traceq.perf.traffic import ITEMSIZE, itemsize, numel
from traceq.relations.opnames import base_name
from traceq.relations.vocabulary import (
    ALIASES,
    UNARY_MATH,
    VIEWS,
)

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
    # the rest of torch.nn's pointwise activations: no cuBLASLt epilogue applies them,
    # Inductor's and Triton GEMM templates do (TQ102 names the fix by activation)
    "elu": "elu",
    "selu": "selu",
    "celu": "celu",
    "mish": "mish",
    "hardswish": "hardswish",
    "hardsigmoid": "hardsigmoid",
    "leaky_relu": "leaky_relu",
    "softplus": "softplus",
    "hardtanh": "hardtanh",
}


#: Ops that are a ReLU only for particular scalar arguments (checked on `concrete_inputs`).
RELU_LIKE = ("clamp", "clamp_min", "threshold")


#: Activation tokens in compiler-generated kernel names (`triton_poi_fused_gelu_0`).
ACTIVATION_TOKENS = (
    "gelu",
    "silu",
    "relu",
    "sigmoid",
    "tanh",
    "elu",
    "selu",
    "celu",
    "mish",
    "hardswish",
    "hardsigmoid",
    "softplus",
)


#: Elementwise ops: each reads and writes whole tensors with no reduction, so a chain of
#: them can run as one kernel. Casts move data only when the dtype changes (see `CASTS`).
ELEMENTWISE_OPS = UNARY_MATH | {
    "add",
    "addcdiv",
    "addcmul",
    "celu",
    "clamp",
    "clamp_max",
    "clamp_min",
    "div",
    "elu",
    "fmod",
    "gelu",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "leaky_relu",
    "lerp",
    "masked_fill",
    "maximum",
    "minimum",
    "mish",
    "mul",
    "pow",
    "relu",
    "remainder",
    "rsub",
    "selu",
    "sigmoid",
    "silu",
    "softplus",
    "sub",
    "tanh",
    "threshold",
    "true_divide",
    "where",
}


#: Casts: elementwise copies that count as their own kernel only when they launched one.
CASTS = frozenset({"to", "_to_copy", "type_as"})


#: Ops that only re-describe a tensor (no data moved): data flow passes through them.
VIEW_OPS = VIEWS | ALIASES


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


#: Another library's GEMM (`aiter::gemm_a16w16`, `mylib::fp8_mm`), a GEMM when its first
#: two inputs are 2-D `[M, K]` and `[N, K]` or `[K, N]` (`custom_gemm`); a custom op that
#: wraps `aten::linear` is not a semantic op at all (`dataflow.semantic_root`).
CUSTOM_GEMM = r"^[A-Za-z_]\w*::(?:\w*(?i:gemm|matmul|linear)|(?:\w*_)?mm(?:_\w*)?$)"
CORE_NS = r"^(?:aten|prims)::"


#: Integer and boolean dtypes: tensors of indices, positions and masks, not activations.
INTEGRAL = ("long int", "int", "short int", "signed char", "unsigned char", "bool")


ATEN_BASE = base_name(aten_only=True, in_place=False)
"""`aten::relu_` -> `relu`, of the `name` column: aten's op without namespace and in-place
suffix (`shapes.base_name`); another library's op (`zoo::glu`) keeps its namespace."""


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
    - `activation`: relu / gelu / silu / tanh / sigmoid / elu / mish / hardswish /
      leaky_relu / ... (`ACTIVATION_OPS`), or null;
    - `generated`: a compiler-generated kernel (Inductor), which the user did not write;
    - `glu_fused`: the op already computes `act(gate) * up` (never flag its GLU);
    - `custom_gemm`: a GEMM by its signature, not its name (`CUSTOM_GEMM`): another
      library's op whose inputs 0 and 1 are `[M, K]` and `[N, K]` or `[K, N]` (input 2, if
      1-D, its bias);
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
    base = ATEN_BASE
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
    custom = custom_gemm(name, pl.col("shapes"))
    glu_fused = name.str.contains(FUSED_GLU) | (compiled & token_act.is_not_null() & token_mul)
    glu_fused = glu_fused.fill_null(False)
    is_gemm = base.is_in(list(GEMM_OPERANDS)) | template | custom
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
    shapes = pl.col("shapes")
    x0, w1 = shapes.list.get(0, null_on_oob=True), shapes.list.get(1, null_on_oob=True)
    custom_bias = (shapes.list.get(2, null_on_oob=True).list.len() == 1).fill_null(False)
    gemm_x = base.replace_strict({k: v[0] for k, v in GEMM_OPERANDS.items()}, default=None)
    gemm_w = base.replace_strict({k: v[1] for k, v in GEMM_OPERANDS.items()}, default=None)
    gemm_b = base.replace_strict({k: v[2] for k, v in GEMM_OPERANDS.items()}, default=None)
    gemm_x = pl.when(custom).then(0).otherwise(gemm_x)
    gemm_w = pl.when(custom).then(1).otherwise(gemm_w)
    gemm_b = pl.when(custom).then(pl.when(custom_bias).then(2).otherwise(-1)).otherwise(gemm_b)
    w_shape = shapes.list.get(pl.col("gemm_w"), null_on_oob=True)
    bias_shape = shapes.list.get(pl.col("gemm_bias"), null_on_oob=True)
    nk = base.is_in(list(WEIGHT_NK)) | (custom & (w1.list.last() == x0.list.last()))
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
        custom.alias("custom_gemm"),
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


def custom_gemm(name: pl.Expr, shapes: pl.Expr) -> pl.Expr:
    """True for another library's op named as a GEMM (`CUSTOM_GEMM`) whose inputs 0 and 1
    are 2-D `[M, K]` and `[N, K]` or `[K, N]` (`perf.cost.gemm_layout`'s rule)."""
    x, w = shapes.list.get(0, null_on_oob=True), shapes.list.get(1, null_on_oob=True)
    k = x.list.last()
    fits = (
        (x.list.len() == 2) & (w.list.len() == 2) & ((w.list.last() == k) | (w.list.first() == k))
    )
    return (name.str.contains(CUSTOM_GEMM) & ~name.str.contains(CORE_NS) & fits).fill_null(False)


def _integral(types: pl.Expr) -> pl.Expr:
    """True where every tensor dtype in `types` (profiler `Input type`s; scalars and
    non-tensors left out) is integral, and there is one."""
    tensors = types.list.eval(pl.element().filter(pl.element().is_in(list(ITEMSIZE))))
    return (
        (tensors.list.len() > 0) & tensors.list.eval(pl.element().is_in(list(INTEGRAL))).list.all()
    ).fill_null(False)
