"""Triton ``act(gate) * up`` in one pass: read both halves once, write the product once.

The split version writes ``act(gate)`` to memory and reads it back for the multiply; this
is the kernel Liger's GEGLU / SwiGLU are, made strided so the ``chunk``ed halves of one
fused gate/up projection go in without a copy. It is memory-bound: its yardstick is the
device's copy bandwidth, and tiles are sized for that (about 8K elements per program).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from traceq.zoo.triton_support import (
    INTERPRETED,
    activate,
    check_device,
    rows_2d,
    tile,
    triton_entry,
)

#: Elements one GPU program handles: enough bytes in flight per SM to saturate HBM.
ELEMENTS_PER_PROGRAM = 8192


@triton.jit
def glu_kernel(
    gate_ptr,
    up_ptr,
    out_ptr,
    M,
    N,
    stride_gm,
    stride_gn,
    stride_um,
    stride_un,
    stride_om,
    stride_on,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # int64 offsets: no overflow on large tensors, and no interpreter overflow checks.
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    gate = tl.load(
        gate_ptr + offs_m[:, None] * stride_gm + offs_n[None, :] * stride_gn, mask=mask, other=0.0
    ).to(tl.float32)
    up = tl.load(
        up_ptr + offs_m[:, None] * stride_um + offs_n[None, :] * stride_un, mask=mask, other=0.0
    ).to(tl.float32)
    out = activate(gate, ACT) * up
    tl.store(
        out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
        out.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


def glu(
    gate: torch.Tensor, up: torch.Tensor, act: str, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``act(gate) * up`` for same-shape [..., N] tensors, strided rows allowed."""
    check_device(gate, up)
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    if gate.dtype != up.dtype:
        raise ValueError(f"gate is {gate.dtype}, up is {up.dtype}")
    if out is None:
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    elif out.shape != gate.shape or out.dtype != gate.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {tuple(gate.shape)} {gate.dtype}")
    n = gate.shape[-1]
    gate2, up2, out2 = rows_2d(gate), rows_2d(up), out.view(-1, n)
    m = gate2.shape[0]
    if m == 0 or n == 0:
        return out
    if INTERPRETED:
        block_n = tile(n, cap=128, floor=1)
        block_m = tile(m, cap=64, floor=1)
        num_warps = 4
    else:
        block_n = tile(n, cap=1024, floor=16)
        block_m = tile(m, cap=max(1, ELEMENTS_PER_PROGRAM // block_n), floor=1)
        num_warps = 8 if block_m * block_n >= ELEMENTS_PER_PROGRAM else 4
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    glu_kernel[grid](
        gate2,
        up2,
        out2,
        m,
        n,
        gate2.stride(0),
        gate2.stride(1),
        up2.stride(0),
        up2.stride(1),
        out2.stride(0),
        out2.stride(1),
        ACT=act,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
    )
    return out


@torch.library.custom_op("zoo::glu_triton", mutates_args=())
def glu_triton(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """The Triton GLU as an op the profiler and torch.compile see by name."""
    return glu(gate, up, act)


@glu_triton.register_fake
def _(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    return torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)


ENTRY = triton_entry(
    "glu",
    glu_triton,
    glu,
    "Triton act(gate) * up in one pass; strided (chunked) halves allowed",
)
