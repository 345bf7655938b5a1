"""The split eager reference of a whole MLP block, as ``nn.Linear`` modules run it.

Plain: ``F.linear`` (up, with bias), activation, ``F.linear`` (down). Gated (``w_gate``
given): gate and up GEMMs, activation, multiply, down GEMM. It runs in float64 too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from traceq.zoo.activations import activate
from traceq.zoo.registry import reference_entry


def mlp_reference(
    x: torch.Tensor,
    w_gate: torch.Tensor | None,
    w_up: torch.Tensor,
    b_up: torch.Tensor | None,
    w_down: torch.Tensor,
    b_down: torch.Tensor | None,
    act: str,
) -> torch.Tensor:
    if w_gate is None:
        hidden = activate(F.linear(x, w_up, b_up), act)
    else:
        hidden = activate(F.linear(x, w_gate), act) * F.linear(x, w_up, b_up)
    return F.linear(hidden, w_down, b_down)


ENTRY = reference_entry(
    "mlp", mlp_reference, "split eager: Linear, act (and * up when gated), Linear"
)
