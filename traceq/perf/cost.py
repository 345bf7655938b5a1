"""What each op had to compute and move: FLOPs and bytes read and written, from the shapes
(`Input Dims`), dtypes (`Input type`) and scalar arguments (`Concrete Inputs`) the profiler
recorded.

"Is this GEMM already good?" needs the work an op did, not only its time. Bytes are counted
per tensor from its own recorded dtype, never a default: an op whose dtypes are missing is
not modelled, and says so (`why_not`). Each tensor is counted once (read once, written
once), as an ideal kernel would move it: the floor the memory roof is measured against.
`matmul_flops` are the FLOPs of the matrix products alone (what
`torch.utils.flop_counter.FlopCounterMode` counts); `flops` adds the vector work beside
them (a GEMM's bias add, a convolution's bias).

Stated modelling choices (the tests list where they differ from TraceLens and
FlopCounterMode):
- GEMM: `2·M·N·K` plus `M·N` for a bias (TraceLens's count; FlopCounterMode omits the bias).
- Attention: the two products `2·B·H_q·(kept scores)·(d_qk + d_v)`, where kept scores are
  all `N_q·N_kv` without a mask, those at or left of the diagonal (PyTorch's top-left
  `is_causal`) when causal, and those in the window when a sliding window is recorded.
  Softmax is not counted (neither TraceLens nor FlopCounterMode count it). Flash, efficient
  and cuDNN kernels also write the fp32 log-sum-exp (`B·H_q·N_q·4` bytes).
- Elementwise, norm, softmax and reductions: FLOPs per element from `flop_table`.
- Broadcast inputs are read once at their own size; in-place ops write `self`.
- Inductor kernels: all tensor arguments are read except the last, which is written (the
  kernel's `out_ptr`); FLOPs per element of the largest argument from the ops its name
  lists. Template GEMMs (`triton_tem_`) are not modelled: their arguments do not say M, N, K.
- Custom ops (another library's namespace: `aiter::`, `vllm::`, `sglang::`, `_C::`) are
  GEMMs by their signature when the name says GEMM (`CUSTOM_GEMM`) and the first two tensor
  inputs are 2-D `[M, K]` and `[N, K]` or `[K, N]`; a 1-D input of N elements is the bias.
  `basis` says so. (A custom op wrapping `aten::linear` is costed by that child:
  `dataflow.semantic_root`.) Fused MoE ops (`CUSTOM_MOE`) are costed only when the routing
  (`[T, topk]` ids) and the expert weights (`[E, 2N, K]`, `[E, K, N]`) are inputs: each of
  the T·topk routed rows runs both expert GEMMs; weights of min(E, T·topk) experts are read.
- Serving engines' own kernels (`CUSTOM_NORM`, `CUSTOM_GLU`, `CUSTOM_ROTARY`,
  `CUSTOM_KV_WRITE`), by their signature: an RMS/layer norm reads and writes each distinct
  activation shape once (twice with a fused residual add: x and residual in, out and the
  new residual out) plus its weight; `silu_and_mul` reads `[T, 2N]` and writes `[T, N]`;
  rotary embedding reads and writes q and k in place plus T rows of the cos/sin cache;
  a KV-cache write reads the step's k and v and writes them into the cache (the cache's
  own size is not moved). Paged attention is not modelled: the KV lengths are values the
  trace does not record.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl

from traceq.perf import flop_table
from traceq.perf.traffic import ITEMSIZE
from traceq.relations.dataflow.shapes import is_shape, parse_dims
from traceq.relations.opnames import base_name
from traceq.relations.vocabulary import (
    ALIASES,
    BINARY_COMPARISONS,
    COMPARISONS,
    CONVOLUTIONS,
    GEMMS,
    NOT_TENSOR,
    STRIDED_VIEWS,
    VIEWS,
)

FAMILIES = (
    "gemm",
    "attention",
    "conv",
    "norm",
    "softmax",
    "reduction",
    "embedding",
    "copy",
    "elementwise",
    "view",
    "fused",
    "other",
)

#: Profiler dtype strings -> the dtype names device specs give peaks for.
COMPUTE_DTYPE = {
    "double": "fp64",
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "signed char": "int8",
    "unsigned char": "int8",
}

#: `c10::ScalarType` codes as the profiler records a `dtype=` argument (`Concrete Inputs`).
SCALAR_TYPE = {
    "0": "unsigned char",
    "1": "signed char",
    "2": "short int",
    "3": "int",
    "4": "long int",
    "5": "c10::Half",
    "6": "float",
    "7": "double",
    "11": "bool",
    "15": "c10::BFloat16",
    "23": "c10::Float8_e5m2",
    "24": "c10::Float8_e4m3fn",
    "25": "c10::Float8_e5m2fnuz",
    "26": "c10::Float8_e4m3fnuz",
}

FLOAT_RANK = {"c10::BFloat16": 1, "c10::Half": 1, "float": 2, "double": 3}
INT_RANK = {"bool": 0, "unsigned char": 1, "signed char": 1, "short int": 2, "int": 3}
INT_RANK["long int"] = 4

GEMM_OPS = GEMMS | {"_scaled_grouped_mm"}
CONV_OPS = CONVOLUTIONS | {"_slow_conv2d_forward"}
VIEW_OPS = (
    VIEWS
    | STRIDED_VIEWS
    | ALIASES
    | {
        "lift_fresh",
        "_local_scalar_dense",
        "item",
        "empty",
        "empty_strided",
        "empty_like",
        "new_empty",
        "new_empty_strided",
        "resize",
        "set",
        "is_nonzero",
        "result_type",
        "broadcast_tensors",
        "contiguous_noop",
        "resolve_conj",
        "resolve_neg",
        "_conj",
    }
)
COPY_OPS = {
    "copy",
    "to",
    "_to_copy",
    "clone",
    "contiguous",
    "type_as",
    "cat",
    "stack",
    "zeros",
    "ones",
    "full",
    "zeros_like",
    "ones_like",
    "full_like",
    "new_zeros",
    "new_ones",
    "new_full",
    "fill",
    "zero",
    "arange",
    "_to_dtype",
}
GATHER_OPS = {"embedding", "index_select", "gather", "index", "take_along_dim"}
SCATTER_OPS = {
    "scatter",
    "scatter_add",
    "index_add",
    "index_put",
    "index_copy",
    "scatter_reduce",
    "index_fill",
    "embedding_dense_backward",
    "_index_put_impl",
}
COMPARE_OPS = COMPARISONS
LSE_ATTENTION = {
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
}
#: Attention ops -> the `is_causal` argument's position (forward, then backward).
CAUSAL_ARG = {
    "scaled_dot_product_attention": 5,
    "_scaled_dot_product_flash_attention": 4,
    "_scaled_dot_product_flash_attention_for_cpu": 4,
    "_scaled_dot_product_efficient_attention": 6,
    "_scaled_dot_product_cudnn_attention": 6,
    "_flash_attention_forward": 8,
    "_efficient_attention_forward": 10,
    "_scaled_dot_product_flash_attention_backward": 11,
    "_scaled_dot_product_flash_attention_for_cpu_backward": 5,
    "_scaled_dot_product_efficient_attention_backward": 11,
    "_scaled_dot_product_cudnn_attention_backward": 14,
}
ATTENTION_BACKWARD = {k for k in CAUSAL_ARG if k.endswith("_backward")}
FUSED_KERNEL = re.compile(r"^(triton_\w+|graph_\d+_cpp_fused\w*|cpp_fused\w*|kernel_cpp_\w+)$")
FUSED_OPS = re.compile(r"fused_(.*?)(?:_\d+)?$")


@dataclass(frozen=True)
class Cost:
    """The work of one op call. `modelled` False: the numbers are 0 and `why_not` says why."""

    family: str
    flops: float = 0.0
    matmul_flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    dtype: str | None = None
    """The dtype the compute roof is read for (`fp32`, `bf16`, ...)."""
    modelled: bool = True
    why_not: str | None = None
    basis: str | None = None
    """How the work was read when not from an aten op's own layout (a custom op's signature)."""


class NotModelled(Exception):
    """Raised inside a formula when the recorded arguments do not say enough."""


def unmodelled(family: str, why: str) -> Cost:
    return Cost(family=family, modelled=False, why_not=why)


# -- the frame ----------------------------------------------------------------------------

COST_SCHEMA = {
    "family": pl.String,
    "flops": pl.Float64,
    "matmul_flops": pl.Float64,
    "bytes_read": pl.Float64,
    "bytes_written": pl.Float64,
    "compute_dtype": pl.String,
    "modelled": pl.Boolean,
    "why_not": pl.String,
    "cost_basis": pl.String,
}
_SIG = ["name", "input_dims", "_types", "_concrete"]


def op_costs(ops: pl.DataFrame) -> pl.DataFrame:
    """`ops` (any frame with `name`, `input_dims`, `input_types`, `concrete_inputs`) with the
    cost columns added: family, flops, matmul_flops, bytes_read, bytes_written, bytes,
    compute_dtype, modelled, why_not. Computed once per distinct signature and joined back.

    Give it top-level ops (`traceq.relations.dataflow.dataflow_ops`) to total a trace:
    the ops nested in them (the `addmm` in a `linear`) would count their work twice."""
    keyed = ops.with_columns(
        pl.col("input_types").list.join("\x1f").fill_null("").alias("_types"),
        pl.col("concrete_inputs").list.join("\x1f").fill_null("").alias("_concrete"),
    )
    unique = keyed.select(*_SIG, "input_types", "concrete_inputs").unique(_SIG, maintain_order=True)
    rows = [
        op_cost(name, dims, types, concrete)
        for name, dims, types, concrete in unique.select(
            "name", "input_dims", "input_types", "concrete_inputs"
        ).iter_rows()
    ]
    costs = pl.DataFrame(
        {
            "family": [c.family for c in rows],
            "flops": [float(c.flops) for c in rows],
            "matmul_flops": [float(c.matmul_flops) for c in rows],
            "bytes_read": [float(c.bytes_read) for c in rows],
            "bytes_written": [float(c.bytes_written) for c in rows],
            "compute_dtype": [c.dtype for c in rows],
            "modelled": [c.modelled for c in rows],
            "why_not": [c.why_not for c in rows],
            "cost_basis": [c.basis for c in rows],
        },
        schema=COST_SCHEMA,
    )
    table = pl.concat([unique.select(_SIG), costs], how="horizontal")
    return (
        keyed.join(table, on=_SIG, how="left", nulls_equal=True)
        .with_columns((pl.col("bytes_read") + pl.col("bytes_written")).alias("bytes"))
        .drop("_types", "_concrete")
    )


def unmodelled_counts(costs: pl.DataFrame) -> pl.DataFrame:
    """Ops the model could not cost, by name and reason: reported, never silently 0."""
    return (
        costs.filter(~pl.col("modelled"))
        .group_by("name", "why_not")
        .agg(pl.len().alias("count"))
        .sort("count", descending=True)
    )


# -- one op -------------------------------------------------------------------------------


def op_cost(
    name: str, input_dims: str | list | None, types: list[str] | None, concrete: list[str] | None
) -> Cost:
    """FLOPs and bytes of one op call from its recorded signature."""
    dims = parse_dims(input_dims) if not isinstance(input_dims, list) else input_dims
    family = family_of(name)
    if not isinstance(dims, list):
        return unmodelled(family, "no input shapes recorded (record_shapes=False)")
    types = list(types or [])
    concrete = list(concrete or [])
    types += [""] * (len(dims) - len(types))
    concrete += [""] * (len(dims) - len(concrete))
    op = _plain(base_name(name))
    args = _Args(dims, types, concrete)
    if family == "other" and CUSTOM_NS.match(name):
        custom = _CUSTOM.get(_custom_kind(op))
        if custom is not None:
            try:
                return custom(op, args, name)
            except NotModelled as exc:
                return unmodelled(family, str(exc))
            except (ValueError, IndexError, KeyError, TypeError) as exc:
                return unmodelled(family, f"arguments not understood ({type(exc).__name__}: {exc})")
    try:
        return _FORMULAS[family](op, args, name)
    except NotModelled as exc:
        return unmodelled(family, str(exc))
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as exc:
        return unmodelled(family, f"arguments not understood ({type(exc).__name__}: {exc})")


def family_of(name: str) -> str:
    """The op family a cost formula exists for (see `FAMILIES`)."""
    if FUSED_KERNEL.match(name):
        return "fused"
    op = _plain(base_name(name))
    if op in GEMM_OPS:
        return "gemm"
    if op in CAUSAL_ARG:
        return "attention"
    if op in CONV_OPS or op == "convolution_backward":
        return "conv"
    if op in flop_table.NORM_FLOPS:
        return "norm"
    if op in flop_table.SOFTMAX_FLOPS:
        return "softmax"
    if op in flop_table.REDUCTION_FLOPS:
        return "reduction"
    if op in GATHER_OPS or op in SCATTER_OPS:
        return "embedding"
    if op in VIEW_OPS:
        return "view"
    if op in COPY_OPS:
        return "copy"
    if op in flop_table.ELEMENTWISE_FLOPS:
        return "elementwise"
    return "other"


def _plain(op: str) -> str:
    return op[:-1] if op.endswith("_") and not op.endswith("__") else op


class _Args:
    """The recorded arguments of one call, with typed accessors that raise `NotModelled`."""

    def __init__(self, dims: list, types: list[str], concrete: list[str]) -> None:
        self.dims, self.types, self.concrete = dims, types, concrete

    def is_tensor(self, i: int) -> bool:
        return i < len(self.dims) and self.types[i] not in NOT_TENSOR and is_shape(self.dims[i])

    def shape(self, i: int) -> list[int]:
        if not self.is_tensor(i):
            raise NotModelled(f"argument {i} is not a recorded tensor")
        return self.dims[i]

    def dtype(self, i: int) -> str:
        self.shape(i)
        dtype = self.types[i]
        if dtype not in ITEMSIZE:
            raise NotModelled(f"dtype {dtype!r} of argument {i} has no known size")
        return dtype

    def bytes(self, i: int) -> float:
        return math.prod(self.shape(i)) * ITEMSIZE[self.dtype(i)]

    def tensors(self) -> list[int]:
        return [i for i in range(len(self.dims)) if self.is_tensor(i)]

    def scalar(self, i: int) -> str:
        return self.concrete[i].strip() if i < len(self.concrete) else ""

    def flag(self, i: int, default: bool = False) -> bool:
        value = self.scalar(i)
        return default if value in ("", "None") else value in ("True", "true", "1")

    def ints(self, i: int) -> list[int] | None:
        value = self.scalar(i)
        if not value.startswith("["):
            return None
        return [int(v) for v in value.strip("[]").split(",") if v.strip()]

    def int(self, i: int, default: int | None = None) -> int | None:
        value = self.scalar(i)
        if value in ("", "None"):
            return default
        return int(float(value))

    def tensor_list(self, i: int) -> list[list[int]]:
        if i >= len(self.dims) or self.types[i] != "TensorList":
            raise NotModelled(f"argument {i} is not a tensor list")
        return [s for s in self.dims[i] if isinstance(s, list)]


def _numel(shape: list[int]) -> int:
    return math.prod(shape)


def _compute(dtype: str) -> str | None:
    return COMPUTE_DTYPE.get(dtype)


def promote(dtypes_and_shapes: list[tuple[str, list[int]]]) -> str:
    """The result dtype of an elementwise op (PyTorch's type promotion, with 0-d tensors
    taking part only when they raise the category, as a `Scalar` would)."""
    dims = [(t, s) for t, s in dtypes_and_shapes if s]
    zero_d = [(t, s) for t, s in dtypes_and_shapes if not s]
    pool = dims or zero_d

    def category(t: str) -> int:
        return 2 if t in FLOAT_RANK else (1 if t in INT_RANK and t != "bool" else 0)

    best = max(category(t) for t, _ in pool)
    if zero_d and dims:
        higher = [t for t, _ in zero_d if category(t) > best]
        if higher:
            pool, best = [(t, []) for t in higher], max(category(t) for t in higher)
    candidates = {t for t, _ in pool if category(t) == best}
    if best == 2:
        if candidates == {"c10::BFloat16", "c10::Half"}:
            return "float"
        return max(candidates, key=lambda t: FLOAT_RANK[t])
    return max(candidates, key=lambda t: INT_RANK.get(t, 0))


def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for k, d in enumerate(s):
            pos = rank - len(s) + k
            if d != 1:
                out[pos] = d
    return out


# -- GEMM ---------------------------------------------------------------------------------


def _gemm(op: str, a: _Args, name: str) -> Cost:
    """(M, N, K, batch) from the operands as each GEMM op lays them out."""
    bias_index = None
    out_dtype = None
    if op == "linear":
        x, w = a.shape(0), a.shape(1)
        m, k = _numel(x[:-1]), x[-1]
        n = w[0] if len(w) == 2 else 1
        batch, ia, ib = 1, 0, 1
        bias_index = 2 if a.is_tensor(2) else None
    elif op in ("addmm", "_addmm_activation"):
        ia, ib = 1, 2
        (m, k), (_, n), batch = a.shape(1), a.shape(2), 1
        bias_index = 0
    elif op in ("mm", "_scaled_mm", "_int_mm"):
        ia, ib = 0, 1
        (m, k), (_, n), batch = a.shape(0), a.shape(1), 1
        if op == "_scaled_mm":
            bias_index = 4 if a.is_tensor(4) else None
            code = a.scalar(6)
            out_dtype = SCALAR_TYPE.get(code) if code not in ("", "None") else None
        if op == "_int_mm":
            out_dtype = "int"
    elif op in ("bmm", "baddbmm", "addbmm"):
        ia, ib = (0, 1) if op == "bmm" else (1, 2)
        (batch, m, k), (_, _, n) = a.shape(ia), a.shape(ib)
        bias_index = 0 if op != "bmm" else None
    elif op == "matmul":
        ia, ib = 0, 1
        x, y = a.shape(0), a.shape(1)
        if len(x) == 1 and len(y) == 1:
            m, k, n, batch = 1, x[0], 1, 1
        elif len(y) == 1:
            m, k, n, batch = _numel(x[:-1]), x[-1], 1, 1
        elif len(x) == 1:
            m, k, n, batch = 1, x[0], y[-1], _numel(y[:-2])
        elif len(y) == 2:
            m, k, n, batch = _numel(x[:-1]), x[-1], y[-1], 1
        else:
            m, k, n = x[-2], x[-1], y[-1]
            batch = _numel(_broadcast([x[:-2], y[:-2]]))
    elif op in ("mv", "addmv"):
        ia, ib = (0, 1) if op == "mv" else (1, 2)
        (m, k), n, batch = a.shape(ia), 1, 1
        bias_index = 0 if op == "addmv" else None
    elif op == "dot":
        ia, ib = 0, 1
        m, k, n, batch = 1, a.shape(0)[0], 1, 1
    elif op in ("_grouped_mm", "_scaled_grouped_mm"):
        return _grouped_gemm(op, a)
    else:
        raise NotModelled(f"no GEMM layout for {op}")
    mnk = 2.0 * batch * m * n * k
    out_elems = batch * m * n
    bias_flops = out_elems if bias_index is not None and a.is_tensor(bias_index) else 0
    act_flops = 0.0
    if op == "_addmm_activation":
        act_flops = out_elems * flop_table.ELEMENTWISE_FLOPS["gelu" if a.flag(4) else "relu"]
    dtype_a = a.dtype(ia)
    read = a.bytes(ia) + a.bytes(ib)
    if bias_index is not None and a.is_tensor(bias_index):
        read += a.bytes(bias_index)
    if op == "_scaled_mm":
        read += a.bytes(2) + a.bytes(3)
    written = out_elems * ITEMSIZE[out_dtype or dtype_a]
    return Cost(
        "gemm",
        flops=mnk + bias_flops + act_flops,
        matmul_flops=mnk,
        bytes_read=read,
        bytes_written=written,
        dtype=_compute(dtype_a),
    )


def _grouped_gemm(op: str, a: _Args) -> Cost:
    """MoE GEMMs: `[M, K] x [G, K, N]` with group offsets (each row goes to one group), or
    batched `[G, M, K] x [G, K, N]`."""
    x, w = a.shape(0), a.shape(1)
    if len(w) != 3:
        raise NotModelled("grouped GEMM weight is not [G, K, N]")
    if len(x) == 2:
        m, k, n, batch = x[0], x[1], w[2], 1
    elif len(x) == 3:
        batch, m, k, n = x[0], x[1], x[2], w[2]
    else:
        raise NotModelled("grouped GEMM input is not 2-d or 3-d")
    mnk = 2.0 * batch * m * n * k
    dtype = a.dtype(0)
    read = sum(a.bytes(i) for i in a.tensors())
    return Cost("gemm", mnk, mnk, read, batch * m * n * ITEMSIZE[dtype], _compute(dtype))


# -- custom GEMMs and MoE ----------------------------------------------------------------

CUSTOM_NS = re.compile(r"^(?!aten::|prims::)[A-Za-z_]\w*::")
"""Another library's dispatcher op (`aiter::`, `vllm::`, `sglang::`, `_C::`)."""
CUSTOM_MOE = re.compile(r"(?i)(moe_forward|fused_moe|fused_experts)")
CUSTOM_GEMM = re.compile(r"(?i)(gemm|matmul|linear|(?:^|_)mm(?:_|$))")


