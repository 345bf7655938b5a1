"""`traceq analyze --check-fixes` and `traceq.zoo.verify.check_fixes`: one zoo verification per
finding group, attached to the group in every output format."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

if not torch.cuda.is_available():  # before any zoo kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from traceq.cli.main import main
from traceq.zoo.verify import check_fixes

import traceq
from traceq.analyze import analyze

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MLP_GELU = str(FIXTURES / "mlp_gelu-eager.pt.trace.json.gz")


def _analyze(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["analyze", *args])


def test_check_fixes_attaches_a_gone_tq102_check_to_the_json_group() -> None:
    result = _analyze(MLP_GELU, "--check-fixes", "--format", "json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output[result.output.index("{") :])
    (group,) = payload["groups"]
    check = group["fix_check"]
    assert group["rule"] == "TQ102"
    assert check["status"] == "gone" and check["rule"] == "TQ102"
    assert check["checks"] == [{"rule": "TQ102", "split": 3, "fused": 0, "gone": True}]
    # the finding's own problem: x [32, 64] through Linear(64 -> 128), recorded unscaled
    assert check["requested_shape"] == [32, 64, 128] and check["scale"] == 1
    assert check["act"] == "gelu" and check["dtype"] == "float32"
    assert check["split"]["top_level_ops"] == {"aten::gelu": 3, "aten::linear": 3}


@pytest.mark.parametrize(("fmt", "marker"), [("text", "fix check:"), ("markdown", "fix check")])
def test_check_fixes_shows_in_text_and_markdown(fmt: str, marker: str) -> None:
    result = _analyze(MLP_GELU, "--check-fixes", "--format", fmt)
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if marker in x)
    assert "TQ102 gone with gemm_bias_act.triton" in line


def test_without_the_flag_no_fix_check_is_run() -> None:
    payload = json.loads(_analyze(MLP_GELU, "--format", "json").output)
    assert payload["groups"][0]["fix_check"] is None


def test_each_group_gets_its_own_check_and_rules_without_a_pattern_say_so() -> None:
    trace = traceq.load(FIXTURES / "geglu_mlp-eager.pt.trace.json.gz")
    findings = analyze(trace)
    results = check_fixes(findings, trace=trace)
    assert set(results) == {f.key() for f in findings}
    by_rule = {r["rule"]: r for r in results.values()}
    assert by_rule["TQ103"]["status"] == "gone" and by_rule["TQ103"]["pattern"] == "glu"
    assert by_rule["TQ105"]["status"] == "gone" and by_rule["TQ105"]["pattern"] == "dual_gemm_glu"
    assert by_rule["TQ103"]["shape"] == by_rule["TQ105"]["shape"] == [64, 64, 128]
    assert by_rule["TQ204"]["status"] == "no_zoo_pattern"
    assert by_rule["TQ204"]["summary"].startswith("no zoo pattern for TQ204")


def test_check_fixes_without_torch_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        sys.modules, "traceq.zoo.verify", None
    )  # import fails as if torch were absent
    result = _analyze(MLP_GELU, "--check-fixes")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--check-fixes needs the zoo" in lines[0]
