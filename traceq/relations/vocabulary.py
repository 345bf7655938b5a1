"""Families of aten ops and recorded argument types, spelled once for every stage.

Data flow's shape rules (`relations.dataflow.shapes`), the performance model
(`perf.cost`, `perf.flop_table`) and the rules' op classes (`rules.op_classes`) each ask
"is this a view, a comparison, a reduction?". Each builds its own set from these families
(a view to data flow is not always free to the cost model), so the families live here,
below all three, and each consumer says only how its set differs. Names are base names
(`relations.opnames.base_name`, in-place `_` dropped).
"""

from __future__ import annotations

#: Ops that re-describe a tensor's shape without moving data: a view of their input.
VIEWS = frozenset(
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
    }
)

#: Views that change strides as well as shape (a transpose, a permute): still no data
#: moved, but a GEMM or a pointwise kernel reading them sees another layout.
STRIDED_VIEWS = frozenset(
    {
        "t",
        "transpose",
        "permute",
        "numpy_T",
        "as_strided",
        "expand_as",
        "view_as",
        "reshape_as",
        "unbind",
    }
)

#: Ops that return their input under another name (autograd's `detach`, `alias`).
ALIASES = frozenset({"detach", "alias"})

#: Comparisons of two tensors (or a tensor and a scalar): a boolean per element.
BINARY_COMPARISONS = frozenset(
    {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"}
)

#: Every op whose output is a boolean per element.
COMPARISONS = BINARY_COMPARISONS | {"logical_not", "isnan", "isinf"}

#: Reductions over one or more dimensions (the output keeps the rest).
REDUCTIONS = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "prod",
        "norm",
        "linalg_vector_norm",
        "var",
        "std",
        "var_mean",
        "std_mean",
        "logsumexp",
        "argmax",
        "argmin",
        "all",
        "any",
        "count_nonzero",
    }
)

#: Losses: a reduction of a prediction against a target.
LOSSES = frozenset({"mse_loss", "nll_loss", "cross_entropy_loss", "l1_loss", "smooth_l1_loss"})

#: Recorded `Input type` strings of arguments that are not tensors.
NOT_TENSOR = frozenset(
    {"Scalar", "ScalarList", "TensorList", "GenericList", "", "None", "String", "Device"}
)

#: Matrix products: a GEMM (or GEMV) kernel each.
GEMMS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "matmul",
        "linear",
        "mv",
        "addmv",
        "dot",
        "_addmm_activation",
        "_scaled_mm",
        "_int_mm",
        "_grouped_mm",
    }
)

#: Convolutions, forward, as ATen dispatches them.
CONVOLUTIONS = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "convolution",
        "_convolution",
        "cudnn_convolution",
        "mkldnn_convolution",
        "miopen_convolution",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
    }
)

#: Elementwise math of one tensor: one value in, one value out, same shape.
UNARY_MATH = frozenset(
    {
        "neg",
        "abs",
        "sign",
        "square",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log1p",
        "log2",
        "erf",
        "erfc",
        "sin",
        "cos",
        "floor",
        "ceil",
        "round",
        "trunc",
    }
)
