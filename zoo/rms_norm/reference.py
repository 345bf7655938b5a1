"""The split eager reference: RMSNorm exactly as HF's ``LlamaRMSNorm`` writes it.

Upcast to fp32, ``pow(2)``, ``mean(-1, keepdim=True)``, ``+ eps``, ``rsqrt``, ``*``, the cast
back, ``weight *``: six to eight kernels over the [rows, H] activations, each writing a full
intermediate that the next reads back. It is what TQ107 finds, and its ops are the ones a
model with a hand-written RMSNorm runs. Float64 inputs stay float64 (the harness's ground
truth); every other dtype is upcast to fp32 as HF does.
"""

from __future__ import annotations

import torch
from traceq.zoo.registry import reference_entry

#: The norm's epsilon: HF Llama's and Qwen2's ``rms_norm_eps`` default.
EPS = 1e-6


def rms_norm_reference(hidden_states: torch.Tensor, weight: torch.Tensor, act: str) -> torch.Tensor:
    """HF's ``LlamaRMSNorm.forward`` (``act`` is unused: RMSNorm has none)."""
    input_dtype = hidden_states.dtype
    upcast = torch.float64 if input_dtype == torch.float64 else torch.float32
    hidden_states = hidden_states.to(upcast)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + EPS)
    return weight * hidden_states.to(input_dtype)


ENTRY = reference_entry(
    "rms_norm",
    rms_norm_reference,
    "split eager, as HF writes it: to(fp32), pow, mean, add eps, rsqrt, mul, to, mul weight",
)
