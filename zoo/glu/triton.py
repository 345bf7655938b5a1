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
from traceq.zoo.ops import zoo_op
from traceq.zoo.triton_support import (
    INTERPRETED,
    activate,
    check_device,
    load_tile,
    row_tile_offsets,
    rows_2d,
    store_tile,
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
    offs_m, offs_n, mask = row_tile_offsets(M, N, BLOCK_M, BLOCK_N)
    gate = load_tile(gate_ptr, offs_m, offs_n, mask, stride_gm, stride_gn)
    up = load_tile(up_ptr, offs_m, offs_n, mask, stride_um, stride_un)
    out = activate(gate, ACT) * up
    store_tile(out_ptr, out, offs_m, offs_n, M, N, stride_om, stride_on)


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
    args = (gate2, up2, out2, m, n, *gate2.stride(), *up2.stride(), *out2.stride())
    glu_kernel[grid](*args, ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return out


@zoo_op(fake=lambda gate, up, act: gate.new_empty(gate.shape))
def glu_triton(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """The Triton GLU as an op the profiler and torch.compile see by name."""
    return glu(gate, up, act)


ENTRY = triton_entry(
    "glu",
    glu_triton,
    glu,
    "Triton act(gate) * up in one pass; strided (chunked) halves allowed",
)
