"""`traceq diff`, `traceq baseline save` and `traceq check` on the recorded fixtures
(CPU-only traces of the GeGLU MLP, eager and compiled; fixtures/README.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EAGER = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"
COMPILED = FIXTURES / "geglu_mlp-compiled.pt.trace.json.gz"


def run(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def eager_baseline(tmp_path: Path) -> Path:
    out = tmp_path / "eager.json"
    result = run("baseline", "save", EAGER, "-o", out, "--no-findings")
    assert result.exit_code == 0, result.output
    assert "3 steps" in result.output
    return out


def test_diff_reports_the_fusion_in_every_format() -> None:
    text = run("diff", EAGER, COMPILED, "--no-findings")
    assert text.exit_code == 0, text.output
    assert "aten::gelu + aten::mul" in text.output and "fused" in text.output
    markdown = run("diff", EAGER, COMPILED, "--format", "markdown", "--no-findings")
    assert markdown.output.startswith("## traceq diff by op")
    data = json.loads(run("diff", EAGER, COMPILED, "--format", "json", "--no-findings").output)
    assert sorted(data["fusions"][0]["parts"]) == ["aten::gelu", "aten::mul"]
    steps = traceq.load(EAGER).steps
    assert data["totals"][0]["base"] == pytest.approx(steps["dur_ns"].mean())


def test_diff_by_kernel_of_cpu_traces_is_bad_input() -> None:
    result = run("diff", EAGER, COMPILED, "--by", "kernel", "--no-findings")
    assert result.exit_code == 2
    assert result.output.startswith("traceq: error:") and "no kernels" in result.output


def test_a_trace_passes_against_its_own_baseline(eager_baseline: Path) -> None:
    result = run("check", EAGER, "--baseline", eager_baseline)
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output


def test_a_slower_trace_fails_and_is_named(eager_baseline: Path) -> None:
    """Compiled on a CPU, this tiny MLP is several times slower per step than eager."""
    result = run("check", COMPILED, "--baseline", eager_baseline, "--format", "json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert "step" in data["regressed"] and "cpu" in data["regressed"]
    step = next(m for m in data["metrics"] if m["metric"] == "step")
    # 3 + 3 steps: the U test cannot reach p < 0.05, the bootstrap interval decides.
    assert "bootstrap interval decides" in step["decided_by"]
    assert step["ci_low"] > 0.05


def test_a_full_trace_can_be_the_baseline() -> None:
    result = run("check", COMPILED, "--baseline", EAGER, "--metric", "step")
    assert result.exit_code == 1
    assert "step time" in result.output and "regressed" in result.output


def test_without_steps_the_decision_rests_on_one_sample(
    tmp_path: Path, eager_baseline: Path
) -> None:
    with gzip.open(EAGER, "rt") as f:
        document = json.load(f)
    document["traceEvents"] = [
        e for e in document["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")
    ]
    stepless = tmp_path / "stepless.json"
    stepless.write_text(json.dumps(document))
    result = run("check", stepless, "--baseline", eager_baseline, "--format", "markdown")
    assert result.exit_code in (0, 1)
    assert "whole traces (no per-step samples)" in result.output
    assert "one sample" in result.output


def test_check_options_are_validated(eager_baseline: Path) -> None:
    result = run("check", EAGER, "--baseline", eager_baseline, "--max-regress", "lots")
    assert result.exit_code == 2 and "not a ratio" in result.output
    result = run("check", EAGER, "--baseline", eager_baseline, "--metric", "kernel:x")
    assert result.exit_code == 2 and "no kernels" in result.output
