"""Liger-Kernel's GEGLU / SwiGLU forward kernels, when ``liger-kernel`` is installed.

Liger's ``LigerGELUMulFunction`` computes ``gelu_tanh(a) * b`` and ``LigerSiLUMulFunction``
``silu(a) * b``, one row per program, on contiguous inputs (it copies strided ones). Its
GELU calls libdevice ``tanh``, so it needs a real GPU: the Triton interpreter cannot run it.
Wrapped as the custom op ``zoo::glu_liger`` so it shows by name in traces.
"""

from __future__ import annotations

import importlib.util

import torch
from traceq.zoo.ops import zoo_op
from traceq.zoo.registry import Entry


def requires_liger(device: str) -> str | None:
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not installed (pip install liger-kernel)"
    return None


@zoo_op(fake=lambda gate, up, act: gate.new_empty(gate.shape))
def glu_liger(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """Liger's GLU forward; ``act`` is gelu_tanh (GEGLU) or silu (SwiGLU)."""
    if act == "gelu_tanh":
        from liger_kernel.ops.geglu import LigerGELUMulFunction

        return LigerGELUMulFunction.apply(gate, up)
    if act == "silu":
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        return LigerSiLUMulFunction.apply(gate, up)
    raise ValueError(f"Liger has no GLU kernel for {act}")


ENTRY = Entry(
    name="glu.liger",
    pattern="glu",
    impl="liger",
    fn=glu_liger,
    activations=("gelu_tanh", "silu"),
    dtypes=("float32", "float16", "bfloat16"),
    devices=("cuda",),
    requires=requires_liger,
    description="Liger-Kernel LigerGELUMulFunction / LigerSiLUMulFunction (forward)",
)
