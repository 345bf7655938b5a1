"""Decode GPU kernel names into what they say: library, arch, dtype, tile, layout, epilogue.

Kernel names are evidence, not classification: cuBLAS picks a `..._gemm_relu_...` kernel
for a plain Linear layer, so rules decide on ops and data flow and show decoded names to
let a reader check the claim. Vendors encode their choices in names in known ways:

- cuBLAS/cuBLASLt: `volta_sgemm_128x64_nn`, `ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_tn`,
  `sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_...`, `nvjet_tst_128x256_...`;
  `s1688` names are TF32 tensor-core MMAs on fp32 data, `h884`/`s884` fp16 ones.
- CUTLASS: `cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x64_64x6_tn_align8`.
- cuDNN: `cudnn::...`, `..._scudnn_...`, `sm80_xmma_fprop_implicit_gemm_..._cudnn`.
- hipBLASLt/Tensile: `Cijk_Alik_Bljk_BBS_BH_Bias_..._MT256x192x64_..._ISA942_...`.
- Triton/Inductor: `triton_poi_fused__unsafe_view_mul_silu_2` (kind, fused ops, index).
- ATen: `at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>`.
- NCCL/RCCL: `ncclKernel_AllReduce_RING_LL_Sum_float(...)`, `ncclDevKernel_AllGather_RING_LL`.

Each distinct name is decoded once (a trace has thousands of kernels but few names) and
joined back onto the kernel frame.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import polars as pl

ARCH_PREFIX = re.compile(r"^(?:cudnn_(?:infer|train)_)?(maxwell|pascal|volta|turing|ampere|sm\d+)_")

# cuBLAS/CUTLASS precision prefixes: s = fp32 data, h = fp16, i = int8; MMA shape tells
# tensor-core generation (s1688 = TF32 on Ampere+, s884/h884 = fp16 on Volta).
_MMA = re.compile(r"(?:^|_)([shdibz]|bf16_s|fp16_s|f16_s)(\d{3,6})(gemm|fprop|dgrad|wgrad)")
_XMMA_TYPES = re.compile(
    r"xmma_(?:gemm|fprop|dgrad|wgrad)(?:_implicit_gemm)?(?:_indexed)?_([a-z0-9]+?)(?:f32|f16|bf16)?_"
)
_TILE_XMMA = re.compile(r"tilesize(\d+)x(\d+)x(\d+)")
_TILE_CUTLASS = re.compile(r"_(\d+)x(\d+)_(\d+)x(\d+)_(?:[nt]{2})")
_TILE_PLAIN = re.compile(r"_(\d+)x(\d+)(?:_sliced\dx\d)?_(?:[nt]{2})(?:_|$)")
_TILE_MT = re.compile(r"_MT(\d+)x(\d+)x(\d+)")
_LAYOUT = re.compile(r"_([nt]{2})(?:_align\d+|_n|_v\d|_t|$|_|>)")
_EPILOGUE = re.compile(r"(?:gemm|_)(relu|gelu_erf|gelu|bias_relu|bias_gelu|bias|silu|swish)(?=_)")
_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem|for|mm|bmm|cat)_(?:fused_)?(.*?)(?:_(\d+))?$")
_NCCL = re.compile(
    r"^nccl(?:Dev)?Kernel_([A-Za-z]+)(?:_([A-Z]+))?(?:_([A-Z0-9]+))?(?:_([A-Za-z]+))?(?:_([A-Za-z0-9_]+?))?(?:\(|$)"
)
_MEMCPY = re.compile(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")
_TENSILE_LAYOUT = {
    ("Alik", "Bljk"): "tn",
    ("Ailk", "Bljk"): "nn",
    ("Ailk", "Bjlk"): "nt",
    ("Alik", "Bjlk"): "tt",
}
_TENSILE_TYPE = {
    "S": "fp32",
    "D": "fp64",
    "H": "fp16",
    "B": "bf16",
    "I": "int8",
    "F": "fp8",
    "X": "tf32",
}
_CXX_TYPE = [
    ("c10::BFloat16", "bf16"),
    ("__nv_bfloat16", "bf16"),
    ("cutlass::bfloat16_t", "bf16"),
    ("c10::Half", "fp16"),
    ("__half", "fp16"),
    ("cutlass::half_t", "fp16"),
    ("c10::Float8", "fp8"),
    ("double", "fp64"),
    ("float", "fp32"),
    ("long", "int64"),
    ("int", "int32"),
    ("bool", "bool"),
]
_NAME_TYPE = [
    ("bf16", "bf16"),
    ("fp16", "fp16"),
    ("f16", "fp16"),
    ("tf32", "tf32"),
    ("fp8", "fp8"),
    ("e4m3", "fp8"),
    ("int8", "int8"),
    ("f32", "fp32"),
]

# ATen elementwise functors and kernel helpers -> the op they compute (first match wins).
ATEN_OPS: tuple[tuple[str, str], ...] = (
    (r"launch_clamp_scalar|clamp_scalar", "clamp"),
    (r"clamp_min", "clamp_min"),
    (r"clamp_max", "clamp_max"),
    (r"threshold_kernel", "threshold"),
    (r"GeluCUDAKernelImpl|gelu_kernel", "gelu"),
    (r"GeluBackward|gelu_backward", "gelu_backward"),
    (r"silu_backward", "silu_backward"),
    (r"silu_kernel", "silu"),
    (r"sigmoid_backward", "sigmoid_backward"),
    (r"sigmoid_kernel", "sigmoid"),
    (r"tanh_backward", "tanh_backward"),
    (r"tanh_kernel", "tanh"),
    (r"softmax", "softmax"),
    (r"layer_norm", "layer_norm"),
    (r"rms_?norm", "rms_norm"),
    (r"batch_norm|bn_fw|bn_bw", "batch_norm"),
    (r"dropout", "dropout"),
    (r"direct_copy_kernel|copy_kernel|CatArrayBatchedCopy", "copy"),
    (r"FillFunctor", "fill"),
    (r"(?i)MulScalarFunctor|MulFunctor|mul_kernel", "mul"),
    (r"(?i)DivFunctor|div_true|div_trunc|div_floor", "div"),
    (r"(?i)AddFunctor|Functor_add|FunctorOnSelf_add|FunctorOnOther_add|add_kernel", "add"),
    (r"(?i)sub_kernel|SubFunctor", "sub"),
    (r"pow_tensor", "pow"),
    (r"rsqrt_kernel", "rsqrt"),
    (r"sqrt_kernel", "sqrt"),
    (r"exp_kernel", "exp"),
    (r"log_kernel|log2_kernel", "log"),
    (r"neg_kernel", "neg"),
    (r"where_kernel", "where"),
    (r"compare_scalar|compare_kernel|eq_kernel|ne_kernel|lt_kernel|gt_kernel", "compare"),
    (r"nan_to_num", "nan_to_num"),
    (r"index_select|indexSelect", "index_select"),
    (r"scatter_gather", "scatter_gather"),
    (r"embedding", "embedding"),
    (r"nll_loss", "nll_loss"),
    (r"MeanOps", "mean"),
    (r"sum_functor", "sum"),
    (r"WelfordOps", "var_mean"),
    (r"multi_tensor_apply|AdamFunctor", "multi_tensor_apply"),
)
_ATEN_COMPILED = tuple((re.compile(p), op) for p, op in ATEN_OPS)

# Inductor op names that themselves contain underscores, so `fused_<ops>` can be split.
MULTI_WORD_OPS = (
    "unsafe_view",
    "to_copy",
    "native_layer_norm",
    "native_dropout",
    "native_batch_norm",
    "layer_norm",
    "log_softmax",
    "silu_backward",
    "gelu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "threshold_backward",
    "native_layer_norm_backward",
    "embedding_dense_backward",
    "scaled_dot_product",
    "clamp_min",
    "clamp_max",
    "full_like",
    "zeros_like",
    "ones_like",
    "empty_like",
    "new_zeros",
    "index_select",
    "index_put",
    "slice_scatter",
    "select_scatter",
    "constant_pad_nd",
    "rsqrt_mean",
)
_MULTI = sorted((tuple(op.split("_")) for op in MULTI_WORD_OPS), key=len, reverse=True)


@dataclass(frozen=True)
class KernelName:
    """The parts a kernel name encodes; None where the name does not say."""

    name: str
    library: str | None = None  # cublas, cublasLt, cutlass, cudnn, hipblaslt, triton, ...
    category: str = "other"  # gemm, conv, attention, elementwise, reduction, norm, comm, ...
    arch: str | None = None  # sm90, volta, gfx942, ...
    dtype: str | None = None  # bf16, fp16, fp32, tf32, fp8, int8, fp64
    tensor_core: bool | None = None
    tile: str | None = None  # "128x128x64" (M x N x K) or "128x64"
    layout: str | None = None  # tn, nn, nt, tt (cuBLAS/Tensile operand transposes)
    epilogue: str | None = None  # relu, gelu, bias, ...
    kind: str | None = None  # Inductor kernel kind: poi, red, per, tem
    fused_ops: tuple[str, ...] = field(default_factory=tuple)
    op: str | None = None  # the op an ATen kernel computes (add, mul, clamp, silu, ...)
    collective: str | None = None  # NCCL: AllReduce, AllGather, ...

    @property
    def is_gemm(self) -> bool:
        return self.category == "gemm"

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["fused_ops"] = list(self.fused_ops)
        return {k: v for k, v in data.items() if v not in (None, [], "")}

    def describe(self) -> str:
        """One line for evidence, e.g. 'cuBLAS gemm sm90 bf16 tensor-core tile 128x128x64 tn'."""
        parts = [self.library or "?", self.category]
        parts += [p for p in (self.arch, self.dtype) if p]
        if self.tensor_core is not None:
            parts.append("tensor-core" if self.tensor_core else "simt")
        if self.tile:
            parts.append(f"tile {self.tile}")
        if self.layout:
            parts.append(self.layout)
        if self.epilogue:
            parts.append(f"epilogue {self.epilogue}")
        if self.fused_ops:
            parts.append("fused " + "+".join(self.fused_ops))
        if self.op:
            parts.append(f"op {self.op}")
        if self.collective:
            parts.append(self.collective)
        return " ".join(parts)


@lru_cache(maxsize=65536)
def decode(name: str) -> KernelName:
    """Decode one kernel name (cached: traces repeat few names many times)."""
    short = _short(name)
    for decoder in (_memcpy, _nccl, _inductor, _tensile, _xmma, _nvjet, _cutlass, _cublas_plain):
        found = decoder(name, short)
        if found is not None:
            return found
    return _other(name, short)


def decode_frame(kernels: pl.DataFrame) -> pl.DataFrame:
    """`kernels` plus the decoded columns (library, category, arch, dtype, tensor_core, tile,
    layout, epilogue, kind, fused_ops, op, collective), each name decoded once."""
    names = kernels.select(pl.col("name").unique()).drop_nulls()["name"].to_list()
    rows = [decode(n) for n in names]
    decoded = pl.DataFrame(
        {
            "name": pl.Series(names, dtype=pl.String),
            "library": [r.library for r in rows],
            "category": [r.category for r in rows],
            "arch": [r.arch for r in rows],
            "dtype": [r.dtype for r in rows],
            "tensor_core": [r.tensor_core for r in rows],
            "tile": [r.tile for r in rows],
            "layout": [r.layout for r in rows],
            "epilogue": [r.epilogue for r in rows],
            "kernel_kind": [r.kind for r in rows],
            "fused_ops": [list(r.fused_ops) for r in rows],
            "op": [r.op for r in rows],
            "collective": [r.collective for r in rows],
        },
        schema_overrides={
            "library": pl.String,
            "category": pl.String,
            "arch": pl.String,
            "dtype": pl.String,
            "tensor_core": pl.Boolean,
            "tile": pl.String,
            "layout": pl.String,
            "epilogue": pl.String,
            "kernel_kind": pl.String,
            "fused_ops": pl.List(pl.String),
            "op": pl.String,
            "collective": pl.String,
        },
    )
    return kernels.join(decoded, on="name", how="left", maintain_order="left")


# -- decoders, tried in order ------------------------------------------------------------


def _short(name: str) -> str:
    """The kernel's own identifier: `void cutlass::Kernel<cutlass_80_...>(...)` -> the
    template argument for CUTLASS wrappers, else the name without return type and args."""
    wrapped = re.search(r"cutlass\w*::Kernel2?<(\w+)>", name)
    if wrapped:
        return wrapped.group(1)
    text = re.sub(r"^void\s+", "", name)
    return text.split("(", 1)[0].split("<", 1)[0].strip()


def _arch(short: str) -> str | None:
    match = ARCH_PREFIX.match(short)
    if match:
        return match.group(1)
    cutlass = re.match(r"^cutlass_(\d{2,3})_", short)
    if cutlass:
        return f"sm{cutlass.group(1)}"
    return None


def _layout(short: str) -> str | None:
    match = _LAYOUT.search(short)
    return match.group(1) if match else None


def _epilogue(short: str) -> str | None:
    match = _EPILOGUE.search(short)
    return match.group(1) if match else None


def _memcpy(name: str, short: str) -> KernelName | None:
    match = _MEMCPY.match(name)
    if match:
        direction, src, dst = match.groups()
        return KernelName(name, library="cuda", category="memcpy", op=f"{direction} {src}->{dst}")
    if name.startswith("Memset"):
        return KernelName(name, library="cuda", category="memset", op="memset")
    return None


def _nccl(name: str, short: str) -> KernelName | None:
    match = _NCCL.match(short) or _NCCL.match(name)
    if not match:
        return None
    collective, algo, proto, reduce_op, dtype = match.groups()
    return KernelName(
        name,
        library="nccl",
        category="comm",
        collective=collective,
        dtype=_cxx_dtype(dtype or ""),
        op="_".join(p for p in (algo, proto, reduce_op) if p) or None,
    )


def _inductor(name: str, short: str) -> KernelName | None:
    if not short.startswith("triton"):
        return None
    match = _INDUCTOR.match(short)
    if not match:
        return KernelName(name, library="triton", category="other")
    kind, ops_text, _index = match.groups()
    ops = split_fused_ops(ops_text or "")
    category = {"poi": "elementwise", "red": "reduction", "per": "reduction"}.get(kind, "other")
    if kind in ("tem", "mm", "bmm") and any(op in ("mm", "addmm", "bmm", "baddbmm") for op in ops):
        category = "gemm"
    return KernelName(name, library="inductor", category=category, kind=kind, fused_ops=ops)


def split_fused_ops(text: str) -> tuple[str, ...]:
    """`_unsafe_view_mul_silu` -> ('_unsafe_view', 'mul', 'silu'): Inductor joins op names
    with `_`, and an op name may hold `_` itself (known multi-word names are rejoined)."""
    tokens = text.split("_")
    ops: list[str] = []
    i, private = 0, False
    while i < len(tokens):
        token = tokens[i]
        if token == "":
            private = True
            i += 1
            continue
        for words in _MULTI:
            if tuple(tokens[i : i + len(words)]) == words:
                token, i = "_".join(words), i + len(words)
                break
        else:
            i += 1
        ops.append(f"_{token}" if private else token)
        private = False
    return tuple(ops)


def _tensile(name: str, short: str) -> KernelName | None:
    """hipBLASLt/rocBLAS Tensile: `Cijk_<A>_<B>_<types>_..._MT<m>x<n>x<k>_..._ISA<gfx>`."""
    if not short.startswith("Cijk_"):
        return None
    parts = short.split("_")
    layout = _TENSILE_LAYOUT.get((parts[1], parts[2])) if len(parts) > 2 else None
    dtype = _TENSILE_TYPE.get(parts[3][:1]) if len(parts) > 3 else None
    tile = _TILE_MT.search(short)
    isa = re.search(r"_ISA(\w+?)_", short)
    epilogue = "bias" if "_Bias_" in short else None
    if re.search(r"_Act|_Relu|_Gelu", short):
        epilogue = "bias_act" if epilogue else "act"
    return KernelName(
        name,
        library="hipblaslt" if "UserArgs" in short or "_Bias_" in short else "rocblas",
        category="gemm",
        arch=f"gfx{isa.group(1)}" if isa else None,
        dtype=dtype,
        tensor_core="_MI" in short,
        tile="x".join(tile.groups()) if tile else None,
        layout=layout,
        epilogue=epilogue,
    )


def _xmma(name: str, short: str) -> KernelName | None:
    """cuBLAS/cuDNN xmma: `sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_...`."""
    if "xmma_" not in short:
        return None
    arch = _arch(short)
    conv = re.search(r"xmma_(fprop|dgrad|wgrad)", short)
    types = _XMMA_TYPES.search(short)
    dtype = _type_in(types.group(1)) if types else _type_in(short)
    tile = _TILE_XMMA.search(short)
    return KernelName(
        name,
        library="cudnn" if "cudnn" in short or conv else "cublas",
        category="conv" if conv else "gemm",
        arch=arch,
        dtype=dtype,
        # `f32f32_f32f32_f32` operands are computed with FFMA on the CUDA cores (the names
        # often end `_ffma`); a TF32 tensor-core kernel says `tf32` in its types.
        tensor_core=_xmma_tensor_core(dtype, short),
        tile="x".join(tile.groups()) if tile else None,
        layout=None if conv else _layout(short),
        epilogue=_epilogue(short.split("tilesize")[0]),
    )


def _xmma_tensor_core(dtype: str | None, short: str) -> bool | None:
    if dtype in ("bf16", "fp16", "tf32", "fp8", "int8"):
        return True
    if dtype == "fp32" or re.search(r"_ffma(?:_|$)", short):
        return False
    return None


def _nvjet(name: str, short: str) -> KernelName | None:
    """cuBLAS 12.x Hopper/Blackwell `nvjet_*` kernels: a tile, little else is documented."""
    if not short.startswith("nvjet"):
        return None
    tile = re.search(r"_(\d+)x(\d+)_(\d+)x\d+_", short)
    return KernelName(
        name,
        library="cublas",
        category="gemm",
        tensor_core=True,
        tile="x".join(tile.groups()) if tile else None,
        epilogue=_epilogue(short),
    )


def _cutlass(name: str, short: str) -> KernelName | None:
    """CUTLASS: `cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x64_64x6_tn_align8`."""
    if not short.startswith("cutlass"):
        return None
    conv = re.search(r"fprop|dgrad|wgrad|[Cc]onv", short)
    tile = _TILE_CUTLASS.search(short)
    mma = _MMA.search(short)
    named = _type_in(short)
    dtype = named or (_mma_dtype(mma.group(1), mma.group(2)) if mma else None)
    if dtype is None and "sgemm" in short:
        dtype = "fp32"
    tensor = "tensorop" in short or "wmma" in short
    if mma and mma.group(1) == "s" and tensor and not named:
        dtype = "tf32"
    return KernelName(
        name,
        library="cudnn" if "cudnn" in name else "cutlass",
        category="conv" if conv else "gemm",
        arch=_arch(short),
        dtype=dtype,
        tensor_core=tensor,
        tile=f"{tile.group(1)}x{tile.group(2)}x{tile.group(3)}" if tile else None,
        layout=None if conv else _layout(short),
        epilogue=_epilogue(short),
    )


def _cublas_plain(name: str, short: str) -> KernelName | None:
    """cuBLAS arch-prefixed kernels (`volta_sgemm_128x64_nn`, `ampere_fp16_s1688gemm_...`),
    cuDNN (`volta_scudnn_...`, `cudnn::...`), and cuBLAS helpers (splitK, gemv, epilogue)."""
    arch = _arch(short)
    if re.search(r"(implicit|explicit)_convolve_sgemm", short):
        dtype = _cxx_dtype(name)
        return KernelName(
            name, library="cudnn", category="conv", dtype=dtype, tensor_core=_simt(dtype)
        )
    if "scudnn" in short or "hcudnn" in short or re.match(r"(void )?cudnn", name):
        # cuDNN's own fp32 kernels (`volta_scudnn_*`, `cudnn::cnn::wgrad_alg0_engine<float>`,
        # winograd, `dgrad_engine`) run on the CUDA cores; its tensor-core convolutions are
        # xmma / CUTLASS / `*_s884cudnn_*` kernels, decoded elsewhere.
        category = _cudnn_category(name)
        dtype = _type_in(short) or ("fp32" if "scudnn" in short else _cxx_dtype(name))
        return KernelName(
            name,
            library="cudnn",
            category=category,
            arch=arch,
            dtype=dtype,
            tensor_core=_simt(dtype) if category == "conv" and "cudnn" in short else None,
            epilogue=_epilogue(short),
        )
    if arch and re.search(r"gemm|gemv", short):
        mma = _MMA.search(short)
        tile = _TILE_PLAIN.search(short)
        dtype = _type_in(short.split("gemm")[0] + "_") or (
            _mma_dtype(mma.group(1), mma.group(2)) if mma else None
        )
        sgemm = re.search(r"(?:^|_)([sdhcz]g?c?)gemm", short)
        if dtype is None and sgemm:
            dtype = {"s": "fp32", "d": "fp64", "h": "fp16", "c": "complex64"}.get(sgemm.group(1)[0])
        tensor = bool(mma) and not re.search(r"(?:^|_)[sd]gemm", short)
        return KernelName(
            name,
            library="cublas",
            category="gemm",
            arch=arch,
            dtype=dtype,
            tensor_core=tensor,
            tile=f"{tile.group(1)}x{tile.group(2)}" if tile else None,
            layout=_layout(short),
            epilogue=_epilogue(short),
        )
    lt = "cublasLt" in name or "epilogue::impl" in name
    if "splitKreduce" in name:
        return KernelName(
            name,
            library="cublasLt" if lt else "cublas",
            category="gemm",
            dtype=_cxx_dtype(name),
            op="splitk_reduce",
        )
    if "epilogue::impl" in name:
        return KernelName(
            name,
            library="cublasLt",
            category="gemm",
            epilogue="bias",
            dtype=_cxx_dtype(name),
            op="epilogue",
        )
    if re.search(r"gemmk1|gemvx|gemvNSP|gemv2T|gemv2N|sgemm_largek|magma_\w*gemm|cublas", name):
        return KernelName(
            name, library="cublasLt" if lt else "cublas", category="gemm", dtype=_cxx_dtype(name)
        )
    return None


def _simt(dtype: str | None) -> bool | None:
    """False (CUDA cores) for a cuDNN fp32 convolution kernel, else unknown."""
    return False if dtype == "fp32" else None


def _cudnn_category(name: str) -> str:
    """cuDNN ships convolutions and also batch norm, layout transforms and scaling."""
    if re.search(r"bn_fw|bn_bw|batch_?norm", name):
        return "norm"
    if re.search(r"nchwToNhwc|nhwcToNchw", name):
        return "copy"
    if "scalePackedTensor" in name:
        return "elementwise"
    return "conv"


def _other(name: str, short: str) -> KernelName:
    """ATen and everything else: elementwise functors, reductions, norms, attention."""
    if re.search(r"flash|fmha|attention|sdpa", name, re.I):
        return KernelName(
            name,
            library="flash-attn" if "flash" in name else None,
            category="attention",
            dtype=_cxx_dtype(name),
        )
    op = next((op for pattern, op in _ATEN_COMPILED if pattern.search(name)), None)
    aten = "at::native" in name or name.startswith("at::")
    category = "other"
    if re.search(r"elementwise_kernel|unrolled_elementwise|vectorized_elementwise", name):
        category = "elementwise"
    elif re.search(r"reduce_kernel|Reduce|softmax", name):
        category = "reduction"
    elif op in ("layer_norm", "rms_norm", "batch_norm"):
        category = "norm"
    elif op == "copy":
        category = "copy"
    library = "aten" if aten else None
    for prefix, lib in (
        ("fbgemm", "fbgemm"),
        ("cub::", "cub"),
        ("ck::", "ck"),
        ("apex", "apex"),
        ("liger", "liger"),
        ("vllm", "vllm"),
        ("flashinfer", "flashinfer"),
    ):
        if prefix in name:
            library = lib
    return KernelName(name, library=library, category=category, dtype=_cxx_dtype(name), op=op)


def _type_in(text: str) -> str | None:
    for token, dtype in _NAME_TYPE:
        if re.search(rf"(?:^|_|\d){token}(?:$|_|\d|[a-z])", text):
            return dtype
    return None


def _mma_dtype(prefix: str, shape: str) -> str | None:
    """`s1688` (fp32 data on TF32 MMA, Ampere+), `s884`/`h884` (fp16 MMA, Volta)."""
    if prefix.startswith(("bf16", "b")):
        return "bf16"
    if prefix.startswith(("fp16", "f16", "h")):
        return "fp16"
    if prefix == "s":
        return "tf32" if shape in ("1688", "16816", "1684") else "fp16"
    if prefix == "i":
        return "int8"
    if prefix == "d":
        return "fp64"
    return None


def _cxx_dtype(text: str) -> str | None:
    """dtype from C++ template arguments (`<float, ...>`, `c10::BFloat16`)."""
    for token, dtype in _CXX_TYPE:
        if re.search(rf"(?<![\w:]){re.escape(token)}(?![\w])", text):
            return dtype
    return None
