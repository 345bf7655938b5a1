"""What an op is, which of its inputs carry data, and the shape of what it returns.

Kineto records the input shapes of each op (`Input Dims`) and the values of its scalar
arguments (`Concrete Inputs`), never the output. Data flow between ops needs outputs, so
they are derived here from PyTorch's own shape rules: GEMMs (`linear`, `addmm`, `mm`,
`matmul`, `bmm`, ...), broadcasting for elementwise ops, the size arguments of views and
reductions, and "the largest buffer" for Inductor's fused kernels (whose outputs are among
their arguments). Unknown ops get no output shape rather than a guess.

This runs once per distinct (name, input dims, concrete inputs) signature, not per op: a
trace repeats the same few hundred signatures thousands of times.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from traceq.relations.opnames import (  # noqa: F401 (re-exported: the data-flow names)
    IN_PLACE_SUFFIX,
    NAMESPACE,
    OVERLOAD,
    base_name,
)
from traceq.relations.vocabulary import (
    BINARY_COMPARISONS,
    CONVOLUTIONS,
    GEMMS,
    LOSSES,
    NOT_TENSOR,
    REDUCTIONS,
    STRIDED_VIEWS,
    UNARY_MATH,
    VIEWS,
)

Shape = list[int]

# Kinds, in the words the rules use.
GEMM = "gemm"
ACTIVATION = "activation"
ELEMENTWISE = "elementwise"
UNARY = "unary"
NORM = "norm"
REDUCTION = "reduction"
VIEW = "view"
COPY = "copy"
ATTENTION = "attention"
CONV = "conv"
FACTORY = "factory"
FUSED = "fused"
COLLECTIVE = "collective"
OTHER = "other"

FUSED_KERNEL = r"^(triton_\w+|graph_\d+_cpp_fused\w*|cpp_fused\w*|kernel_cpp_\w+)$"
SEMANTIC_OP = r"^[A-Za-z_]\w*::[A-Za-z_]\w*(?:\.\w+)?$"
"""A dispatcher op `ns::name` (aten, prims, zoo, c10d, fbgemm, ...), ..."""
NOT_SEMANTIC_NS = ("autograd::", "profiler::", "torch::")
"""... but not autograd nodes, profiler markers or `torch::autograd::*`."""

_GEMM = GEMMS
_ACTIVATION = {
    "relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "mish",
    "softplus",
    "clamp",
    "clamp_min",
    "clamp_max",
    "threshold",
    "relu6",
    "prelu",
    "softmax",
    "_softmax",
    "log_softmax",
    "_log_softmax",
}
_UNARY = UNARY_MATH | {
    "bernoulli_",
    "bitwise_not",
    "cumsum",
    "dropout",
    "feature_dropout",
    "fill",
    "fill_",
    "flip",
    "isinf",
    "isnan",
    "logical_not",
    "masked_fill",
    "nan_to_num",
    "native_dropout",
    "normal_",
    "roll",
    "rotary_embedding",
    "tan",
    "tril",
    "triu",
    "uniform_",
    "zero_",
}
_ELEMENTWISE = BINARY_COMPARISONS | {
    "add",
    "addcdiv",
    "addcmul",
    "atan2",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "div",
    "floor_divide",
    "fmax",
    "fmin",
    "fmod",
    "gelu_backward",
    "hardswish_backward",
    "hypot",
    "leaky_relu_backward",
    "lerp",
    "masked_scatter",
    "maximum",
    "minimum",
    "mul",
    "pow",
    "remainder",
    "rsub",
    "sigmoid_backward",
    "silu_backward",
    "sub",
    "tanh_backward",
    "threshold_backward",
    "true_divide",
    "where",
}
_NORM = {
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "_fused_rms_norm",
    "group_norm",
    "native_group_norm",
    "batch_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training",
    "cudnn_batch_norm",
    "miopen_batch_norm",
    "instance_norm",
    "_batch_norm_impl_index",
    "normalize",
}
_REDUCTION = REDUCTIONS
_LOSS = LOSSES
_SAME_SHAPE_COPY = {
    "to",
    "_to_copy",
    "contiguous",
    "clone",
    "copy_",
    "detach",
    "detach_",
    "alias",
    "lift_fresh",
    "type_as",
    "resolve_conj",
    "resolve_neg",
    "_conj",
    "pin_memory",
    "cuda",
    "cpu",
}
_VIEW = VIEWS | STRIDED_VIEWS | {"cat", "stack", "index_select", "gather", "index"}
_ATTENTION = {
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward",
    "_efficient_attention_forward",
}
_CONV = CONVOLUTIONS
_POOL = {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d"}
_ADAPTIVE_POOL = {"adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool2d"}
_FACTORY = {
    "empty",
    "zeros",
    "ones",
    "full",
    "rand",
    "randn",
    "randint",
    "empty_strided",
    "new_empty",
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty_strided",
    "arange",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "rand_like",
    "randn_like",
}
_GRAD_LIKE = {
    "mse_loss_backward": 1,
    "l1_loss_backward": 1,
    "smooth_l1_loss_backward": 1,
    "huber_loss_backward": 1,
    "nll_loss_backward": 1,
    "_softmax_backward_data": 0,
    "_log_softmax_backward_data": 0,
    "max_pool2d_with_indices_backward": 1,
    "max_pool3d_with_indices_backward": 1,
    "avg_pool2d_backward": 1,
    "avg_pool3d_backward": 1,
}
"""Backward ops whose result (a gradient) has the shape of the input at this position."""
GRADIENT_OUTPUTS = {
    "convolution_backward": 10,
    "native_batch_norm_backward": 9,
    "native_layer_norm_backward": 7,
    "native_group_norm_backward": 9,
}
"""Backward ops returning the gradients of an input, a weight and a bias, each where its
`output_mask` (the argument at this position) asks for it (`gradient_outputs`)."""
_ELEMENTS_SHAPED = {"isin", "bucketize"}
"""Ops whose result has the shape of their first argument (`isin(elements, test)`): left
unknown, the op after it read the value before it (`generate`'s stopping criteria:
`any(isin(ids[:, -1:], eos))` read as `any(ids[:, -1:])`, 8 wrong edges in the corpus)."""
_COLLECTIVE_NS = {"c10d", "_c10d_functional", "c10d_functional"}
MULTI_OUTPUT = {"chunk", "unsafe_chunk", "split", "unsafe_split", "split_with_sizes", "unbind"}
"""Ops returning several tensors; `output_shape` is the shape they share, when they do."""
VALUES_AND_INDICES = {"topk", "sort"}
"""Ops returning two tensors of one shape, the values (the input's dtype) and their indices
(`long`): a Mixture of Experts router's `topk`, its dispatch's `sort` of the expert ids."""
"""`Input type` values that are not a tensor (a tensor's type is its dtype, e.g. `float`)."""


@dataclass(frozen=True)
class Signature:
    """What one op signature consumes and returns."""

    kind: str
    inputs: list[tuple[int, Shape]]
    """(input index, shape) of each data input: tensors the op reads as data."""
    output: Shape | None


def _plain(op: str) -> str:
    """`add_` -> `add`: the in-place `_` dropped (dunders such as `__and__` kept)."""
    return op[:-1] if op.endswith("_") and not op.endswith("__") else op


def kind_of(name: str) -> str:
    """The op's kind: gemm, activation, elementwise, norm, view, fused, ... or other."""
    if re.match(FUSED_KERNEL, name):
        return FUSED
    ns = name.split("::", 1)[0] if "::" in name else ""
    if ns in _COLLECTIVE_NS:
        return COLLECTIVE
    op = base_name(name)
    plain = _plain(op)
    for kind, names in (
        (GEMM, _GEMM),
        (ACTIVATION, _ACTIVATION),
        (ELEMENTWISE, _ELEMENTWISE),
        (NORM, _NORM),
        (REDUCTION, _REDUCTION | _LOSS),
        (COPY, _SAME_SHAPE_COPY),
        (VIEW, _VIEW),
        (ATTENTION, _ATTENTION),
        (CONV, _CONV | _POOL | _ADAPTIVE_POOL),
        (FACTORY, _FACTORY),
        (UNARY, _UNARY),
    ):
        if op in names or plain in names:
            return kind
    return OTHER


PAIRWISE_EXTREMES = frozenset({"min", "max"})
"""Reductions by name that, given two tensors, are elementwise: `torch.min(a, b)` (T5's
relative position buckets, `-torch.min(rp, torch.zeros_like(rp))`) returns the broadcast
shape and reads both, where `torch.min(a)` returns a 0-d tensor."""


def signature(
    name: str, input_dims: str | None, types: list[str] | None, concrete: list[str] | None
) -> Signature:
    """Kind, data inputs and output shape of one op call; `output` is None when unknown."""
    kind = kind_of(name)
    dims = parse_dims(input_dims)
    if not isinstance(dims, list):
        return Signature(kind, [], None)
    types = list(types or [])
    concrete = list(concrete or [])
    types += [""] * (len(dims) - len(types))
    concrete += [""] * (len(dims) - len(concrete))
    tensors = [
        (i, d)
        for i, (d, t) in enumerate(zip(dims, types, strict=False))
        if t not in NOT_TENSOR and is_shape(d)
    ]
    op = base_name(name)
    plain = _plain(op)
    if plain in PAIRWISE_EXTREMES and len(tensors) == 2:
        kind = ELEMENTWISE
    try:
        output = _output(kind, plain, op, dims, tensors, concrete)
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError):
        output = None
    if not is_shape(output):  # junk dims (lists in lists) give junk out: unknown
        output = None
    inputs = [(i, d) for i, d in tensors if i in _data_positions(kind, plain, i)]
    inputs = sorted(inputs + list_elements(dims, types), key=lambda e: e[0])
    return Signature(kind, inputs, output)


def list_elements(dims: list, types: list[str]) -> list[tuple[int, Shape]]:
    """(argument index, shape) of each tensor of a `TensorList` argument, in list order.

    Kineto records a tensor list (`cat`'s, `stack`'s) as one argument whose `Input Dims`
    entry is a list of shapes (`[[[2, 8, 8], [2, 8, 8]], []]`); each tensor is a data
    input of its own, all at the argument's index (an Execution Trace numbers them so too),
    and their order within the argument is the list's. An empty tensor (`[0]`: a KV cache
    before its first step) is read by no one that matters and is left out."""
    return [
        (i, element)
        for i, (d, t) in enumerate(zip(dims, types, strict=False))
        if t == "TensorList" and isinstance(d, list)
        for element in d
        if is_shape(element)
    ]


def numel(shape: Shape) -> int:
    return math.prod(shape)


# -- helpers ----------------------------------------------------------------------------


def parse_dims(text: str | None) -> list | None:
    """A recorded `Input Dims` text as JSON, or None when absent or not JSON."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


MAX_DIM = 2**48
"""The largest size one dimension may record: a tensor holds at most 2**62 elements (its
element count is an int64); a size past either bound comes from a corrupt or hostile trace
and is no shape at all (unknown, as a missing one)."""
MAX_NUMEL = 2**62


def is_shape(value: object) -> bool:
    """A list of sizes: plain ints (a JSON `true` is not a size) no larger than `MAX_DIM`,
    together at most `MAX_NUMEL` elements."""
    return (
        isinstance(value, list)
        and all(type(v) is int and v <= MAX_DIM for v in value)
        and abs(math.prod(value)) <= MAX_NUMEL
    )


def _ints(text: str) -> list[int] | None:
    value = parse_dims(text)
    if isinstance(value, int):
        return [value]
    if is_shape(value):
        return value
    return None


def _int(text: str, default: int | None = None) -> int | None:
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return default


def _bool(text: str) -> bool:
    return text.strip().lower() in ("true", "1")


def _data_positions(kind: str, op: str, i: int) -> set[int]:
    """Input positions that carry data (weights, biases and `out=` buffers excluded)."""
    if kind == GEMM:
        if op == "linear":
            return {0}
        if op in ("addmm", "_addmm_activation", "baddbmm", "addbmm", "addmv", "_grouped_mm"):
            return {0, 1, 2}  # _grouped_mm's third: the group offsets
        return {0, 1}
    if kind == NORM:
        return {0}
    if kind == CONV:
        return {0}
    if op == "embedding":
        return {1}
    return {i}


def broadcast(shapes: list[Shape]) -> Shape:
    """NumPy/PyTorch broadcasting of several shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for k, d in enumerate(s, start=rank - len(s)):
            if d != 1:
                if out[k] not in (1, d):
                    raise ValueError(f"shapes {shapes} do not broadcast")
                out[k] = d
    return out


def _matmul(a: Shape, b: Shape) -> Shape:
    if len(a) == 1 and len(b) == 1:
        return []
    if len(b) == 1:
        return a[:-1]
    if len(a) == 1:
        return [*b[:-2], b[-1]]
    batch = broadcast([a[:-2], b[:-2]])
    return [*batch, a[-2], b[-1]]


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _view(src: Shape, size: list[int]) -> Shape:
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size = [numel(src) // known if s == -1 else s for s in size]
    return size


def _reduce(x: Shape, dims: list[int] | None, keepdim: bool) -> Shape:
    if dims is None or dims == []:
        return [1] * len(x) if keepdim else []
    drop = {_dim(d, len(x)) for d in dims}
    if keepdim:
        return [1 if k in drop else s for k, s in enumerate(x)]
    return [s for k, s in enumerate(x) if k not in drop]


def _conv(x: Shape, w: Shape, concrete: list[str], op: str) -> Shape:
    spatial = len(x) - 2
    if op in ("convolution", "_convolution"):
        stride, padding, dilation = (_ints(concrete[k]) for k in (3, 4, 5))
        transposed = _bool(concrete[6])
        groups = _int(concrete[8], 1) or 1
        if transposed:
            raise ValueError("transposed convolution")
    else:
        if op.startswith("conv_transpose"):
            raise ValueError("transposed convolution")
        stride, padding, dilation = (
            _ints(concrete[k]) if len(concrete) > k else None for k in (3, 4, 5)
        )
        groups = _int(concrete[6], 1) if len(concrete) > 6 else 1
    del groups  # the output channel count is the weight's first dim whatever the groups

    def per_dim(v: list[int] | None, default: int) -> list[int]:
        if not v:
            return [default] * spatial
        return v * spatial if len(v) == 1 else v

    s, p, d = per_dim(stride, 1), per_dim(padding, 0), per_dim(dilation, 1)
    k = w[2:]
    out = [(x[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(spatial)]
    return [x[0], w[0], *out]


def _pool(x: Shape, concrete: list[str]) -> Shape:
    spatial = 2 if len(x) >= 4 else 1
    kernel = _ints(concrete[1]) or [1]
    stride = _ints(concrete[2]) if len(concrete) > 2 else None
    padding = _ints(concrete[3]) if len(concrete) > 3 else None
    dilation = _ints(concrete[4]) if len(concrete) > 4 else None
    ceil = _bool(concrete[5]) if len(concrete) > 5 else False

    def per_dim(v: list[int] | None, default: list[int]) -> list[int]:
        if not v:
            return default
        return v * spatial if len(v) == 1 else v

    k = per_dim(kernel, [1] * spatial)
    s = per_dim(stride, k)
    p = per_dim(padding, [0] * spatial)
    d = per_dim(dilation, [1] * spatial)
    rounding = math.ceil if ceil else math.floor
    out = [
        rounding((x[-spatial + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) / s[i]) + 1
        for i in range(spatial)
    ]
    return [*x[:-spatial], *out]


def _output(
    kind: str,
    op: str,
    raw: str,
    dims: list,
    tensors: list[tuple[int, Shape]],
    concrete: list[str],
) -> Shape | None:
    first = tensors[0][1] if tensors else None
    if raw.endswith("_") and first is not None and kind not in (FACTORY, FUSED):
        return first  # in place: the result is `self`
    if raw.endswith("_") and kind == COLLECTIVE:
        return _collective_in_place(dims)
    if kind == GEMM:
        return _gemm(op, dims)
    if kind in (ACTIVATION, UNARY, COPY, NORM):
        return first
    if kind == ELEMENTWISE:
        return broadcast([s for _, s in tensors])
    if kind == REDUCTION:
        if op in _LOSS:
            reduction = _int(concrete[2], 1) if len(concrete) > 2 else 1
            return first if reduction == 0 else []
        dims_arg = _ints(concrete[1]) if len(concrete) > 1 and concrete[1] else None
        keep = _bool(concrete[2]) if len(concrete) > 2 else False
        if op in ("max", "min", "argmax", "argmin") and dims_arg is None:
            return []
        return _reduce(first, dims_arg, keep) if first is not None else None
    if kind == VIEW:
        return _view_output(op, dims, first, concrete)
    if kind == ATTENTION:
        q, v = dims[0], dims[2]
        return [*q[:-1], v[-1]]
    if kind == CONV:
        if op in _ADAPTIVE_POOL:
            size = _ints(concrete[1]) or []
            return [*first[: len(first) - len(size)], *size]
        if op in _POOL:
            return _pool(first, concrete)
        return _conv(dims[0], dims[1], concrete, op)
    if kind == FACTORY:
        if op.endswith("_like"):
            return first
        if op == "arange":
            return _arange(dims, concrete)
        for text in concrete:
            size = _ints(text)
            if size is not None and text.strip().startswith("["):
                return size
        return None
    if kind == FUSED:
        # Inductor writes into one of its arguments: take the largest buffer.
        return max((s for _, s in tensors), key=numel, default=None)
    if op == "embedding":
        return [*dims[1], dims[0][-1]]
    if op in _GRAD_LIKE:
        return dims[_GRAD_LIKE[op]]
    if op in GRADIENT_OUTPUTS:
        return next(iter(gradient_outputs(op, dims, concrete)), None)
    if op in _ELEMENTS_SHAPED:
        return dims[0] if is_shape(dims[0]) else None
    if op in VALUES_AND_INDICES and first is not None:
        return _values_and_indices(op, first, concrete)
    if op.startswith(("upsample_", "_upsample_")) and first is not None:
        return _upsampled(first, concrete)
    if op == "histc":  # histc(x, bins=100, min, max): a count per bin
        return [_int(concrete[1], 100) if len(concrete) > 1 else 100]
    return None


def more_outputs(name: str, input_dims: str | None, concrete: list[str] | None) -> list[Shape]:
    """The outputs of one op call beyond its `output_shape` (`gradient_outputs`' second and
    third), none for an op of one output or of pieces of one shape (a split)."""
    dims = parse_dims(input_dims)
    if not isinstance(dims, list):
        return []
    concrete = list(concrete or [])
    concrete += [""] * (len(dims) - len(concrete))
    try:
        return gradient_outputs(base_name(name), dims, concrete)[1:]
    except (ValueError, IndexError, KeyError, TypeError):
        return []


def gradient_outputs(op: str, dims: list, concrete: list[str]) -> list[Shape]:
    """The gradients a `GRADIENT_OUTPUTS` op returns, in order, as their `output_mask`
    asks: of the input (its shape), of the weight and of the bias (a convolution's bias
    has one value per output channel, a batch or group norm's weight and bias one per
    channel, a layer norm's the weight's shape). `output_shape` is the first; matching
    offers the others too (`matching._candidates`): AccumulateGrad's `detach` and the
    optimizer read them."""
    at = GRADIENT_OUTPUTS.get(op)
    if at is None or len(dims) <= at:
        return []
    mask = [word.strip() == "True" for word in concrete[at].strip("[]").split(",")]
    if len(mask) != 3:
        mask = [True, True, True]
    x = dims[1] if is_shape(dims[1]) else None
    if op == "convolution_backward":
        w = dims[2]
        bias = _ints(concrete[3]) if len(concrete) > 3 and concrete[3] else None
        made = [x, w, bias if bias else ([w[0]] if is_shape(w) and w else None)]
    elif op == "native_layer_norm_backward":
        made = [x, dims[5] or None, dims[6] or None]
    else:
        channels = [x[1]] if x is not None and len(x) > 1 else None
        made = [x, channels, channels]
    return [s for s, wanted in zip(made, mask, strict=True) if wanted and is_shape(s)]


def _collective_in_place(dims: list) -> Shape | None:
    """`c10d::allreduce_([bucket], ...)`, `broadcast_([flat], ...)`: the collective writes
    the tensors of its list in place, so who reads the tensor after it reads the collective
    (DDP's bucket views after the allreduce, the copy back of broadcast parameters). Known
    only for a one-tensor list; several tensors have no one result shape."""
    tensors = dims[0] if dims and isinstance(dims[0], list) else []
    return tensors[0] if len(tensors) == 1 and is_shape(tensors[0]) else None


def _upsampled(x: Shape, concrete: list[str]) -> Shape | None:
    """`upsample_nearest2d(x, output_size, ...)` or its `.vec(x, None, scale_factors)`
    (`F.interpolate`, a UNet's `Upsample2D`): the spatial sizes given, or each spatial
    size times its scale factor, rounded down; the first list argument says which."""
    for text in concrete[1:]:
        if not text.strip().startswith("["):
            continue
        if "." in text:  # scale factors
            factors = [float(f) for f in text.strip("[] ").split(",")]
            spatial = [math.floor(d * f) for d, f in zip(x[-len(factors) :], factors, strict=True)]
        else:
            spatial = _ints(text) or []
        if not spatial or len(spatial) >= len(x):
            return None
        return [*x[: len(x) - len(spatial)], *spatial]
    return None


def _values_and_indices(op: str, x: Shape, concrete: list[str]) -> Shape:
    """`topk(x, k, dim=-1)`: x with k along dim; `sort(x, ...)`: x."""
    if op == "sort" or not x:
        return list(x)
    d = _dim(_int(concrete[2], -1) if len(concrete) > 2 and concrete[2] else -1, len(x))
    out = list(x)
    out[d] = _int(concrete[1])
    return out


ARANGE_NUMBERS = {5: 1, 6: 2, 7: 3, 2: 1, 4: 3}
"""How many of `arange`'s leading arguments are its numbers, by argument count: `(end,
dtype, layout, device, pin_memory)`, `(start, end, ...)`, `(start, end, step, ...)`, and
the `out=` forms `(end, out)`, `(start, end, step, out)`. The count decides it: the
profiler records a `dtype` as a Scalar too."""


def _arange(dims: list, concrete: list[str]) -> Shape | None:
    """`[ceil((end - start) / step)]` from the recorded numbers (position ids,
    `torch.arange(seq_len)`; sinusoidal timestep embeddings' frequencies)."""
    n = ARANGE_NUMBERS.get(len(dims))
    if n is None:
        return None
    numbers = [float(text) for text in concrete[:n]]  # ValueError: not recorded
    start, end, step = ([0.0] if n == 1 else []) + numbers + ([1.0] if n < 3 else [])
    return [max(0, math.ceil((end - start) / step))]


def _gemm(op: str, dims: list) -> Shape | None:
    if op == "linear":
        x, w = dims[0], dims[1]
        return [*x[:-1], w[0]] if len(w) == 2 else x[:-1]
    if op in ("addmm", "_addmm_activation", "baddbmm"):
        a, b = dims[1], dims[2]
        return [*a[:-1], b[-1]]
    if op == "addbmm":
        a, b = dims[1], dims[2]
        return [a[-2], b[-1]]
    if op in ("mm", "bmm", "_scaled_mm", "_int_mm"):
        a, b = dims[0], dims[1]
        return [*a[:-1], b[-1]]
    if op == "matmul":
        return _matmul(dims[0], dims[1])
    if op in ("mv", "addmv"):
        a = dims[0] if op == "mv" else dims[1]
        return a[:-1]
    if op == "dot":
        return []
    if op == "_grouped_mm":  # per-group GEMMs: [M, K] x [G, K, N] -> [M, N], batched 3-d x 3-d
        a, b = dims[0], dims[1]
        if len(b) == 3 and len(a) in (2, 3):
            return [*a[:-1], b[-1]]
        return None
    return None


def _view_output(op: str, dims: list, x: Shape | None, concrete: list[str]) -> Shape | None:
    if op in ("cat", "stack"):
        parts = dims[0]
        if not parts or not all(is_shape(p) for p in parts):
            return None
        parts = [p for p in parts if p != [0]]
        dim = _int(concrete[1], 0) if len(concrete) > 1 else 0
        if op == "stack":
            rank = len(parts[0]) + 1
            d = _dim(dim, rank)
            return [*parts[0][:d], len(parts), *parts[0][d:]]
        d = _dim(dim, len(parts[0]))
        return [*parts[0][:d], sum(p[d] for p in parts), *parts[0][d + 1 :]]
    if x is None:
        return None
    rank = len(x)
    if op in ("view", "reshape", "_unsafe_view", "_reshape_alias", "as_strided"):
        size = _ints(concrete[1])
        return _view(x, size) if size is not None else None
    if op == "expand":
        size = _ints(concrete[1])
        if size is None:
            return None
        lead = len(size) - rank
        return [x[k - lead] if s == -1 else s for k, s in enumerate(size)]
    if op in ("expand_as", "view_as", "reshape_as"):
        return dims[1] if len(dims) > 1 and is_shape(dims[1]) else None
    if op in ("t", "numpy_T"):
        return x[::-1]
    if op == "transpose":
        a, b = _dim(_int(concrete[1]), rank), _dim(_int(concrete[2]), rank)
        out = list(x)
        out[a], out[b] = out[b], out[a]
        return out
    if op == "permute":
        order = _ints(concrete[1])
        return [x[_dim(k, rank)] for k in order] if order else None
    if op == "unsqueeze":
        d = _dim(_int(concrete[1]), rank + 1)
        return [*x[:d], 1, *x[d:]]
    if op == "squeeze":
        which = _ints(concrete[1]) if len(concrete) > 1 and concrete[1] else None
        if which is None:
            return [s for s in x if s != 1]
        drop = {_dim(d, rank) for d in which}
        return [s for k, s in enumerate(x) if not (k in drop and s == 1)]
    if op == "flatten":
        # an int left out of `Concrete Inputs` (PyTorch before 2.2 records none) is
        # unknown, not its default: `flatten(x, 1)` is no `flatten(x)`
        start = _dim(_int(concrete[1]), rank) if rank else 0
        end = _dim(_int(concrete[2]), rank) if rank else 0
        return [*x[:start], math.prod(x[start : end + 1]), *x[end + 1 :]]
    if op == "slice":
        d = _dim(_int(concrete[1]), rank)  # unrecorded: unknown, as for `flatten`
        start = _int(concrete[2], 0) or 0
        end = _int(concrete[3], x[d])
        step = _int(concrete[4], 1) or 1
        size = x[d]
        start = max(0, start + size if start < 0 else start)
        end = size if end is None else min(size, end + size if end < 0 else end)
        out = list(x)
        out[d] = max(0, -(-(end - start) // step))
        return out
    if op == "select":
        d = _dim(_int(concrete[1]), rank)
        return [*x[:d], *x[d + 1 :]]
    if op == "narrow":
        d = _dim(_int(concrete[1]), rank)
        out = list(x)
        out[d] = _int(concrete[3])
        return out
    if op == "index_select":
        d = _dim(_int(concrete[1]), rank)
        index = dims[2]
        out = list(x)
        out[d] = numel(index)
        return out
    if op == "gather" and len(dims) > 2 and dims[2]:
        return list(dims[2])  # gather(x, dim, index) has the shape of index
    if op in MULTI_OUTPUT:
        return _piece(op, x, concrete)
    return None


def _piece(op: str, x: Shape, concrete: list[str]) -> Shape | None:
    """The shape every output of a split shares, or None when the pieces differ."""
    rank = len(x)
    if op == "unbind":
        d = _dim(_int(concrete[1], 0) if len(concrete) > 1 else 0, rank)
        return [*x[:d], *x[d + 1 :]]
    d = _dim(_int(concrete[2], 0) if len(concrete) > 2 else 0, rank)
    if op in ("chunk", "unsafe_chunk"):
        n = _int(concrete[1])
        size = -(-x[d] // n) if n else 0
    elif op in ("split", "unsafe_split"):
        size = _int(concrete[1])
    else:  # split_with_sizes
        sizes = _ints(concrete[1]) or []
        if len(set(sizes)) != 1:
            return None
        size = sizes[0]
    if not size or x[d] % size:
        return None
    out = list(x)
    out[d] = size
    return out