def _custom_kind(op: str) -> str | None:
    """Which signature reading a custom op gets, from its name (first match wins)."""
    for kind, pattern in (
        ("moe", CUSTOM_MOE),
        ("gemm", CUSTOM_GEMM),
        ("norm", CUSTOM_NORM),
        ("glu", CUSTOM_GLU),
        ("rotary", CUSTOM_ROTARY),
        ("kv_write", CUSTOM_KV_WRITE),
    ):
        if pattern.search(op):
            return kind
    return None


def gemm_layout(x: list[int], w: list[int]) -> tuple[int, int, int, str] | None:
    """(M, N, K, layout) of `[M, K] x [N, K]` (`"NK"`, nn.Linear's) or `[M, K] x [K, N]`
    (`"KN"`); None when the two shapes are not a GEMM's."""
    if len(x) != 2 or len(w) != 2:
        return None
    m, k = x
    if w[1] == k:
        return m, w[0], k, "NK"
    if w[0] == k:
        return m, w[1], k, "KN"
    return None


def _custom_gemm(op: str, a: _Args, name: str) -> Cost:
    tensors = a.tensors()
    if len(tensors) < 2:
        raise NotModelled(f"{name}: fewer than two recorded tensor inputs, not read as a GEMM")
    ix, iw = tensors[0], tensors[1]
    x, w = a.shape(ix), a.shape(iw)
    layout = gemm_layout(x, w)
    if layout is None:
        raise NotModelled(f"{name}: inputs {x} and {w} are not [M, K] x [N, K] or [K, N]")
    m, n, k, nk = layout
    bias = [i for i in tensors[2:] if a.shape(i) == [n]]
    mnk = 2.0 * m * n * k
    read = sum(a.bytes(i) for i in tensors)  # scales and bias included
    dtype = a.dtype(ix)
    if dtype not in FLOAT_RANK:
        raise NotModelled(f"{name}: quantized ({dtype}) GEMM, its output dtype is not recorded")
    basis = (
        f"custom op read as a GEMM by its signature: x {x}, weight {w} ([{nk[0]}, {nk[1]}]): "
        f"M={m}, N={n}, K={k}" + (", bias" if bias else "")
    )
    return Cost(
        "gemm",
        flops=mnk + (m * n if bias else 0),
        matmul_flops=mnk,
        bytes_read=read,
        bytes_written=m * n * ITEMSIZE[dtype],
        dtype=_compute(dtype),
        basis=basis,
    )


