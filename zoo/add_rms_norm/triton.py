"""Triton add + RMSNorm: read x and the residual once, write their sum and its norm.

The split version writes the sum, reads it back for the norm, and then runs the norm's own
six to eight kernels. This kernel is vLLM's ``fused_add_rms_norm`` computation (its CUDA op
updates ``residual`` in place; this one returns the sum, so inputs stay untouched): the sum
is formed in fp32, stored in the input dtype for the residual stream, and normalized from
the fp32 value. The normalisation and the launch shapes are the RMSNorm kernel's
(`traceq.zoo.rms_norm.triton`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from traceq.zoo.ops import zoo_op
from traceq.zoo.rms_norm.reference import EPS
from traceq.zoo.rms_norm.triton import launch_rows, normalize_rows
from traceq.zoo.triton_support import (
    check_device,
    load_tile,
    row_tile_offsets,
    rows_2d,
    store_tile,
    triton_entry,
)


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
    rows, cols, mask = row_tile_offsets(M, N, BLOCK_M, BLOCK_N)
    x = load_tile(x_ptr, rows, cols, mask, stride_xm, stride_xn)
    r = load_tile(r_ptr, rows, cols, mask, stride_rm, stride_rn)
    h = x + r
    store_tile(sum_ptr, h, rows, cols, M, N, stride_sm, 1)  # both outputs are contiguous
    y = normalize_rows(h, w_ptr, cols, N, eps)
    store_tile(out_ptr, y, rows, cols, M, N, stride_om, 1)


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
    # normed and total are contiguous: n is their row stride
    args = (x2, r2, weight, normed, total, m, n, *x2.stride(), *r2.stride(), n, n, EPS)
    launch_rows(add_rms_norm_kernel, args, m, n)
    return normed, total


@zoo_op(fake=lambda x, residual, weight, act: (x.new_empty(x.shape), x.new_empty(x.shape)))
def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, act: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton add + RMSNorm as an op the profiler and torch.compile see by name."""
    return add_rms_norm(x, residual, weight, act)


ENTRY = triton_entry(
    "add_rms_norm",
    add_rms_norm_triton,
    add_rms_norm,
    "Triton add + RMSNorm: x and the residual read once, the sum and its norm written once",
)
