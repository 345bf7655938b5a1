"""Compile the zoo's Triton kernels for an H100-class GPU (sm_90) on a machine without one.

Run as a script in a process without TRITON_INTERPRET (the kernels must be JIT functions,
not interpreted ones). Triton's wheel ships ptxas, so this goes all the way to a cubin:
it catches what the interpreter never sees (constexpr handling, tensor-core dot operand
types, shared memory beyond the card's 228 KiB). Prints one JSON line per kernel.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton
from traceq.zoo.add_rms_norm.triton import add_rms_norm_kernel
from traceq.zoo.dual_gemm_glu.triton import dual_gemm_glu_kernel
from traceq.zoo.gemm_bias_act.triton import gemm_bias_act_kernel
from traceq.zoo.glu.triton import glu_kernel
from traceq.zoo.rms_norm.triton import rms_norm_kernel
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SM90 = GPUTarget("cuda", 90, 32)
SHARED_MEMORY_LIMIT = 228 * 1024


def _i32(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "i32")


def compile_one(
    label: str,
    fn: Any,
    signature: dict[str, str],
    constants: dict[str, Any],
    warps: int,
    stages: int,
) -> dict[str, Any]:
    source = ASTSource(
        fn=fn,
        signature={**signature, **dict.fromkeys(constants, "constexpr")},
        constexprs=constants,
    )
    kernel = triton.compile(source, target=SM90, options={"num_warps": warps, "num_stages": stages})
    return {"kernel": label, "shared": kernel.metadata.shared, "cubin": len(kernel.asm["cubin"])}


def main() -> int:
    gemm_pointers = dict.fromkeys(("x_ptr", "w_ptr", "bias_ptr", "y_ptr"), "*bf16")
    gemm_ints = _i32("M", "N", "K", "stride_xm", "stride_xk", "stride_wn", "stride_wk")
    gemm_ints |= _i32("stride_ym", "stride_yn")
    tile = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}
    flags = {"UPCAST": False, "PRECISION": "tf32"}
    results = [
        compile_one(
            "gemm_bias_act bf16 gelu+bias",
            gemm_bias_act_kernel,
            gemm_pointers | gemm_ints,
            {"HAS_BIAS": True, "ACT": "gelu", **flags, **tile},
            4,
            4,
        ),
        compile_one(
            "gemm_bias_act fp32 ieee gelu_tanh",
            gemm_bias_act_kernel,
            dict.fromkeys(gemm_pointers, "*fp32") | gemm_ints,
            {"HAS_BIAS": False, "ACT": "gelu_tanh", "UPCAST": False, "PRECISION": "ieee"}
            | {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8},
            4,
            5,
        ),
        compile_one(
            "dual_gemm_glu bf16 silu",
            dual_gemm_glu_kernel,
            dict.fromkeys(("x_ptr", "wg_ptr", "wu_ptr", "y_ptr"), "*bf16")
            | _i32("M", "N", "K", "stride_xm", "stride_xk", "stride_wgn", "stride_wgk")
            | _i32("stride_wun", "stride_wuk", "stride_ym", "stride_yn"),
            {"ACT": "silu", **flags, **tile},
            8,
            3,
        ),
        compile_one(
            "glu bf16 gelu_tanh",
            glu_kernel,
            dict.fromkeys(("gate_ptr", "up_ptr", "out_ptr"), "*bf16")
            | _i32("M", "N", "stride_gm", "stride_gn", "stride_um", "stride_un")
            | _i32("stride_om", "stride_on"),
            {"ACT": "gelu_tanh", "BLOCK_M": 8, "BLOCK_N": 1024},
            8,
            3,
        ),
        compile_one(
            "rms_norm bf16 one 4096-wide row",
            rms_norm_kernel,
            dict.fromkeys(("x_ptr", "w_ptr", "out_ptr"), "*bf16")
            | _i32("M", "N", "stride_xm", "stride_xn", "stride_om", "stride_on")
            | {"eps": "fp32"},
            {"BLOCK_M": 1, "BLOCK_N": 4096},
            4,
            3,
        ),
        compile_one(
            "add_rms_norm bf16 32 rows of 128",
            add_rms_norm_kernel,
            dict.fromkeys(("x_ptr", "r_ptr", "w_ptr", "out_ptr", "sum_ptr"), "*bf16")
            | _i32("M", "N", "stride_xm", "stride_xn", "stride_rm", "stride_rn")
            | _i32("stride_om", "stride_sm")
            | {"eps": "fp32"},
            {"BLOCK_M": 32, "BLOCK_N": 128},
            4,
            3,
        ),
    ]
    for result in results:
        result["fits"] = result["shared"] <= SHARED_MEMORY_LIMIT
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