def _custom_moe(op: str, a: _Args, name: str) -> Cost:
    tensors = a.tensors()
    shapes = {i: a.shape(i) for i in tensors}
    experts = [i for i in tensors if len(shapes[i]) == 3]
    hidden = [i for i in tensors if len(shapes[i]) == 2]
    if len(experts) < 2 or not hidden:
        raise NotModelled(
            "expert routing not recorded: the expert weights ([E, 2N, K], [E, K, N]) are not inputs"
        )
    x = hidden[0]
    t, k = shapes[x]
    routed = [i for i in hidden[1:] if shapes[i][0] == t and shapes[i][1] < k]
    if not routed:
        raise NotModelled("expert routing not recorded: no [T, topk] routing input")
    topk = shapes[routed[0]][1]
    w1, w2 = shapes[experts[0]], shapes[experts[1]]
    e, up, k1 = w1
    if k1 != k or w2[0] != e or w2[1] != k:
        raise NotModelled(f"MoE expert weights {w1}, {w2} do not match hidden size {k}")
    inner = w2[2]
    rows = t * topk
    mnk = 2.0 * rows * up * k + 2.0 * rows * k * inner
    used = min(e, rows) / e
    weights = (a.bytes(experts[0]) + a.bytes(experts[1])) * used
    read = a.bytes(x) + weights + sum(a.bytes(i) for i in routed)
    dtype = a.dtype(x)
    basis = (
        f"fused MoE: T={t} tokens x topk={topk}, {e} experts, w1 {w1}, w2 {w2}; "
        f"weights of {min(e, rows)} experts read"
    )
    return Cost("gemm", mnk, mnk, read, t * k * ITEMSIZE[dtype], _compute(dtype), basis=basis)


