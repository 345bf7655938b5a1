"""``torch._addmm_activation``: cuBLASLt's bias + GELU/ReLU GEMM epilogue, from PyTorch.

On CUDA this is one cuBLASLt call with ``CUBLASLT_EPILOGUE_GELU_BIAS`` / ``RELU_BIAS``
(PyTorch falls back to a separate tanh-GELU when Lt cannot take the problem). Its GELU is
the tanh approximation there. On the CPU it is NOT fused: ATen runs addmm, then an in-place
``gelu_`` (erf) or ``relu_`` — two kernels, as the split reference, so the CPU result
checks numerics only and its time is the split's.
"""

from __future__ import annotations

import torch
from traceq.zoo.registry import DTYPES, Entry
from traceq.zoo.triton_support import rows_2d


def gemm_bias_act_addmm_activation(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str
) -> torch.Tensor:
    if bias is None:
        raise ValueError("torch._addmm_activation needs a bias (the epilogue adds it)")
    x2 = rows_2d(x)
    if act == "none":
        y = torch.addmm(bias, x2, weight.t())
    elif act in ("gelu", "gelu_tanh", "relu"):
        y = torch._addmm_activation(bias, x2, weight.t(), use_gelu=act != "relu")
    else:
        raise ValueError(f"torch._addmm_activation has no {act} epilogue")
    return y.reshape(*x.shape[:-1], weight.shape[0])


ENTRY = Entry(
    name="gemm_bias_act.addmm_activation",
    pattern="gemm_bias_act",
    impl="cublaslt-epilogue",
    fn=gemm_bias_act_addmm_activation,
    activations=("gelu_tanh", "relu", "none"),
    # Same call, different GELU: cuBLASLt's epilogue is tanh, the CPU path runs erf gelu_.
    activations_on={"cuda": ("gelu_tanh", "relu", "none"), "cpu": ("gelu", "relu", "none")},
    dtypes=DTYPES,
    devices=("cpu", "cuda"),
    notes_on={"cpu": "not fused on CPU: addmm then gelu_/relu_ (two kernels)"},
    description="torch._addmm_activation: cuBLASLt GELU/ReLU+bias epilogue on CUDA",
)
