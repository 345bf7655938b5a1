"""What only a GPU can show: compiled Triton at model sizes, do_bench timings against the
device peak, cuBLASLt's epilogue, Liger, and kernels by name in a CUDA trace.

Skipped with a reason on machines without CUDA (this project's CI). On a GPU machine the
rest of tests/zoo also runs on ``cuda`` with the Triton kernels compiled (see conftest).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from traceq.zoo.check import check
from traceq.zoo.record import record_trace
from traceq.zoo.registry import Zoo

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)

#: Big enough for tensor cores and several waves of programs, small enough for seconds.
SHAPE = (2048, 768, 1536)
FUSED = {"reference", "triton", "cublaslt-epilogue", "liger"}


@pytest.mark.parametrize(
    ("pattern", "act"),
    [("gemm_bias_act", "gelu_tanh"), ("glu", "silu"), ("dual_gemm_glu", "silu"), ("mlp", "gelu")],
)
def test_compiled_triton_matches_float64_in_bf16_and_is_timed(
    builtin_zoo: Zoo, device: str, pattern: str, act: str
) -> None:
    if device != "cuda":
        pytest.skip("TRITON_INTERPRET=1 is set: the Triton kernels are not compiled")
    report = check(pattern, SHAPE, "bfloat16", "cuda", act, zoo=builtin_zoo, select=FUSED)
    assert report.passed, [(e.entry, [(c.case, c.error) for c in e.cases]) for e in report.failures]
    triton = report.entry(f"{pattern}.triton")
    assert triton.status == "pass" and triton.note == ""
    timed = triton.timed_cases
    assert timed and all(c.timing is not None for c in timed)
    timing = timed[0].timing
    assert timing is not None and timing.method == "do_bench median" and timing.median_ms > 0
    assert timed[0].speedup is not None
    if report.peak is not None and report.peak.gbps:
        assert timing.peak_gbps_fraction is not None and 0 < timing.peak_gbps_fraction < 1.5


def test_addmm_activation_is_the_tanh_gelu_epilogue_on_cuda(builtin_zoo: Zoo) -> None:
    report = check(
        "gemm_bias_act",
        SHAPE,
        "bfloat16",
        "cuda",
        "gelu_tanh",
        zoo=builtin_zoo,
        select={"cublaslt-epilogue"},
        timing=False,
    )
    assert report.entry("gemm_bias_act.addmm_activation").status == "pass"


def test_liger_glu_when_installed(builtin_zoo: Zoo) -> None:
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed")
    report = check(
        "glu",
        SHAPE,
        "bfloat16",
        "cuda",
        "gelu_tanh",
        zoo=builtin_zoo,
        select={"liger"},
        timing=False,
    )
    assert report.entry("glu.liger").status == "pass"


def test_cuda_trace_has_the_fused_kernel_under_the_custom_op(
    builtin_zoo: Zoo, device: str, tmp_path: Path
) -> None:
    if device != "cuda":
        pytest.skip("TRITON_INTERPRET=1 is set: the Triton kernels are not compiled")
    path = tmp_path / "fused.json"
    record_trace(
        "gemm_bias_act",
        "gemm_bias_act.triton",
        SHAPE,
        "bfloat16",
        "cuda",
        "gelu",
        path,
        steps=2,
        zoo=builtin_zoo,
    )
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e["name"] for e in events if e.get("cat") == "kernel"]
    assert sum("gemm_bias_act_kernel" in k for k in kernels) == 2
    assert sum(e["name"] == "zoo::gemm_bias_act_triton" for e in events) == 2
