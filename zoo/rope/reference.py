"""The split eager reference: HF's ``apply_rotary_pos_emb``, exactly as Llama writes it.

``rotate_half`` slices the head dim in two and concatenates ``(-x2, x1)`` (a ``neg`` and a
``cat``), then two ``mul``s and an ``add``: five kernels per tensor, ten for q and k, four
full intermediates each. It is what TQ108 finds.
"""

from __future__ import annotations

import torch
from traceq.zoo.registry import reference_entry


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's rotary embedding of q and k [B, heads, S, D] with cos and sin [B, S, D]."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def rope_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, act: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The zoo's calling convention for ``apply_rotary_pos_emb`` (``act`` is unused)."""
    return apply_rotary_pos_emb(q, k, cos, sin)


ENTRY = reference_entry(
    "rope",
    rope_reference,
    "split eager, as HF writes it: q * cos + rotate_half(q) * sin (neg, cat, mul, mul, add), "
    "the same for k",
)
