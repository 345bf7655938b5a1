"""Kernel-name decoding: each vendor's naming scheme read into library, arch, dtype, tile,
layout, epilogue and fused ops.

The names are real ones, copied from the kernels of `../shared/traces` (HTA test data and
PARAM, MIT; TraceLens, MIT; Kineto tb_plugin samples, BSD-3): what each encodes is checked
against the vendor's documented convention (cuBLAS `<arch>_<prec>gemm_<tile>_<layout>`,
CUTLASS `cutlass_<sm>_<op>_<mma>gemm_<epilogue>_<dtype>_<MxN>_<Kxstages>_<layout>`,
Tensile `Cijk_<A>_<B>_<types>_..._MT<MxNxK>_..._ISA<gfx>`, Inductor
`triton_<kind>_fused_<ops>_<n>`).
"""

from __future__ import annotations

import polars as pl
import pytest

from traceq.kernel_names import decode, decode_frame, split_fused_ops

CASES = [
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
        "execute_segment_k_off_kernel__5x_cublas",
        dict(
            library="cublas",
            category="gemm",
            arch="sm90",
            dtype="bf16",
            tensor_core=True,
            tile="128x128x64",
            layout="tn",
        ),
    ),
    (
        "volta_sgemm_128x64_nn",
        dict(
            library="cublas",
            category="gemm",
            arch="volta",
            dtype="fp32",
            tensor_core=False,
            tile="128x64",
            layout="nn",
        ),
    ),
    (
        "ampere_sgemm_32x32_sliced1x4_tn",
        dict(
            library="cublas",
            arch="ampere",
            dtype="fp32",
            tensor_core=False,
            tile="32x32",
            layout="tn",
        ),
    ),
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4>"
        "(cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4::Params)",
        dict(
            library="cutlass",
            category="gemm",
            arch="sm80",
            dtype="tf32",
            tensor_core=True,
            tile="64x64x16",
            layout="nt",
            epilogue=None,
        ),
    ),
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x64_64x6_tn_align8>"
        "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x64_64x6_tn_align8::Params)",
        dict(
            library="cutlass",
            arch="sm80",
            dtype="bf16",
            tensor_core=True,
            tile="128x64x64",
            layout="tn",
            epilogue="relu",
        ),
    ),
    (
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>"
        "(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)",
        dict(library="cutlass", dtype="fp32", tensor_core=False, tile="128x32x8", layout="nn"),
    ),
    (
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_"
        "AFEM1_ASEM1_CLR1_CADS0_DTLA0_DTLB0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMBSK_"
        "GLS0_ISA942_IU1_K1_LDSTI0",
        dict(
            library="hipblaslt",
            category="gemm",
            arch="gfx942",
            dtype="bf16",
            tensor_core=True,
            tile="256x192x64",
            layout="tn",
            epilogue="bias",
        ),
    ),
    (
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_"
        "stage4_warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn",
        dict(library="cudnn", category="conv", arch="sm80", dtype="tf32", tile="128x128x16"),
    ),
    (
        "volta_scudnn_128x64_relu_interior_nn_v1",
        dict(library="cudnn", category="conv", arch="volta", dtype="fp32", epilogue="relu"),
    ),
    (
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct, "
        "float const*)",
        dict(library="cudnn", category="norm", dtype="fp32"),
    ),
    (
        "void epilogue::impl::globalKernel<float, float, float, true, true>(int, int, long, "
        "float*, cublasLtEpilogue_t, int)",
        dict(library="cublasLt", category="gemm", epilogue="bias", dtype="fp32", op="epilogue"),
    ),
    (
        "void splitKreduce_kernel<float, float, float, float, true, false, false>"
        "(cublasSplitKParams<float>, float const*)",
        dict(library="cublas", category="gemm", op="splitk_reduce"),
    ),
    (
        "triton_poi_fused__unsafe_view_mul_silu_2",
        dict(
            library="inductor",
            category="elementwise",
            kind="poi",
            fused_ops=("_unsafe_view", "mul", "silu"),
        ),
    ),
    (
        "triton_red_fused_add_mean_mul_pow_rsqrt_0",
        dict(
            library="inductor",
            category="reduction",
            kind="red",
            fused_ops=("add", "mean", "mul", "pow", "rsqrt"),
        ),
    ),
    ("triton__0d1d2d3d", dict(library="triton", category="other", fused_ops=())),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
        "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
        "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::"
        "operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, float)",
        dict(library="aten", category="elementwise", op="clamp", dtype="fp32"),
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, "
        "at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >"
        "(int, at::native::CUDAFunctor_add<c10::BFloat16>)",
        dict(library="aten", category="elementwise", op="add", dtype="bf16"),
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
        "silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const",
        dict(library="aten", op="silu"),
    ),
    (
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
        dict(library="nccl", category="comm", collective="AllReduce", dtype="fp32"),
    ),
    (
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, "
        "4, false, false, cutlass::bfloat16_t> >(pytorch_flash::Flash_fwd_params)",
        dict(library="flash-attn", category="attention", dtype="bf16"),
    ),
    ("Memcpy HtoD (Pageable -> Device)", dict(category="memcpy", op="HtoD Pageable->Device")),
]


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[c[0][:48] for c in CASES])
def test_decode_reads_each_vendor_convention(name: str, expected: dict) -> None:
    decoded = decode(name)
    got = {key: getattr(decoded, key) for key in expected}
    assert got == expected


