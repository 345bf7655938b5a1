"""Triton RoPE: q and k rotated in one launch, cos and sin read once per token.

The split version (HF's ``apply_rotary_pos_emb``) runs ``mul``, ``neg``, ``cat``, ``mul``,
``add`` for q and again for k, writing four full intermediates per tensor. Here one program
owns one token (b, s): it loads that position's cos and sin row once, then for every head
of q and of k loads each element and its ``rotate_half`` partner and writes
``x * cos + rotate_half(x) * sin`` once. ``rotate_half`` is ``cat(-x2, x1)`` with ``x1`` the
first ``D // 2`` dims, so position j reads ``-x[j + D//2]`` below ``D - D//2`` and
``x[j - (D - D//2)]`` from there (any D, odd ones too, as HF's slicing gives). Strided q
and k (HF's ``view(B, S, H, D).transpose(1, 2)``) go in without a copy; cos and sin may
broadcast over the batch. This is the kernel Liger's ``liger_rotary_pos_emb`` is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from traceq.zoo.ops import zoo_op
from traceq.zoo.triton_support import check_device, triton_entry


@triton.jit
def rotate_heads(
    x_ptr,
    o_ptr,
    b,
    s,
    H,
    D,
    HALF,
    sx_b,
    sx_h,
    sx_s,
    sx_d,
    so_b,
    so_h,
    so_s,
    so_d,
    cos,
    sin,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Every head of one token of one tensor: ``x * cos + rotate_half(x) * sin``."""
    heads = tl.arange(0, BLOCK_H).to(tl.int64)
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    mask = (heads[:, None] < H) & (cols[None, :] < D)
    second = D - HALF  # size of x2, the half that is negated and moved first
    partner = tl.where(cols < second, cols + HALF, cols - second)
    sign = tl.where(cols < second, -1.0, 1.0)
    row = x_ptr + b * sx_b + s * sx_s + heads[:, None] * sx_h
    x = tl.load(row + cols[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    pair = tl.load(row + partner[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    out = x * cos[None, :] + (sign * sin)[None, :] * pair
    tl.store(
        o_ptr + b * so_b + s * so_s + heads[:, None] * so_h + cols[None, :] * so_d,
        out.to(o_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def rope_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    S,
    H,
    KH,
    D,
    HALF,
    sq_b,
    sq_h,
    sq_s,
    sq_d,
    sk_b,
    sk_h,
    sk_s,
    sk_d,
    sqo_b,
    sqo_h,
    sqo_s,
    sqo_d,
    sko_b,
    sko_h,
    sko_s,
    sko_d,
    sc_b,
    sc_s,
    sc_d,
    BLOCK_H: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    b = token // S
    s = token % S
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    at = b * sc_b + s * sc_s + cols * sc_d
    cos = tl.load(cos_ptr + at, mask=cols < D, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + at, mask=cols < D, other=0.0).to(tl.float32)
    rotate_heads(
        q_ptr, q_out_ptr, b, s, H, D, HALF, sq_b, sq_h, sq_s, sq_d,
        sqo_b, sqo_h, sqo_s, sqo_d, cos, sin, BLOCK_H, BLOCK_D,
    )  # fmt: skip
    rotate_heads(
        k_ptr, k_out_ptr, b, s, KH, D, HALF, sk_b, sk_h, sk_s, sk_d,
        sko_b, sko_h, sko_s, sko_d, cos, sin, BLOCK_KH, BLOCK_D,
    )  # fmt: skip


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    act: str = "none",
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``apply_rotary_pos_emb(q, k, cos, sin)``: q [B, H, S, D], k [B, KH, S, D], cos and
    sin [B or 1, S, D] (or [S, D]); returns ``(q_embed, k_embed)``."""
    check_device(q, k, cos, sin)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must be [B, heads, S, D]")
    batch, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, dim):
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)}")
    if cos.shape != sin.shape or cos.stride() != sin.stride():
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ")
    cos, sin = cos.expand(batch, seq, dim), sin.expand(batch, seq, dim)
    if out is None:
        out = (torch.empty_like(q), torch.empty_like(k))
    q_out, k_out = out
    if q_out.shape != q.shape or k_out.shape != k.shape or q_out.dtype != q.dtype:
        raise ValueError("out must be two tensors shaped like q and k")
    if q.numel() == 0:
        return q_out, k_out
    block_d = triton.next_power_of_2(dim)
    block_h = triton.next_power_of_2(heads)
    block_kh = triton.next_power_of_2(max(kv_heads, 1))
    num_warps = max(1, min(16, (block_h + block_kh) * block_d // 512))
    rope_kernel[(batch * seq,)](
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        seq,
        heads,
        kv_heads,
        dim,
        dim // 2,
        *q.stride(),
        *k.stride(),
        *q_out.stride(),
        *k_out.stride(),
        *cos.stride(),
        BLOCK_H=block_h,
        BLOCK_KH=block_kh,
        BLOCK_D=block_d,
        num_warps=triton.next_power_of_2(num_warps),
    )
    return q_out, k_out


@zoo_op(fake=lambda q, k, cos, sin, act: (torch.empty_like(q), torch.empty_like(k)))
def rope_triton(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, act: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton RoPE as an op the profiler and torch.compile see by name."""
    return rope(q, k, cos, sin, act)


ENTRY = triton_entry(
    "rope",
    rope_triton,
    rope,
    "Triton RoPE: q and k rotated in one launch, cos/sin read once per token",
)
