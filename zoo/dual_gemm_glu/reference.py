"""The split eager reference: gate GEMM, up GEMM, activation, multiply — four kernels.

The Llama/Qwen MLP's first half as ``F.silu(gate_proj(x)) * up_proj(x)`` runs it, with two
[M, N] intermediates written to memory and read back. It runs in float64 too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from traceq.zoo.activations import activate
from traceq.zoo.registry import reference_entry


def dual_gemm_glu_reference(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str
) -> torch.Tensor:
    return activate(F.linear(x, w_gate), act) * F.linear(x, w_up)


ENTRY = reference_entry(
    "dual_gemm_glu", dual_gemm_glu_reference, "split eager: x@Wg.T, x@Wu.T, act, * (four kernels)"
)