CUSTOM_NORM = re.compile(r"(?i)^(?!.*reshape).*(rms_?norm|layer_?norm|qk_norm)")
CUSTOM_GLU = re.compile(r"(?i)((silu|gelu\w*|relu)_and_mul|swiglu|geglu)")
CUSTOM_ROTARY = re.compile(r"(?i)rotary")
CUSTOM_KV_WRITE = re.compile(r"(?i)(kv_cache_update|set_kv_buffer|reshape_and_cache)")


def _activations(a: _Args) -> list[int]:
    """The floating-point tensor arguments of two or more dimensions, largest shape last."""
    found = [i for i in a.tensors() if len(a.shape(i)) >= 2 and a.types[i] in FLOAT_RANK]
    return sorted(found, key=lambda i: _numel(a.shape(i)))


def _custom_norm(op: str, a: _Args, name: str) -> Cost:
    acts = _activations(a)
    if not acts:
        raise NotModelled(f"{name}: no recorded activation to normalize")
    shapes = list(dict.fromkeys(tuple(a.shape(i)) for i in acts))
    first = {s: next(i for i in acts if tuple(a.shape(i)) == s) for s in shapes}
    added = "add" in op.lower()
    moved = sum(a.bytes(i) for i in first.values()) * (2 if added else 1)
    hidden = {s[-1] for s in shapes}
    weights = [i for i in a.tensors() if len(a.shape(i)) == 1 and a.shape(i)[0] in hidden]
    elements = sum(_numel(list(s)) for s in shapes)
    per = flop_table.NORM_FLOPS["native_layer_norm" if "layer" in op.lower() else "rms_norm"]
    basis = (
        f"{name} read as a norm by its signature: activations {[list(s) for s in shapes]}"
        + (
            " with a fused residual add (x and residual read, out and residual written)"
            if added
            else ""
        )
        + (f", weight {a.shape(weights[0])}" if weights else "")
    )
    return Cost(
        "norm",
        flops=elements * (per + (1 if added else 0)),
        bytes_read=moved + sum(a.bytes(i) for i in weights),
        bytes_written=moved,
        dtype=_compute(a.dtype(first[shapes[0]])),
        basis=basis,
    )


