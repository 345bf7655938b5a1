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

from zoo.registry import Entry
from zoo.triton_support import (
    INTERPRETED,
    TRITON_DTYPES,
    activate,
    autotuned,
    check_device,
    device_notes,
    dot_precision,
    requires_triton_device,
    rows_2d,
    tile,
    timed_devices,
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
    pid = tl.program_id(0)
    # Plain integer arithmetic instead of tl.cdiv: each nested @jit call costs the
    # interpreter milliseconds per program, the compiled kernel nothing either way.
    num_pid_m = (M + BLOCK_M - 1) // BLOCK_M
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # int64 offsets: no int32 overflow on large tensors, and the interpreter skips its
    # per-operation overflow checks (which dominate its run time) for 64-bit integers.
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
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
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(
        y_ptrs, y.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)
    )


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
    if INTERPRETED:
        block_m, block_n, block_k = tile(m), tile(n), tile(k)
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
        dual_gemm_glu_kernel[grid](
            *args, **flags, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8
        )
    else:

        def grid(meta: dict[str, int]) -> tuple[int]:
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

        autotuned(dual_gemm_glu_kernel, "dual_gemm")[grid](*args, **flags)
    return out


@torch.library.custom_op("zoo::dual_gemm_glu_triton", mutates_args=())
def dual_gemm_glu_triton(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str
) -> torch.Tensor:
    """The Triton dual-GEMM GLU as an op the profiler and torch.compile see by name."""
    return dual_gemm_glu(x, w_gate, w_up, act)


@dual_gemm_glu_triton.register_fake
def _(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w_gate.shape[0]))


ENTRY = Entry(
    name="dual_gemm_glu.triton",
    pattern="dual_gemm_glu",
    impl="triton",
    fn=dual_gemm_glu_triton,
    out_fn=dual_gemm_glu,
    activations=("gelu", "gelu_tanh", "relu", "silu", "none"),
    dtypes=TRITON_DTYPES,
    devices=("cpu", "cuda"),
    requires=requires_triton_device,
    notes_on=device_notes(),
    timed_on=timed_devices(),
    description="Triton: gate and up tiles from one read of x, GLU in the epilogue",
)
