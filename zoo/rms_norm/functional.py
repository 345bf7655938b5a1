"""PyTorch's own fused RMSNorm: ``F.rms_norm(x, (H,), weight, eps)`` (``nn.RMSNorm``).

On CUDA it is one ``_fused_rms_norm`` kernel (PyTorch 2.8 and later). On the CPU
``aten::_fused_rms_norm`` still runs ``pow``, ``mean``, ``add``, ``rsqrt`` and ``mul`` as
separate ops beneath it, so there it is listed as not fused: correct numbers, nothing to
prove to TQ107.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from traceq.zoo.registry import Entry
from traceq.zoo.rms_norm.reference import EPS


def rms_norm_functional(x: torch.Tensor, weight: torch.Tensor, act: str) -> torch.Tensor:
    """``F.rms_norm`` over the last dim (``act`` is unused)."""
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def requires_rms_norm(device: str) -> str | None:
    if not hasattr(F, "rms_norm"):
        return "F.rms_norm needs PyTorch 2.4 or later"
    return None


ENTRY = Entry(
    name="rms_norm.functional",
    pattern="rms_norm",
    impl="functional",
    fn=rms_norm_functional,
    activations=("none",),
    dtypes=("float32", "tf32", "float16", "bfloat16"),
    devices=("cpu", "cuda"),
    requires=requires_rms_norm,
    notes_on={"cpu": "not fused on CPU (_fused_rms_norm runs pow, mean, rsqrt, mul as ops)"},
    description="F.rms_norm(x, (H,), weight, eps): one _fused_rms_norm kernel on CUDA",
)