def _custom_glu(op: str, a: _Args, name: str) -> Cost:
    acts = _activations(a)
    if len(acts) != 2:
        raise NotModelled(f"{name}: not one [T, 2N] input and one [T, N] output")
    out, x = acts
    (t_out, n), (t_in, two_n) = a.shape(out)[-2:], a.shape(x)[-2:]
    if t_out != t_in or two_n != 2 * n:
        raise NotModelled(f"{name}: {a.shape(x)} is not [T, 2N] of {a.shape(out)}")
    act = re.match(r"(?i)(silu|gelu\w*|relu)", op)
    per = flop_table.ELEMENTWISE_FLOPS.get(act.group(1).lower() if act else "silu", 1) + 1
    elements = _numel(a.shape(out))
    basis = f"{name} read as act(gate) * up by its signature: {a.shape(x)} in, {a.shape(out)} out"
    dtype = a.dtype(x)
    return Cost(
        "elementwise", elements * per, 0.0, a.bytes(x), a.bytes(out), _compute(dtype), basis=basis
    )


def _custom_rotary(op: str, a: _Args, name: str) -> Cost:
    tensors = a.tensors()
    rows = [i for i in tensors if len(a.shape(i)) == 1 and a.types[i] not in FLOAT_RANK]
    acts = [i for i in tensors if len(a.shape(i)) >= 2 and a.types[i] in FLOAT_RANK]
    if not rows or len(acts) < 2:
        raise NotModelled(f"{name}: no [T] positions and q, k, cos/sin cache recorded")
    tokens = a.shape(rows[0])[0]
    cache = max(acts, key=lambda i: a.shape(i)[0])
    qk = [i for i in acts if i != cache and a.shape(i)[0] == tokens]
    if not qk:
        raise NotModelled(f"{name}: no [T, ...] query or key of the {tokens} positions")
    moved = sum(a.bytes(i) for i in qk)
    cache_rows = tokens * a.shape(cache)[-1] * ITEMSIZE[a.dtype(cache)]
    elements = sum(_numel(a.shape(i)) for i in qk)
    basis = (
        f"{name} read as rotary embedding in place: q/k {[a.shape(i) for i in qk]}, "
        f"{tokens} rows of the cos/sin cache {a.shape(cache)}"
    )
    read = moved + cache_rows + a.bytes(rows[0])
    return Cost(
        "elementwise", 3.0 * elements, 0.0, read, moved, _compute(a.dtype(qk[0])), basis=basis
    )


def _custom_kv_write(op: str, a: _Args, name: str) -> Cost:
    acts = _activations(a)
    if len(acts) < 2:
        raise NotModelled(f"{name}: no recorded k and v")
    step = a.shape(acts[0])
    kv = [i for i in acts if a.shape(i) == step]
    if len(kv) < 2:
        raise NotModelled(f"{name}: k and v of one shape not recorded")
    moved = sum(a.bytes(i) for i in kv[:2])
    basis = f"{name} read as a KV-cache write: k and v {step} copied into the cache"
    return Cost("copy", 0.0, 0.0, moved, moved, _compute(a.dtype(kv[0])), basis=basis)


_CUSTOM = {
    "gemm": _custom_gemm,
    "moe": _custom_moe,
    "norm": _custom_norm,
    "glu": _custom_glu,
    "rotary": _custom_rotary,
    "kv_write": _custom_kv_write,
}


# -- attention ----------------------------------------------------------------------------


def kept_scores(n_q: int, n_kv: int, causal: bool, left: int = -1, right: int = -1) -> int:
    """Scores a masked attention computes per (batch, head): all `n_q·n_kv`, or those the
    causal (top-left, PyTorch's `is_causal`) and sliding-window masks keep."""
    if not causal and left < 0 and right < 0:
        return n_q * n_kv
    i = np.arange(n_q, dtype=np.int64)
    hi = np.full(n_q, n_kv - 1, dtype=np.int64)
    lo = np.zeros(n_q, dtype=np.int64)
    if causal:
        hi = np.minimum(hi, i)
    if right >= 0:
        hi = np.minimum(hi, i + right)
    if left >= 0:
        lo = np.maximum(lo, i - left)
    return int(np.clip(hi - lo + 1, 0, None).sum())


def _attention(op: str, a: _Args, name: str) -> Cost:
    backward = op in ATTENTION_BACKWARD
    base = 1 if backward else 0  # backward ops take grad_out first
    q, k, v = a.shape(base), a.shape(base + 1), a.shape(base + 2)
    left = right = -1
    if op == "_flash_attention_forward":
        if a.is_tensor(3):
            raise NotModelled(
                "varlen attention: per-sequence lengths are tensor values the trace does not record"
            )
        # [B, N, H, D] layout; window sizes at 11, 12 when recorded
        (b, n_q, h_q, d_qk), (_, n_kv, _, _), d_v = q, k, v[-1]
        left, right = a.int(11, -1) or -1, a.int(12, -1) or -1
        left = -1 if left is None else left
    elif op == "_efficient_attention_forward":
        if a.is_tensor(3):
            raise NotModelled("varlen attention: per-sequence lengths are not recorded")
        (b, n_q, h_q, d_qk), (_, n_kv, _, _), d_v = q, k, v[-1]
    else:
        if len(q) != 4 or len(k) != 4:
            raise NotModelled("attention inputs are not [B, H, N, D]")
        (b, h_q, n_q, d_qk), (_, _, n_kv, _), d_v = q, k, v[-1]
    causal = a.flag(CAUSAL_ARG[op])
    kept = kept_scores(n_q, n_kv, causal, left, right)
    dtype = a.dtype(base)
    size = ITEMSIZE[dtype]
    if backward:
        # recompute scores, then dV, dP, dQ, dK: 2·(3·d_qk + 2·d_v) per kept score
        mm = 2.0 * b * h_q * kept * (3 * d_qk + 2 * d_v)
        read = sum(a.bytes(i) for i in a.tensors())
        written = a.bytes(base) + a.bytes(base + 1) + a.bytes(base + 2)
        return Cost("attention", mm, mm, read, written, _compute(dtype))
    mm = 2.0 * b * h_q * kept * (d_qk + d_v)
    read = a.bytes(base) + a.bytes(base + 1) + a.bytes(base + 2)
    mask = (
        3
        if op
        in (
            "scaled_dot_product_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
        )
        else None
    )
    if mask is not None and a.is_tensor(mask):
        read += a.bytes(mask)
    written = b * h_q * n_q * d_v * size
    if op in LSE_ATTENTION:
        written += b * h_q * n_q * 4  # fp32 log-sum-exp
    return Cost("attention", mm, mm, read, written, _compute(dtype))


