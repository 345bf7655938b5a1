"""Triton ``act(x @ W.T + b)``: a tiled GEMM whose epilogue adds the bias and applies the
activation on the fp32 accumulator, then stores once.

The split version writes the [M, N] GEMM result, reads it back for the bias/activation
kernel and writes it again; here the tile goes from registers to memory exactly once, which
is the fix the TQ101/TQ102 findings ask for. Program ids are grouped along M (the Triton
matmul tutorial's L2 swizzle) so neighbouring programs share weight tiles.
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
def gemm_bias_act_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_ym,
    stride_yn,
    HAS_BIAS: tl.constexpr,
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
    # W is [N, K] (nn.Linear layout): load its tile transposed, as [BLOCK_K, BLOCK_N].
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_step in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        k_left = K - k_step * BLOCK_K  # not loop-carried: K may be specialized to a constant
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        w = tl.load(w_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc += bias[None, :]
    store_tile(y_ptr, activate(acc, ACT), offs_m, offs_n, M, N, stride_ym, stride_yn)


def _output(x: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
    shape = (*x.shape[:-1], n)
    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    if tuple(out.shape) != shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must be {shape} {x.dtype} on {x.device}, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    return out


def gemm_bias_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(x @ weight.T + bias)`` in one kernel; x is [..., K], weight [N, K], bias [N]."""
    check_device(x, weight)
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, weight expects {k}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be [{n}], got {tuple(bias.shape)}")
    y = _output(x, n, out)
    x2 = rows_2d(x)
    y2 = y.view(-1, n)
    m = x2.shape[0]
    if m == 0:
        return y
    args = (
        x2,
        weight,
        bias if bias is not None else x2,
        y2,
        m,
        n,
        k,
        x2.stride(0),
        x2.stride(1),
        weight.stride(0),
        weight.stride(1),
        y2.stride(0),
        y2.stride(1),
    )
    flags = {
        "HAS_BIAS": bias is not None,
        "ACT": act,
        "UPCAST": INTERPRETED,
        "PRECISION": dot_precision(x.dtype),
    }
    launch_gemm(gemm_bias_act_kernel, "gemm", args, flags, m, n, k)
    return y


@zoo_op(fake=lambda x, weight, bias, act: x.new_empty((*x.shape[:-1], weight.shape[0])))
def gemm_bias_act_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str
) -> torch.Tensor:
    """The Triton GEMM+bias+activation as an op the profiler and torch.compile see by name."""
    return gemm_bias_act(x, weight, bias, act)


ENTRY = triton_entry(
    "gemm_bias_act",
    gemm_bias_act_triton,
    gemm_bias_act,
    "Triton tiled GEMM; bias + activation on the fp32 accumulator, one store",
)
