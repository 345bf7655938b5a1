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
    acc = activate(acc, ACT)

    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(
        y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)
    )


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
    if INTERPRETED:
        block_m, block_n, block_k = tile(m), tile(n), tile(k)
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
        gemm_bias_act_kernel[grid](
            *args, **flags, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8
        )
    else:

        def grid(meta: dict[str, int]) -> tuple[int]:
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

        autotuned(gemm_bias_act_kernel, "gemm")[grid](*args, **flags)
    return y


@torch.library.custom_op("zoo::gemm_bias_act_triton", mutates_args=())
def gemm_bias_act_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str
) -> torch.Tensor:
    """The Triton GEMM+bias+activation as an op the profiler and torch.compile see by name."""
    return gemm_bias_act(x, weight, bias, act)


@gemm_bias_act_triton.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


ENTRY = Entry(
    name="gemm_bias_act.triton",
    pattern="gemm_bias_act",
    impl="triton",
    fn=gemm_bias_act_triton,
    out_fn=gemm_bias_act,
    activations=("gelu", "gelu_tanh", "relu", "silu", "none"),
    dtypes=TRITON_DTYPES,
    devices=("cpu", "cuda"),
    requires=requires_triton_device,
    notes_on=device_notes(),
    timed_on=timed_devices(),
    description="Triton tiled GEMM; bias + activation on the fp32 accumulator, one store",
)