def test_a_gemm_name_with_relu_is_only_evidence_of_an_epilogue() -> None:
    # cuBLAS picks ..._gemm_relu_... kernels; the decoder reports the epilogue, the rules
    # decide on ops. The decode stays a GEMM, not an activation.
    decoded = decode(
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>"
        "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8::Params)"
    )
    assert decoded.is_gemm and decoded.epilogue == "relu" and decoded.op is None


@pytest.mark.parametrize(
    ("text", "ops"),
    [
        ("_unsafe_view_mul_silu", ("_unsafe_view", "mul", "silu")),
        ("native_layer_norm_add", ("native_layer_norm", "add")),
        ("add_cos_sin", ("add", "cos", "sin")),
        ("_to_copy_gelu_mul", ("_to_copy", "gelu", "mul")),
        ("", ()),
    ],
)
def test_split_fused_ops_rejoins_multi_word_op_names(text: str, ops: tuple[str, ...]) -> None:
    assert split_fused_ops(text) == ops


def test_describe_lists_the_decoded_parts_in_one_line() -> None:
    text = decode("volta_sgemm_128x64_nn").describe()
    assert text == "cublas gemm volta fp32 simt tile 128x64 nn"


def test_unknown_names_decode_to_other_without_failing() -> None:
    decoded = decode("my_custom_kernel_v2(float*)")
    assert decoded.category == "other" and decoded.library is None


def test_decode_frame_joins_parts_onto_every_kernel_row() -> None:
    names = ["volta_sgemm_128x64_nn", "triton_poi_fused_add_cos_sin_0", "volta_sgemm_128x64_nn"]
    frame = pl.DataFrame({"event": [1, 2, 3], "name": names})
    decoded = decode_frame(frame)
    assert decoded["event"].to_list() == [1, 2, 3]
    assert decoded["category"].to_list() == ["gemm", "elementwise", "gemm"]
    assert decoded["fused_ops"].to_list()[1] == ["add", "cos", "sin"]
    assert decoded["tensor_core"].to_list() == [False, None, False]


def test_decode_frame_of_no_kernels_is_an_empty_frame_with_the_columns() -> None:
    empty = pl.DataFrame(schema={"event": pl.Int64, "name": pl.String})
    decoded = decode_frame(empty)
    assert decoded.height == 0 and {"library", "dtype", "fused_ops"} <= set(decoded.columns)


def test_gemm_kernels_of_a_real_bf16_trace_decode_to_their_precision(load_shared) -> None:
    trace = load_shared("tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    decoded = decode_frame(trace.kernels)
    gemms = decoded.filter(pl.col("category") == "gemm")
    by_dtype = dict(gemms.group_by("dtype", "tensor_core").len().select("dtype", "len").rows())
    raw_bf16 = trace.kernels.filter(pl.col("name").str.starts_with("sm90_xmma_gemm_bf16")).height
    raw_simt = trace.kernels.filter(pl.col("name").str.contains("simt_sgemm")).height
    # The model's GEMMs are bf16 on tensor cores; one small fp32 SIMT GEMM (rotary
    # embedding frequencies) runs on CUDA cores.
    assert by_dtype == {"bf16": raw_bf16, "fp32": raw_simt}
    assert raw_bf16 == 241 and raw_simt == 1
