"""``traceq zoo``: rendering, JSON, and exit codes 0 / 1 / 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from traceq.cli.zoo import zoo


def _invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(zoo, list(args))


def test_list_names_every_builtin_entry_with_its_availability(device: str) -> None:
    result = _invoke("list")
    assert result.exit_code == 0, result.output
    for name in ("gemm_bias_act.triton", "dual_gemm_glu.reference", "glu.liger", "mlp.compile"):
        assert name in result.output
    if device == "cpu":
        assert "Triton interpreter:" in result.output  # the cell may wrap after the colon


def test_list_json_is_one_document() -> None:
    payload = json.loads(_invoke("list", "--format", "json").output)
    names = {e["name"]: e for e in payload["entries"]}
    assert names["gemm_bias_act.triton"]["supports_out"] is True
    addmm = names["gemm_bias_act.addmm_activation"]
    assert addmm["activations_on"]["cpu"] == ["gelu", "relu", "none"]
    assert payload["problems"] == []


def test_check_prints_numerics_and_timings_and_exits_0(device: str) -> None:
    result = _invoke(
        "check",
        "gemm_bias_act",
        "--shape",
        "64,128,96",
        "--act",
        "relu",
        "--device",
        device,
        "--entry",
        "reference",
        "--entry",
        "triton",
        "--entry",
        "cublaslt-epilogue",
    )
    assert result.exit_code == 0, result.output
    assert "gemm_bias_act.triton" in result.output and "pass" in result.output
    assert "timings (main case)" in result.output
    assert ("torch.utils.benchmark" if device == "cpu" else "do_bench") in result.output


def test_check_json_reports_every_case(device: str) -> None:
    result = _invoke(
        "check",
        "dual_gemm_glu",
        "--shape",
        "64,128,96",
        "--act",
        "gelu_tanh",
        "--dtype",
        "bf16",
        "--device",
        device,
        "--entry",
        "triton",
        "--no-timing",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["dtype"] == "bfloat16" and report["bound"] == 1.5e-2
    triton = next(e for e in report["entries"] if e["entry"] == "dual_gemm_glu.triton")
    assert [c["shape"] for c in triton["cases"]] == ["64×128→96", "47×95→71", "2×33×128→96"]
    assert all(c["passed"] for c in triton["cases"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "glu", "--shape", "64,128"], "shape must be M,K,N"),
        (["check", "conv", "--shape", "1,2,3"], "unknown pattern 'conv'"),
        (["check", "glu", "--shape", "8,8,8", "--dtype", "int8"], "unknown dtype 'int8'"),
        (["check", "glu", "--shape", "8,8,8", "--act", "tanh"], "unknown activation 'tanh'"),
        (["check", "glu", "--shape", "8,8,8", "--entry", "fast"], "no zoo entry or impl named"),
    ],
)
def test_bad_usage_exits_2_with_one_line_and_no_traceback(args: list[str], message: str) -> None:
    result = _invoke(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceq: error: "), lines
    assert message in result.stderr
    assert "Traceback" not in result.output
