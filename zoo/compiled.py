"""``torch.compile`` of a pattern's split reference: what Inductor makes of it unaided.

On CUDA Inductor emits Triton kernels (and calls cuBLAS for the GEMMs); on the CPU it emits
C++ with OpenMP, which needs a C++ compiler and takes seconds per graph to build. Inputs
are flattened to 2-D rows before the compiled call, so a 3-D input reuses the 2-D graph
instead of compiling another one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from traceq.zoo.registry import Entry

#: Positional inputs of each pattern that carry rows (leading dims) rather than weights.
ROW_ARGUMENTS: dict[str, tuple[int, ...]] = {
    "gemm_bias_act": (0,),
    "glu": (0, 1),
    "dual_gemm_glu": (0,),
    "mlp": (0,),
    "rms_norm": (0,),
    "add_rms_norm": (0, 1),
    "rope": (),  # [B, heads, S, head_dim]: the layout is the problem, nothing to flatten
}


def requires_compiler(device: str) -> str | None:
    """Why Inductor cannot build kernels for ``device`` here, or None."""
    if device == "cpu":
        compilers = [os.environ.get("CXX", ""), "g++", "clang++", "c++"]
        if not any(c and shutil.which(c) for c in compilers):
            return "torch.compile on CPU needs a C++ compiler (g++ or clang++)"
    return None


class CompiledReference:
    """A reference function compiled on first call, called with rows flattened to 2-D."""

    def __init__(self, pattern: str, reference: Callable[..., torch.Tensor]) -> None:
        self.pattern = pattern
        self.reference = reference
        self.row_arguments = ROW_ARGUMENTS[pattern]
        self._compiled: Callable[..., torch.Tensor] | None = None

    @property
    def compiled(self) -> Callable[..., torch.Tensor]:
        if self._compiled is None:
            self._compiled = torch.compile(self.reference)
        return self._compiled

    def __call__(self, *args: Any) -> Any:
        if not self.row_arguments:
            return self.compiled(*args)
        first = args[self.row_arguments[0]]
        rows = first.shape[:-1]
        flat = list(args)
        for i in self.row_arguments:
            flat[i] = args[i].reshape(-1, args[i].shape[-1])
        out = self.compiled(*flat)
        if isinstance(out, tuple):  # several outputs (add_rms_norm): each has the rows
            return tuple(o.reshape(*rows, o.shape[-1]) for o in out)
        return out.reshape(*rows, out.shape[-1])


def compiled_entry(reference: Entry) -> Entry:
    """The ``torch.compile`` entry of a pattern, built from its reference entry."""
    return Entry(
        name=f"{reference.pattern}.compile",
        pattern=reference.pattern,
        impl="compile",
        fn=CompiledReference(reference.pattern, reference.fn),
        activations=reference.activations,
        dtypes=tuple(d for d in reference.dtypes if d != "float64"),
        devices=("cpu", "cuda"),
        requires=requires_compiler,
        notes_on={"cpu": "Inductor C++ (compiles on first call, seconds per graph)"},
        description=f"torch.compile of the split reference ({reference.description})",
    )
