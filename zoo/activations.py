"""The activations as eager PyTorch ops: what every reference and check means by a name.

Each call is its own kernel launch, which is the point: the references are the split
computation a model runs today (``F.linear`` then ``F.gelu``), kept separate on purpose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from traceq.zoo.errors import UnknownActivation
from traceq.zoo.registry import ACTIVATIONS


def validate(act: str) -> str:
    """Return ``act`` if it names a known activation, else raise `UnknownActivation`."""
    if act not in ACTIVATIONS:
        raise UnknownActivation(f"unknown activation {act!r}; known: {', '.join(ACTIVATIONS)}")
    return act


def activate(x: torch.Tensor, act: str) -> torch.Tensor:
    """Apply the activation ``act`` to ``x`` as one eager op (or none for ``none``)."""
    if act == "gelu":
        return F.gelu(x)
    if act == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if act == "relu":
        return F.relu(x)
    if act == "silu":
        return F.silu(x)
    if act == "none":
        return x
    raise UnknownActivation(f"unknown activation {act!r}; known: {', '.join(ACTIVATIONS)}")
