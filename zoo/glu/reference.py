"""The split eager reference: the activation on ``gate``, then a separate multiply.

Two kernels and one [M, N] intermediate written and read back: what a GeGLU / SwiGLU
written as ``F.gelu(gate) * up`` runs in eager mode. It runs in float64 too.
"""

from __future__ import annotations

import torch
from traceq.zoo.activations import activate
from traceq.zoo.registry import reference_entry


def glu_reference(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    return activate(gate, act) * up


ENTRY = reference_entry("glu", glu_reference, "split eager: act(gate), then * up")
