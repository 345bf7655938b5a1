"""FLOPs per output element of elementwise, normalization and softmax math: the table
behind every non-GEMM FLOP count.

Counting every elementwise op as 1 FLOP per element (TraceLens's simplification) makes a
GELU look as cheap as an add. Each entry here counts the arithmetic of the formula as
ATen's CUDA functor writes it (`ATen/native/cuda/ActivationGeluKernel.cu`, `...Silu...`,
`UnaryOpsKernel.cu`): one FLOP per add, multiply, divide, compare or select, and
`TRANSCENDENTAL` FLOPs per call of exp, log, erf, tanh, sin or cos. `sqrt` and `rsqrt`
are single hardware instructions and count 1.
"""

from __future__ import annotations

from traceq.relations.vocabulary import COMPARISONS, REDUCTIONS

TRANSCENDENTAL = 4
"""FLOPs charged per exp/log/erf/tanh/sin/cos: CUDA's `__expf` is 2 instructions and
libdevice's accurate `expf`/`tanhf`/`erff` 8-20; 4 is near the low end, so a kernel's FLOP
rate is never overstated by much. A stated constant, not a measurement."""

T = TRANSCENDENTAL

#: Forward elementwise ops (base name, in-place `_` dropped) -> FLOPs per output element.
ELEMENTWISE_FLOPS: dict[str, float] = {
    # arithmetic and comparisons: one operation
    **dict.fromkeys(
        (
            "add",
            "sub",
            "rsub",
            "mul",
            "div",
            "true_divide",
            "floor_divide",
            "neg",
            "abs",
            "maximum",
            "minimum",
            "fmax",
            "fmin",
            "max",
            "min",
            *sorted(COMPARISONS),
            "where",
            "clamp",
            "clamp_min",
            "clamp_max",
            "relu",
            "threshold",
            "sign",
            "floor",
            "ceil",
            "round",
            "trunc",
            "fmod",
            "remainder",
            "reciprocal",
            "sqrt",
            "rsqrt",
            "square",
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "bitwise_not",
            "masked_fill",
            "fill",
            "zero",
            "hardtanh",
            "relu6",
            "leaky_relu",
            "tril",
            "triu",
            "nan_to_num",
            "masked_scatter",
            "bernoulli",
            "uniform",
            "normal",
            "prelu",
        ),
        1,
    ),
    "addcmul": 2,  # a + v * b * c counts mul, mul, add (v folded when 1): 2 is the common case
    "addcdiv": 2,
    "lerp": 3,  # a + w * (b - a)
    "pow": T,  # exp(b * log(a)) at the general exponent; x ** 2 is a `mul` in practice
    "exp": T,
    "exp2": T,
    "expm1": T,
    "log": T,
    "log2": T,
    "log1p": T,
    "sin": T,
    "cos": T,
    "tan": T,
    "tanh": T,
    "erf": T,
    "erfc": T,
    "atan2": T,
    "hypot": 3,  # sqrt(a*a + b*b)
    "sigmoid": 3 + T,  # 1 / (1 + exp(-x))
    "silu": 3 + T,  # x / (1 + exp(-x))
    "gelu": 4 + T,  # 0.5 * x * (1 + erf(x / sqrt(2)))
    "gelu_tanh": 8 + T,  # 0.5 * x * (1 + tanh(c0 * (x + c1 * x^3)))
    "mish": 4 + 3 * T,  # x * tanh(log1p(exp(x)))
    "softplus": 2 + 2 * T,  # log1p(exp(beta * x)) / beta, with a threshold compare
    "elu": 3 + T,
    "selu": 4 + T,
    "celu": 4 + T,
    "hardswish": 5,  # x * min(max(x + 3, 0), 6) / 6
    "hardsigmoid": 4,
    "dropout": 3,  # draw, compare, scale
    "native_dropout": 3,
    "feature_dropout": 3,
    # backward
    "threshold_backward": 2,  # compare, select
    "gelu_backward": 10 + 2 * T,  # the erf form's derivative: cdf and pdf terms
    "silu_backward": 6 + T,  # grad * s * (1 + x * (1 - s)), s = sigmoid(x)
    "sigmoid_backward": 3,  # grad * (1 - y) * y
    "tanh_backward": 3,  # grad * (1 - y * y)
    "hardswish_backward": 5,
    "leaky_relu_backward": 2,
    "native_dropout_backward": 2,
    "hardtanh_backward": 3,
}

#: Softmax and its relatives, per element of the input: max, subtract, exp, sum, divide.
SOFTMAX_FLOPS: dict[str, float] = {
    "softmax": 4 + T,
    "_softmax": 4 + T,
    "log_softmax": 4 + 2 * T,  # x - max - log(sum(exp(x - max)))
    "_log_softmax": 4 + 2 * T,
    "_softmax_backward_data": 4,  # y * (g - sum(g * y))
    "_log_softmax_backward_data": 3 + T,  # g - exp(y) * sum(g)
    "_safe_softmax": 4 + T,
}

#: Normalization, per element of the input (affine weight and bias included where given;
#: `NORM_AFFINE` is subtracted when the op has neither).
NORM_FLOPS: dict[str, float] = {
    "layer_norm": 8,  # mean (1), variance (3), normalize (2), affine (2)
    "native_layer_norm": 8,
    "group_norm": 8,
    "native_group_norm": 8,
    "instance_norm": 8,
    "rms_norm": 4,  # square-and-sum (2), scale by rsqrt (1), weight (1)
    "_fused_rms_norm": 4,
    "batch_norm": 4,  # inference: (x - mean) * invstd * w + b
    "native_batch_norm": 7,  # training adds the statistics (3)
    "_native_batch_norm_legit": 7,
    "_native_batch_norm_legit_no_training": 4,
    "cudnn_batch_norm": 7,
    "miopen_batch_norm": 7,
    "_batch_norm_impl_index": 4,
    "normalize": 4,  # x / max(||x||, eps): square-and-sum (2), divide (1), compare (1)
    "native_layer_norm_backward": 12,
    "native_group_norm_backward": 12,
    "native_batch_norm_backward": 10,
    "cudnn_batch_norm_backward": 10,
    "_fused_rms_norm_backward": 8,
}
NORM_AFFINE = 2

#: Reductions, per element of the input.
REDUCTION_FLOPS: dict[str, float] = {
    **dict.fromkeys(sorted(REDUCTIONS), 1),
    "cumsum": 1,
    "cumprod": 1,
    "norm": 2,
    "linalg_vector_norm": 2,
    "var": 3,
    "std": 3,
    "var_mean": 3,
    "std_mean": 3,
    "logsumexp": 3 + T,
    "nll_loss": 1,
    "nll_loss_forward": 1,
    "nll_loss_backward": 1,
    "mse_loss": 3,
    "l1_loss": 3,
    "smooth_l1_loss": 4,
    "cross_entropy_loss": 5 + 2 * T,  # log_softmax, then a gather and a sum
}


def fused_flops(tokens: list[str]) -> float:
    """FLOPs per element of an Inductor kernel from the ops its name lists (unknown tokens
    such as `view`, `clone`, `convert_element_type` are data movement: 0)."""
    total = 0.0
    for token in tokens:
        for table in (ELEMENTWISE_FLOPS, SOFTMAX_FLOPS, NORM_FLOPS, REDUCTION_FLOPS):
            if token in table:
                total += table[token]
                break
    return total