# -- convolution --------------------------------------------------------------------------


def _conv_params(op: str, a: _Args) -> tuple[list[int], list[int], list[int], bool, list[int], int]:
    """(stride, padding, dilation, transposed, output_padding, groups) as recorded."""
    x = a.shape(0)
    spatial = len(x) - 2

    def per_dim(v: list[int] | None, default: int) -> list[int]:
        if not v:
            return [default] * spatial
        return v * spatial if len(v) == 1 else v

    if op in ("convolution", "_convolution"):
        s, p, d = a.ints(3), a.ints(4), a.ints(5)
        transposed, out_pad, groups = a.flag(6), a.ints(7), a.int(8, 1) or 1
    elif op == "_slow_conv2d_forward":  # (self, weight, kernel_size, bias, stride, padding)
        s, p, d = a.ints(4), a.ints(5), None
        transposed, out_pad, groups = False, None, 1
    elif op == "cudnn_convolution":
        p, s, d = a.ints(2), a.ints(3), a.ints(4)
        transposed, out_pad, groups = False, None, a.int(5, 1) or 1
    elif op.startswith("conv_transpose"):
        s, p, out_pad = a.ints(3), a.ints(4), a.ints(5)
        groups, d, transposed = a.int(6, 1) or 1, a.ints(7), True
    else:  # conv1d/2d/3d; mkldnn_convolution(input, weight, bias, padding, stride, ...)
        if op == "mkldnn_convolution":
            p, s, d = a.ints(3), a.ints(4), a.ints(5)
        else:
            s, p, d = a.ints(3), a.ints(4), a.ints(5)
            if a.scalar(4) in ("same", "valid"):
                raise NotModelled("string padding ('same'/'valid')")
        transposed, out_pad, groups = False, None, a.int(6, 1) or 1
    return per_dim(s, 1), per_dim(p, 0), per_dim(d, 1), transposed, per_dim(out_pad, 0), groups


