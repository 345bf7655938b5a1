"""The split eager reference: ``F.linear`` then the activation, two kernels.

This is what ``nn.Linear`` followed by ``nn.GELU`` runs today, and the baseline every other
``gemm_bias_act`` entry is checked and timed against. It runs in float64 too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from traceq.zoo.activations import activate
from traceq.zoo.registry import reference_entry


def gemm_bias_act_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str
) -> torch.Tensor:
    return activate(F.linear(x, weight, bias), act)


ENTRY = reference_entry(
    "gemm_bias_act",
    gemm_bias_act_reference,
    "split eager: F.linear, then the activation as its own op",
)
