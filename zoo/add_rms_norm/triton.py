"""Triton add + RMSNorm: read x and the residual once, write their sum and its norm.

The split version writes the sum, reads it back for the norm, and then runs the norm's own
six to eight kernels. This kernel is vLLM's ``fused_add_rms_norm`` computation (its CUDA op
updates ``residual`` in place; this one returns the sum, so inputs stay untouched): the sum
is formed in fp32, stored in the input dtype for the residual stream, and normalized from
the fp32 value. Launch shapes are the RMSNorm kernel's (`traceq.zoo.rms_norm.triton`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from traceq.zoo.rms_norm.reference import EPS
from traceq.zoo.rms_norm.triton import launch_shape
from traceq.zoo.triton_support import check_device, rows_2d, triton_entry


@triton.jit
def add_rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_rm,
    stride_rn,
    stride_om,
    stride_sm,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = tl.arange(0, BLOCK_N).to(tl.int64)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(
        x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0
    ).to(tl.float32)
    r = tl.load(
        r_ptr + rows[:, None] * stride_rm + cols[None, :] * stride_rn, mask=mask, other=0.0
    ).to(tl.float32)
    h = x + r
    tl.store(
        sum_ptr + rows[:, None] * stride_sm + cols[None, :],
        h.to(sum_ptr.dtype.element_ty),
        mask=mask,
    )
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=1) / N + eps)
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        (h * rstd[:, None] * w[None, :]).to(out_ptr.dtype.element_ty),
        mask=mask,
    )


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    act: str = "none",
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` for [..., H] rows, eps 1e-6."""
    check_device(x, residual, weight)
    n = x.shape[-1]
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} is not x's")
    if weight.shape != (n,):
        raise ValueError(f"weight {tuple(weight.shape)} is not [{n}]")
    if out is None:
        out = (
            torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device),
        )
    normed, total = out
    for buffer in (normed, total):
        if buffer.shape != x.shape or buffer.dtype != x.dtype or not buffer.is_contiguous():
            raise ValueError(f"out must be two contiguous {tuple(x.shape)} {x.dtype} tensors")
    x2, r2 = rows_2d(x), rows_2d(residual)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return normed, total
    block_m, block_n, num_warps = launch_shape(m, n)
    add_rms_norm_kernel[(triton.cdiv(m, block_m),)](
        x2,
        r2,
        weight,
        normed,
        total,
        m,
        n,
        x2.stride(0),
        x2.stride(1),
        r2.stride(0),
        r2.stride(1),
        n,
        n,
        EPS,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
    )
    return normed, total


@torch.library.custom_op("zoo::add_rms_norm_triton", mutates_args=())
def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, act: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton add + RMSNorm as an op the profiler and torch.compile see by name."""
    return add_rms_norm(x, residual, weight, act)


@add_rms_norm_triton.register_fake
def _(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, act: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
    )


ENTRY = triton_entry(
    "add_rms_norm",
    add_rms_norm_triton,
    add_rms_norm,
    "Triton add + RMSNorm: x and the residual read once, the sum and its norm written once",
)
