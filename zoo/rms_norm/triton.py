"""Triton RMSNorm: each row read once, reduced in fp32, scaled by the weight, written once.

The split version writes the fp32 upcast, the square, the scaled rows and the cast back;
this is the kernel Liger's ``LigerRMSNorm`` and PyTorch's CUDA ``_fused_rms_norm`` are. A
row is one tile (``BLOCK_N = next_power_of_2(H)``), so the reduction never leaves
registers; narrow rows are packed several to a program so each moves enough bytes. It is
memory-bound: its yardstick is the device's copy bandwidth.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from traceq.zoo.ops import zoo_op
from traceq.zoo.rms_norm.reference import EPS
from traceq.zoo.triton_support import (
    check_device,
    load_tile,
    row_tile_offsets,
    rows_2d,
    store_tile,
    triton_entry,
)

#: Elements one program handles when rows are narrow: a few KiB in flight per program.
ELEMENTS_PER_PROGRAM = 4096

#: Widest row one tile holds (Liger's limit too); wider rows would need a looped reduction.
MAX_ROW = 65536


@triton.jit
def normalize_rows(x, w_ptr, cols, N, eps):
    """``x * rsqrt(mean(x²) + eps) * w`` of an fp32 tile of whole rows (``cols`` all N of
    them; masked-off columns hold zeros, which leave the sum of squares alone)."""
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    return x * rstd[:, None] * w[None, :]


@triton.jit
def rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_om,
    stride_on,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, cols, mask = row_tile_offsets(M, N, BLOCK_M, BLOCK_N)
    x = load_tile(x_ptr, rows, cols, mask, stride_xm, stride_xn)
    y = normalize_rows(x, w_ptr, cols, N, eps)
    store_tile(out_ptr, y, rows, cols, M, N, stride_om, stride_on)


def launch_shape(m: int, n: int) -> tuple[int, int, int]:
    """BLOCK_M, BLOCK_N and num_warps for [m, n] rows: one row per tile, narrow rows packed."""
    if n > MAX_ROW:
        raise ValueError(f"rows of {n} elements are wider than one tile ({MAX_ROW})")
    block_n = triton.next_power_of_2(max(n, 1))
    block_m = min(triton.next_power_of_2(max(m, 1)), max(1, ELEMENTS_PER_PROGRAM // block_n))
    num_warps = max(4, min(16, block_m * block_n // 1024))
    return block_m, block_n, num_warps


def launch_rows(kernel: triton.JITFunction, args: tuple[Any, ...], m: int, n: int) -> None:
    """Launch a whole-row kernel over [m, n] rows in ``launch_shape``'s tiles; with no
    elements there is nothing to launch."""
    if m == 0 or n == 0:
        return
    block_m, block_n, num_warps = launch_shape(m, n)
    kernel[(triton.cdiv(m, block_m),)](*args, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, act: str = "none", *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm of [..., H] rows with a [H] weight, eps 1e-6 (``act`` is unused)."""
    check_device(x, weight)
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"weight {tuple(weight.shape)} is not [{n}]")
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    elif out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {tuple(x.shape)} {x.dtype}")
    x2, out2 = rows_2d(x), out.view(-1, n)
    m = x2.shape[0]
    args = (x2, weight, out2, m, n, *x2.stride(), *out2.stride(), EPS)
    launch_rows(rms_norm_kernel, args, m, n)
    return out


@zoo_op(fake=lambda x, weight, act: x.new_empty(x.shape))
def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, act: str) -> torch.Tensor:
    """The Triton RMSNorm as an op the profiler and torch.compile see by name."""
    return rms_norm(x, weight, act)


ENTRY = triton_entry(
    "rms_norm",
    rms_norm_triton,
    rms_norm,
    "Triton RMSNorm: one read of each row, fp32 reduction, weight applied, one write",
)
