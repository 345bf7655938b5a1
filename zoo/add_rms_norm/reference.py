"""The split eager reference: the residual ``add`` as its own kernel, then HF's RMSNorm.

What a decoder layer runs between sublayers (``hidden_states = residual + hidden_states``,
then ``post_attention_layernorm``): the add writes the sum, the norm reads it straight
back. Returns ``(normed, sum)`` as vLLM's ``fused_add_rms_norm`` leaves them (the sum is the
residual stream the next sublayer adds to).
"""

from __future__ import annotations

import torch
from traceq.zoo.registry import reference_entry
from traceq.zoo.rms_norm.reference import rms_norm_reference


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, act: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual``, then HF's RMSNorm of ``h``: ``(rms_norm(h), h)``."""
    hidden_states = x + residual
    return rms_norm_reference(hidden_states, weight, act), hidden_states


ENTRY = reference_entry(
    "add_rms_norm",
    add_rms_norm_reference,
    "split eager: the residual add, then HF's written-out RMSNorm of the sum",
)