def _conv_out(x: list[int], w: list[int], params: tuple) -> list[int]:
    s, p, d, transposed, op_, groups = params
    k = w[2:]
    if transposed:
        spatial = [
            (x[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op_[i] + 1 for i in range(len(k))
        ]
        return [x[0], w[1] * groups, *spatial]
    spatial = [(x[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(len(k))]
    return [x[0], w[0], *spatial]


def conv_products(x: list[int], w: list[int], out: list[int], transposed: bool) -> float:
    """Multiply-add FLOPs of a convolution: 2 per weight element per output (per input
    for a transposed one) position, per batch element (`w[1]` is C_in / groups)."""
    positions = _numel((x if transposed else out)[2:])
    return 2.0 * x[0] * positions * _numel(w)


def _conv(op: str, a: _Args, name: str) -> Cost:
    if op == "convolution_backward":
        return _conv_backward(a)
    x, w = a.shape(0), a.shape(1)
    params = _conv_params(op, a)
    out = _conv_out(x, w, params)
    mm = conv_products(x, w, out, params[3])
    bias_at = 3 if op == "_slow_conv2d_forward" else 2
    has_bias = op != "cudnn_convolution" and a.is_tensor(bias_at)
    bias = _numel(out) if has_bias else 0
    dtype = a.dtype(0)
    read = a.bytes(0) + a.bytes(1) + (a.bytes(bias_at) if has_bias else 0)
    return Cost("conv", mm + bias, mm, read, _numel(out) * ITEMSIZE[dtype], _compute(dtype))


def _conv_backward(a: _Args) -> Cost:
    """`convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)`: the input-gradient GEMM and the
    weight-gradient GEMM (each as many products as the forward), and the bias reduction."""
    g, x, w = a.shape(0), a.shape(1), a.shape(2)
    mask_text = a.scalar(10).strip("[]").replace(" ", "")
    mask = [m in ("True", "1", "true") for m in mask_text.split(",")] if mask_text else []
    mask += [True] * (3 - len(mask))
    transposed = a.flag(7)
    forward = (
        conv_products(x, w, g, transposed) if not transposed else conv_products(g, w, x, False)
    )
    mm = forward * (int(mask[0]) + int(mask[1]))
    bias = _numel(g) if mask[2] else 0
    dtype = a.dtype(0)
    size = ITEMSIZE[dtype]
    read = a.bytes(0) + (a.bytes(2) if mask[0] else 0) + (a.bytes(1) if mask[1] else 0)
    written = (
        _numel(x) * size * mask[0]
        + _numel(w) * ITEMSIZE[a.dtype(2)] * mask[1]
        + (g[1] * size if mask[2] else 0)
    )
    return Cost("conv", mm + bias, mm, read, written, _compute(dtype))


# -- per-element families -----------------------------------------------------------------


#: Arguments of each elementwise op's functional form: one more, a tensor, is `out=`
#: (`mul.out(self, other, out)`), written and not read.
FUNCTIONAL_ARGS = {
    **dict.fromkeys(
        (
            "add",
            "sub",
            "rsub",
            "clamp",
            "where",
            "lerp",
            "hardtanh",
            "threshold",
            "masked_fill",
            "threshold_backward",
            "gelu_backward",
        ),
        3,
    ),
    **dict.fromkeys(
        (
            "mul",
            "div",
            "true_divide",
            "pow",
            "maximum",
            "minimum",
            "fmax",
            "fmin",
            *sorted(BINARY_COMPARISONS),
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "remainder",
            "fmod",
            "atan2",
            "hypot",
            "floor_divide",
            "gelu",
            "clamp_min",
            "clamp_max",
            "leaky_relu",
            "silu_backward",
            "sigmoid_backward",
            "tanh_backward",
        ),
        2,
    ),
    **dict.fromkeys(("addcmul", "addcdiv"), 4),
    **dict.fromkeys(
        (
            "exp",
            "exp2",
            "expm1",
            "log",
            "log2",
            "log1p",
            "neg",
            "abs",
            "sqrt",
            "rsqrt",
            "sigmoid",
            "tanh",
            "relu",
            "silu",
            "sin",
            "cos",
            "tan",
            "erf",
            "erfc",
            "reciprocal",
            "sign",
            "floor",
            "ceil",
            "round",
            "trunc",
            "square",
            "logical_not",
            "bitwise_not",
            "hardswish",
            "hardsigmoid",
            "mish",
        ),
        1,
    ),
}


def _elementwise(op: str, a: _Args, name: str) -> Cost:
    tensors = a.tensors()
    if not tensors:
        raise NotModelled("no tensor inputs recorded")
    arity = FUNCTIONAL_ARGS.get(op)
    last = len(a.dims) - 1
    if arity is not None and len(a.dims) > arity and last in tensors and len(tensors) > 1:
        out = tensors.pop()  # `out=`: written (at its own dtype), not read
        read = sum(a.bytes(i) for i in tensors)
        n = _numel(a.shape(out))
        per = flop_table.ELEMENTWISE_FLOPS[op]
        return Cost("elementwise", n * per, 0.0, read, a.bytes(out), _compute(a.dtype(out)))
    pairs = [(a.dtype(i), a.shape(i)) for i in tensors]
    pairs_out = pairs[1:] if op == "where" and len(tensors) == 3 else pairs  # not the mask
    in_place = base_name(name).endswith("_") and not base_name(name).endswith("__")
    out_shape = a.shape(tensors[0]) if in_place else _broadcast([s for _, s in pairs])
    if in_place:
        out_dtype = a.dtype(tensors[0])
    elif op in COMPARE_OPS:
        out_dtype = "bool"
    else:
        out_dtype = promote(pairs_out)
    n = _numel(out_shape)
    per = flop_table.ELEMENTWISE_FLOPS[op]
    if op == "pow" and a.scalar(1) in ("2", "2.", "2.0", "0.5", "-1", "-1."):
        per = 1  # x * x, sqrt(x), 1 / x: what ATen's pow does for these exponents
    if op == "gelu" and a.scalar(1).strip("'\"") == "tanh":
        per = flop_table.ELEMENTWISE_FLOPS["gelu_tanh"]
    written = n * ITEMSIZE[out_dtype]
    if op == "native_dropout":
        written += n  # the bool mask
    read = sum(a.bytes(i) for i in tensors)
    if op in ("zero", "fill", "bernoulli", "uniform", "normal"):
        read = 0  # writes only
    compute = _compute(out_dtype) or _compute(pairs[0][0])
    return Cost("elementwise", n * per, 0.0, read, written, compute)


def _softmax(op: str, a: _Args, name: str) -> Cost:
    x = a.shape(0)
    dtype = a.dtype(0)
    n = _numel(x)
    if op in ("_softmax_backward_data", "_log_softmax_backward_data"):
        read = a.bytes(0) + a.bytes(1)
        code = a.scalar(3)
        out = SCALAR_TYPE.get(code, dtype) if code not in ("", "None") else dtype
        return Cost(
            "softmax", n * flop_table.SOFTMAX_FLOPS[op], 0, read, n * ITEMSIZE[out], _compute(dtype)
        )
    out = dtype
    if op in ("_softmax", "_log_softmax") and a.flag(2):
        out = "float"  # half_to_float
    elif op in ("softmax", "log_softmax"):
        code = a.scalar(2)
        out = SCALAR_TYPE.get(code, dtype) if code not in ("", "None") else dtype
    return Cost(
        "softmax",
        n * flop_table.SOFTMAX_FLOPS[op],
        0,
        a.bytes(0),
        n * ITEMSIZE[out],
        _compute(dtype),
    )


def _norm(op: str, a: _Args, name: str) -> Cost:
    x = a.shape(0)
    dtype = a.dtype(0)
    n = _numel(x)
    per = flop_table.NORM_FLOPS[op]
    tensors = a.tensors()
    if op.endswith("_backward"):
        read = sum(a.bytes(i) for i in tensors)
        written = n * ITEMSIZE[dtype] + sum(
            a.bytes(i)
            for i in tensors[1:]
            if a.shape(i) == x[-len(a.shape(i)) :] and a.shape(i) != x
        )
        return Cost("norm", n * per, 0, read, written, _compute(dtype))
    params = [i for i in tensors[1:] if _numel(a.shape(i)) < n]
    if (
        op
        in (
            "layer_norm",
            "native_layer_norm",
            "group_norm",
            "native_group_norm",
            "rms_norm",
            "_fused_rms_norm",
        )
        and not params
    ):
        per -= flop_table.NORM_AFFINE if op not in ("rms_norm", "_fused_rms_norm") else 1
    read = a.bytes(0) + sum(a.bytes(i) for i in params)
    written = n * ITEMSIZE[dtype]
    if op in ("native_layer_norm", "native_group_norm", "_fused_rms_norm"):
        normalized = a.ints(1) or []
        rows = (
            n // max(1, _numel(normalized))
            if op != "native_group_norm"
            else x[0] * (a.int(5, 1) or 1)
        )
        written += 2 * rows * 4  # fp32 mean and rstd per row, kept for the backward
    return Cost("norm", n * per, 0, read, written, _compute(dtype))


def _reduction(op: str, a: _Args, name: str) -> Cost:
    tensors = a.tensors()
    x = a.shape(tensors[0])
    dtype = a.dtype(tensors[0])
    n = _numel(x)
    read = sum(a.bytes(i) for i in tensors)
    if op in ("cumsum", "cumprod"):
        out_elems = n
    elif op in ("nll_loss_backward",):
        out_elems = _numel(a.shape(1))
    elif op in (
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "nll_loss",
        "nll_loss_forward",
        "cross_entropy_loss",
    ):
        reduction = a.int(2 if op != "nll_loss_forward" else 3, 1)
        out_elems = n if (reduction == 0 and op in ("mse_loss", "l1_loss")) else 1
    else:
        dims = a.ints(1)
        keep = a.flag(2)
        if not dims or (op in ("max", "min", "argmax", "argmin") and a.scalar(1) in ("", "None")):
            out_elems = 1
        else:
            rank = len(x)
            drop = {d % rank for d in dims} if rank else set()
            out_elems = (
                _numel([s for k, s in enumerate(x) if k not in drop])
                if not keep
                else _numel([1 if k in drop else s for k, s in enumerate(x)])
            )
    out_dtype = (
        "long int" if op in ("argmax", "argmin") else ("bool" if op in ("all", "any") else dtype)
    )
    written = out_elems * ITEMSIZE[out_dtype]
    if op in ("max", "min") and a.scalar(1) not in ("", "None"):
        written += out_elems * 8  # the indices
    per = flop_table.REDUCTION_FLOPS[op]
    return Cost("reduction", n * per, 0, read, written, _compute(dtype))


def _embedding(op: str, a: _Args, name: str) -> Cost:
    """Gathers read the index and the rows they pick, and write those rows; scatters read
    the source and index and write the source's worth into `self` (not all of `self`)."""
    if op == "embedding":
        weight, idx = a.shape(0), a.shape(1)
        row = _numel(weight[1:]) * ITEMSIZE[a.dtype(0)]
        picked = _numel(idx) * row
        return Cost("embedding", 0, 0, a.bytes(1) + picked, picked, _compute(a.dtype(0)))
    if op == "embedding_dense_backward":
        grad, idx = a.shape(0), a.shape(1)
        num_weights = a.int(2)
        if num_weights is None:
            raise NotModelled("num_weights not recorded")
        size = ITEMSIZE[a.dtype(0)]
        written = num_weights * grad[-1] * size
        return Cost(
            "embedding", _numel(grad), 0, a.bytes(0) + a.bytes(1), written, _compute(a.dtype(0))
        )
    if op == "index_select":
        x, idx, dim = a.shape(0), a.shape(2), a.int(1, 0) or 0
        out = list(x)
        out[dim % len(x)] = _numel(idx)
        moved = _numel(out) * ITEMSIZE[a.dtype(0)]
        return Cost("embedding", 0, 0, a.bytes(2) + moved, moved, _compute(a.dtype(0)))
    if op in ("gather", "take_along_dim"):
        idx_pos = 2 if op == "gather" else 1
        moved = _numel(a.shape(idx_pos)) * ITEMSIZE[a.dtype(0)]
        return Cost("embedding", 0, 0, a.bytes(idx_pos) + moved, moved, _compute(a.dtype(0)))
    if op == "index":
        raise NotModelled("advanced indexing: the result shape depends on index values")
    if op in SCATTER_OPS:
        tensors = a.tensors()
        src = [i for i in tensors[1:]]
        if not src:
            raise NotModelled("no source tensor recorded")
        largest = max(src, key=lambda i: _numel(a.shape(i)))
        moved = _numel(a.shape(largest)) * ITEMSIZE[a.dtype(tensors[0])]
        read = sum(a.bytes(i) for i in src)
        flops = (
            _numel(a.shape(largest)) if op in ("scatter_add", "index_add", "scatter_reduce") else 0
        )
        return Cost("embedding", flops, 0, read, moved, _compute(a.dtype(tensors[0])))
    raise NotModelled(f"no gather/scatter formula for {op}")


def _copy(op: str, a: _Args, name: str) -> Cost:
    if op in ("cat", "stack"):
        parts = a.tensor_list(0)
        types = [t for t in a.types[:1]]
        del types
        if not parts:
            raise NotModelled("no tensor list recorded")
        # the list's dtype is not recorded per tensor: the op's output dtype is unknown
        raise NotModelled("cat/stack: the profiler records no dtype for a TensorList")
    tensors = a.tensors()
    if op in ("zeros", "ones", "full", "new_zeros", "new_ones", "new_full", "arange"):
        raise NotModelled("factory op: output size and dtype are not tensors the trace records")
    if not tensors:
        raise NotModelled("no tensor inputs recorded")
    src = tensors[0]
    if op == "copy":
        dst, src = tensors[0], tensors[1]
        n = _numel(a.shape(dst))
        dtype = _compute(a.dtype(dst))
        return Cost("copy", 0, 0, a.bytes(src), n * ITEMSIZE[a.dtype(dst)], dtype)
    if op in ("zero", "fill", "zeros_like", "ones_like", "full_like"):
        return Cost("copy", 0, 0, 0, a.bytes(src), _compute(a.dtype(src)))
    out_dtype = a.dtype(src)
    if op in ("to", "_to_copy", "_to_dtype"):
        for i in range(1, len(a.concrete)):
            if a.types[i] == "Scalar" and a.scalar(i) in SCALAR_TYPE and i in (1, 2):
                out_dtype = SCALAR_TYPE[a.scalar(i)]
                break
    if op == "type_as":
        out_dtype = a.dtype(1)
    n = _numel(a.shape(src))
    return Cost("copy", 0, 0, a.bytes(src), n * ITEMSIZE[out_dtype], _compute(out_dtype))


def _view(op: str, a: _Args, name: str) -> Cost:
    return Cost("view")


def _other(op: str, a: _Args, name: str) -> Cost:
    raise NotModelled(f"no cost model for {base_name(name)}")


# -- Inductor kernels ---------------------------------------------------------------------

_KNOWN_TOKENS = sorted(
    {
        *flop_table.ELEMENTWISE_FLOPS,
        *flop_table.SOFTMAX_FLOPS,
        *flop_table.NORM_FLOPS,
        *flop_table.REDUCTION_FLOPS,
        *VIEW_OPS,
        *COPY_OPS,
        "convert_element_type",
        "constant_pad_nd",
        "embedding",
        "index",
        "mm",
        "bmm",
        "addmm",
    },
    key=len,
    reverse=True,
)


@lru_cache(maxsize=4096)
def fused_tokens(name: str) -> tuple[str, ...]:
    """The ops an Inductor kernel's name lists (`triton_poi_fused__to_copy_add_silu_0` ->
    `_to_copy`, `add`, `silu`), matched greedily, longest op name first."""
    match = FUSED_OPS.search(name)
    if not match:
        return ()
    text, out = match.group(1), []
    while text:
        text = text.lstrip("_") if not any(text.startswith(t) for t in _KNOWN_TOKENS) else text
        for token in _KNOWN_TOKENS:
            if text.startswith(token) and (len(text) == len(token) or text[len(token)] == "_"):
                out.append(token)
                text = text[len(token) :]
                break
        else:
            head, _, text = text.partition("_")
            if head:
                out.append(head)
    return tuple(out)


def _fused(op: str, a: _Args, name: str) -> Cost:
    if re.search(r"(?:^|_)triton_tem_|_mm_|(?:^|_)mm$", name):
        raise NotModelled("Inductor GEMM template: the arguments do not say M, N, K")
    tensors = a.tensors()
    if not tensors:
        raise NotModelled("no tensor arguments recorded for the kernel")
    numels = {i: _numel(a.shape(i)) for i in tensors}
    if "_poi_" in name and len(tensors) > 1:
        # A pointwise kernel touches each element of its iteration space once, and that
        # space is no larger than its output: an input larger than every other argument
        # (an embedding table it gathers rows from) is read only as far as the others
        # reach, not whole (vLLM's `triton_poi_fused_0` reads 32 rows of a 201088-row
        # table: counted whole, it "moved" 1.2 GB in 10.6 µs, 21x HBM bandwidth).
        numels = {
            i: min(n, max(numels[j] for j in tensors if j != i)) if i != tensors[-1] else n
            for i, n in numels.items()
        }
    largest = max(numels.values())
    tokens = list(fused_tokens(name))
    flops = largest * flop_table.fused_flops(tokens)
    written = a.bytes(tensors[-1])
    read = sum(numels[i] * ITEMSIZE[a.dtype(i)] for i in tensors[:-1])
    dtypes = [a.dtype(i) for i in tensors]
    floats = [d for d in dtypes if d in FLOAT_RANK]
    return Cost("fused", flops, 0, read, written, _compute(floats[0]) if floats else None)


_FORMULAS = {
    "gemm": _gemm,
    "attention": _attention,
    "conv": _conv,
    "norm": _norm,
    "softmax": _softmax,
    "reduction": _reduction,
    "embedding": _embedding,
    "copy": _copy,
    "elementwise": _elementwise,
    "view": _view,
    "fused": _fused,
    "other": _other,
}
