"""The fused entries as torch custom ops: registered by name, fake-tensor correct, compilable.

Numerics are not tested here (test_zoo_check.py runs every entry through the harness);
this is the op plumbing the profiler and torch.compile depend on.
"""

from __future__ import annotations

import pytest
import torch
from traceq.zoo.dual_gemm_glu.triton import dual_gemm_glu
from traceq.zoo.gemm_bias_act.triton import gemm_bias_act
from traceq.zoo.glu.triton import glu
from traceq.zoo.registry import Zoo
from traceq.zoo.triton_support import tile


def _gemm_args(device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    args = (
        torch.randn(2, 33, 128, generator=g),
        torch.randn(96, 128, generator=g) / 128**0.5,
        torch.randn(96, generator=g),
    )
    return tuple(a.to(device) for a in args)


# Small shapes: opcheck calls each op several times, and one program is enough here.
OPS: dict[str, list[tuple[int, ...] | str | None]] = {
    "gemm_bias_act_triton": [(2, 9, 32), (24, 32), (24,), "gelu_tanh"],
    "glu_triton": [(16, 24), (16, 24), "silu"],
    "dual_gemm_glu_triton": [(16, 32), (24, 32), (24, 32), "gelu"],
    "mlp_triton": [(16, 32), None, (24, 32), (24,), (32, 24), (32,), "relu"],
}


def _op_args(name: str, device: str) -> tuple[object, ...]:
    g = torch.Generator().manual_seed(1)
    return tuple(
        torch.randn(spec, generator=g).to(device) if isinstance(spec, tuple) else spec
        for spec in OPS[name]
    )


@pytest.mark.parametrize("name", sorted(OPS))
def test_custom_op_schema_and_fake_kernel_agree_with_the_real_one(
    builtin_zoo: Zoo, device: str, name: str
) -> None:
    op = getattr(torch.ops.zoo, name)  # registered when discovery imported the entry
    results = torch.library.opcheck(
        op, _op_args(name, device), test_utils=("test_schema", "test_faketensor")
    )
    assert set(results.values()) == {"SUCCESS"}, results


def test_custom_ops_run_under_torch_compile_fullgraph(device: str) -> None:
    x, w, b = _gemm_args(device)

    def block(x: torch.Tensor) -> torch.Tensor:
        hidden = torch.ops.zoo.gemm_bias_act_triton(x, w, b, "gelu")
        return torch.ops.zoo.glu_triton(hidden, hidden * 0.5, "silu")

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), block(x))


def test_triton_launchers_refuse_mismatched_shapes(device: str) -> None:
    x, w, b = _gemm_args(device)
    with pytest.raises(ValueError, match="expects 128"):
        gemm_bias_act(x[..., :100], w, b, "gelu")
    with pytest.raises(ValueError, match="bias must be"):
        gemm_bias_act(x, w, b[:5], "gelu")
    with pytest.raises(ValueError, match="out must be"):
        gemm_bias_act(x, w, b, "gelu", out=torch.empty(66, 96, device=device))
    with pytest.raises(ValueError, match="differ"):
        glu(torch.randn(4, 8, device=device), torch.randn(4, 9, device=device), "silu")
    with pytest.raises(ValueError, match="differ"):
        dual_gemm_glu(x, w, w[:, :64], "silu")


def test_launchers_write_into_out_and_return_it(device: str) -> None:
    x, w, b = _gemm_args(device)
    out = torch.full((2, 33, 96), float("nan"), device=device)
    assert gemm_bias_act(x, w, b, "none", out=out) is out
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b))


def test_interpreter_tiles_are_powers_of_two_between_16_and_64() -> None:
    assert [tile(d) for d in (1, 15, 17, 47, 64, 65, 3072)] == [16, 16, 32, 64, 64, 64, 64]
    assert tile(3072, cap=1024) == 1024
