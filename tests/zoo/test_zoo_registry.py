"""Discovery through the ``traceq.zoo`` entry points, and the Entry contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from traceq.zoo.errors import EntryError, UnknownEntry, UnknownPattern
from traceq.zoo.registry import PATTERNS, Entry, Zoo, discover
from traceq.zoo.triton_support import INTERPRETER_NOTE

BUILTIN = {
    "gemm_bias_act.reference",
    "gemm_bias_act.triton",
    "gemm_bias_act.compile",
    "gemm_bias_act.addmm_activation",
    "glu.reference",
    "glu.triton",
    "glu.compile",
    "glu.liger",
    "dual_gemm_glu.reference",
    "dual_gemm_glu.triton",
    "dual_gemm_glu.compile",
    "mlp.reference",
    "mlp.triton",
    "mlp.compile",
    "rms_norm.reference",
    "rms_norm.triton",
    "rms_norm.functional",
    "rms_norm.compile",
    "add_rms_norm.reference",
    "add_rms_norm.triton",
    "add_rms_norm.compile",
    "rope.reference",
    "rope.triton",
    "rope.compile",
}


def _identity_glu(gate, up, act):  # type: ignore[no-untyped-def]
    return gate * up


def test_discovery_finds_the_whole_builtin_zoo(builtin_zoo: Zoo) -> None:
    assert {e.name for e in builtin_zoo.entries} == BUILTIN
    for pattern in PATTERNS:
        assert builtin_zoo.reference(pattern).name == f"{pattern}.reference"


def test_every_builtin_fused_entry_is_a_zoo_custom_op(builtin_zoo: Zoo) -> None:
    for entry in builtin_zoo.entries:
        if entry.impl in ("triton", "liger"):
            op_name = str(entry.fn._qualname)  # CustomOpDef keeps "zoo::<name>"
            assert op_name.startswith("zoo::"), entry.name


def test_triton_on_cpu_is_available_but_correctness_only(builtin_zoo: Zoo, device: str) -> None:
    if device != "cpu":
        pytest.skip("Triton runs compiled on this GPU machine, not interpreted")
    entry = builtin_zoo.get("gemm_bias_act.triton")
    assert entry.available("cpu") == (True, INTERPRETER_NOTE)
    assert "cpu" not in entry.timed_on


def test_liger_says_why_it_cannot_run() -> None:
    pytest.importorskip("torch")
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("liger-kernel is installed here")
    entry = discover().get("glu.liger")
    ok, reason = entry.available()
    assert not ok and reason.startswith("liger-kernel not installed")


def test_addmm_activation_means_erf_gelu_on_cpu_and_tanh_gelu_on_cuda(builtin_zoo: Zoo) -> None:
    entry = builtin_zoo.get("gemm_bias_act.addmm_activation")
    assert entry.activations_for("cpu") == ("gelu", "relu", "none")
    assert entry.activations_for("cuda") == ("gelu_tanh", "relu", "none")
    assert "not fused" in entry.available("cpu")[1]


def test_entry_rejects_unknown_pattern_activation_and_dtype() -> None:
    with pytest.raises(EntryError, match="pattern 'conv'"):
        Entry("x", "conv", "t", _identity_glu, ("none",), ("float32",), ("cpu",), "")
    with pytest.raises(EntryError, match="unknown activations"):
        Entry("x", "glu", "t", _identity_glu, ("tanh",), ("float32",), ("cpu",), "")
    with pytest.raises(EntryError, match="unknown dtypes"):
        Entry("x", "glu", "t", _identity_glu, ("none",), ("int8",), ("cpu",), "")


def test_supports_explains_a_mismatch() -> None:
    entry = Entry("x", "glu", "t", _identity_glu, ("none",), ("float32",), ("cpu",), "")
    assert entry.supports("none", "float32", "cpu") == (True, "")
    assert entry.supports("silu", "float32", "cpu")[1].startswith("activation silu")
    assert entry.supports("none", "bfloat16", "cpu")[1].startswith("dtype bfloat16")
    assert entry.supports("none", "float32", "cuda")[1] == "runs on cpu, not cuda"


def test_lookup_errors_are_usage_errors(builtin_zoo: Zoo) -> None:
    with pytest.raises(UnknownEntry, match="nope"):
        builtin_zoo.get("nope")
    with pytest.raises(UnknownPattern):
        builtin_zoo.for_pattern("conv")


def test_registry_and_cli_import_without_torch() -> None:
    code = (
        "import sys; import traceq.zoo.registry, traceq.cli.zoo; "
        "sys.exit(1 if {'torch', 'triton'} & set(sys.modules) else 0)"
    )
    repo = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=repo).returncode == 0
