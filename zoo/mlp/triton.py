"""A whole MLP block in two Triton kernels, from the zoo's fused pieces.

Plain: ``gemm_bias_act`` (up, bias, activation) then ``gemm_bias_act`` with no activation
(down, bias). Gated: ``dual_gemm_glu`` (gate, up, GLU) then the down GEMM. The split
reference launches three (plain) or five (gated) kernels and writes one or three [M, N]
intermediates; here only the one hidden activation the down GEMM needs is written.
"""

from __future__ import annotations

import torch
from traceq.zoo.dual_gemm_glu.triton import dual_gemm_glu
from traceq.zoo.gemm_bias_act.triton import gemm_bias_act
from traceq.zoo.ops import zoo_op
from traceq.zoo.triton_support import triton_entry


def mlp(
    x: torch.Tensor,
    w_gate: torch.Tensor | None,
    w_up: torch.Tensor,
    b_up: torch.Tensor | None,
    w_down: torch.Tensor,
    b_down: torch.Tensor | None,
    act: str,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MLP block; ``w_gate`` None is Linear->act->Linear, given it is the GLU MLP."""
    if w_gate is None:
        hidden = gemm_bias_act(x, w_up, b_up, act)
    else:
        if b_up is not None:
            raise ValueError("the gated MLP is bias-free: b_up must be None when w_gate is given")
        hidden = dual_gemm_glu(x, w_gate, w_up, act)
    return gemm_bias_act(hidden, w_down, b_down, "none", out=out)


@zoo_op(
    fake=lambda x, w_gate, w_up, b_up, w_down, b_down, act: x.new_empty(
        (*x.shape[:-1], w_down.shape[0])
    )
)
def mlp_triton(
    x: torch.Tensor,
    w_gate: torch.Tensor | None,
    w_up: torch.Tensor,
    b_up: torch.Tensor | None,
    w_down: torch.Tensor,
    b_down: torch.Tensor | None,
    act: str,
) -> torch.Tensor:
    """The two-kernel Triton MLP as an op the profiler and torch.compile see by name."""
    return mlp(x, w_gate, w_up, b_up, w_down, b_down, act)


ENTRY = triton_entry(
    "mlp",
    mlp_triton,
    mlp,
    "two Triton kernels: gemm_bias_act or dual_gemm_glu, then the down GEMM",
)
