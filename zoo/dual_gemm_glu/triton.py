"""Triton ``act(x @ Wg.T) * (x @ Wu.T)``: both GEMMs and the GLU in one kernel.

Each program loads an x tile once per K-step and multiplies it by the matching gate and up
weight tiles into two fp32 accumulators; the epilogue applies ``act(gate) * up`` and stores
one [BLOCK_M, BLOCK_N] tile. The two [M, N] intermediates of the split version (and the
second read of x) never reach memory: the kernel the TQ103 + TQ105 findings point at, and
one that neither Inductor nor Liger generates for this MLP.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from traceq.zoo.ops import zoo_op
from traceq.zoo.triton_support import (
    INTERPRETED,
    activate,
    check_device,
    dot_precision,
    grouped_tile_offsets,
    launch_gemm,
    rows_2d,
    store_tile,
    triton_entry,
)


@triton.jit
def dual_gemm_glu_kernel(
    x_ptr,
    wg_ptr,
    wu_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wgn,
    stride_wgk,
    stride_wun,
    stride_wuk,
    stride_ym,
    stride_yn,
    ACT: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    offs_m, offs_n, offs_k = grouped_tile_offsets(M, N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    wg_ptrs = wg_ptr + offs_k[:, None] * stride_wgk + offs_n[None, :] * stride_wgn
    wu_ptrs = wu_ptr + offs_k[:, None] * stride_wuk + offs_n[None, :] * stride_wun

    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_step in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        k_left = K - k_step * BLOCK_K  # not loop-carried: K may be specialized to a constant
        w_mask = (offs_k[:, None] < k_left) & (offs_n[None, :] < N)
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        wg = tl.load(wg_ptrs, mask=w_mask, other=0.0)
        wu = tl.load(wu_ptrs, mask=w_mask, other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            wg = wg.to(tl.float32)
            wu = wu.to(tl.float32)
        acc_gate = tl.dot(x, wg, acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(x, wu, acc_up, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        wg_ptrs += BLOCK_K * stride_wgk
        wu_ptrs += BLOCK_K * stride_wuk

    y = activate(acc_gate, ACT) * acc_up
    store_tile(y_ptr, y, offs_m, offs_n, M, N, stride_ym, stride_yn)


def dual_gemm_glu(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    act: str,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(x @ w_gate.T) * (x @ w_up.T)`` in one kernel; x [..., K], weights [N, K]."""
    check_device(x, w_gate, w_up)
    if w_gate.shape != w_up.shape:
        raise ValueError(f"w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} differ")
    n, k = w_gate.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weights expect {k}")
    shape = (*x.shape[:-1], n)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {shape} {x.dtype}")
    x2, y2 = rows_2d(x), out.view(-1, n)
    m = x2.shape[0]
    if m == 0:
        return out
    args = (
        x2,
        w_gate,
        w_up,
        y2,
        m,
        n,
        k,
        x2.stride(0),
        x2.stride(1),
        w_gate.stride(0),
        w_gate.stride(1),
        w_up.stride(0),
        w_up.stride(1),
        y2.stride(0),
        y2.stride(1),
    )
    flags = {"ACT": act, "UPCAST": INTERPRETED, "PRECISION": dot_precision(x.dtype)}
    launch_gemm(dual_gemm_glu_kernel, "dual_gemm", args, flags, m, n, k)
    return out


@zoo_op(fake=lambda x, w_gate, w_up, act: x.new_empty((*x.shape[:-1], w_gate.shape[0])))
def dual_gemm_glu_triton(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str
) -> torch.Tensor:
    """The Triton dual-GEMM GLU as an op the profiler and torch.compile see by name."""
    return dual_gemm_glu(x, w_gate, w_up, act)


ENTRY = triton_entry(
    "dual_gemm_glu",
    dual_gemm_glu_triton,
    dual_gemm_glu,
    "Triton: gate and up tiles from one read of x, GLU in the epilogue",
)
