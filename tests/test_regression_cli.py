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
TOO_FEW = "too few steps to judge (n=3; need ≥ 4)"


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
    data = json.loads(result.stdout)
    assert "step" in data["regressed"] and "cpu" in data["regressed"]
    step = next(m for m in data["metrics"] if m["metric"] == "step")
    # 3 + 3 steps: too few to judge the noise, so it failed on every step pair being slower.
    assert data["too_few_steps"] == TOO_FEW
    assert TOO_FEW in step["decided_by"] and step["significant"] is None
    assert step["pairs_low"] > 0.05
    assert f"traceq check: {TOO_FEW}: failed on" in result.stderr


def test_three_steps_slower_on_every_pair_fail_with_the_label(eager_baseline: Path) -> None:
    result = run("check", COMPILED, "--baseline", eager_baseline, "--metric", "step")
    assert result.exit_code == 1, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("step time"))
    assert f"regressed on every step pair; {TOO_FEW}" in row


def with_steps(baseline: Path, out: Path, wall_ns: list[int]) -> Path:
    """A copy of `baseline` whose steps took `wall_ns` (and as long in CPU op time), with
    no groups: the step times are what is compared."""
    document = json.loads(baseline.read_text())
    document["steps"] = {
        "ids": list(range(2, 2 + len(wall_ns))),
        "wall_ns": wall_ns,
        "time_ns": wall_ns,
    }
    document["groups"] = {dim: {} for dim in document["groups"]}
    out.write_text(json.dumps(document))
    return out


def test_three_steps_with_a_small_slowdown_pass_and_say_too_few_to_judge(
    tmp_path: Path, eager_baseline: Path
) -> None:
    """+7.8 % in the mean and an interval above zero, but the fastest new step is within
    2 % of the slowest base step: three steps cannot tell that from jitter."""
    base = with_steps(eager_baseline, tmp_path / "base.json", [100_000, 103_000, 106_000])
    new = with_steps(eager_baseline, tmp_path / "new.json", [108_000, 111_000, 114_000])
    args = ("check", new, "--baseline", base, "--metric", "step")
    text = run(*args)
    assert text.exit_code == 0, text.output
    assert f"PASS: {TOO_FEW}" in text.stdout and "regressed" not in text.stdout
    assert f"traceq check: {TOO_FEW}: passed" in text.stderr
    markdown = run(*args, "--format", "markdown")
    assert markdown.exit_code == 0 and f"| {TOO_FEW} |" in markdown.stdout
    data = json.loads(run(*args, "--format", "json").stdout)
    (step,) = data["metrics"]
    assert data["failed"] is False and data["too_few_steps"] == TOO_FEW
    assert step["verdict"] == "too few steps" and step["significant"] is None


def test_diff_with_three_steps_says_too_few_to_judge_in_every_format(
    tmp_path: Path, eager_baseline: Path
) -> None:
    base = with_steps(eager_baseline, tmp_path / "base.json", [100_000, 103_000, 106_000])
    new = with_steps(eager_baseline, tmp_path / "new.json", [108_000, 111_000, 114_000])
    text = run("diff", base, new, "--no-findings")
    assert text.exit_code == 0, text.output
    assert "outside noise" not in text.stdout and TOO_FEW in text.stdout
    markdown = run("diff", base, new, "--no-findings", "--format", "markdown").stdout
    assert "outside noise" not in markdown and f"| {TOO_FEW} |" in markdown
    data = json.loads(run("diff", base, new, "--no-findings", "--format", "json").stdout)
    step = data["totals"][0]
    assert step["verdict"] == TOO_FEW and step["significant"] is None
    assert step["too_few_steps"] is True and any(TOO_FEW in n for n in data["notes"])


def test_four_steps_a_side_are_judged_on_the_noise(tmp_path: Path, eager_baseline: Path) -> None:
    """Enough steps for the U test: a significant +7 % regresses, every pair or not."""
    base = with_steps(eager_baseline, tmp_path / "base.json", [100_000, 101_000, 102_000, 103_000])
    new = with_steps(eager_baseline, tmp_path / "new.json", [108_000, 109_000, 110_000, 111_000])
    result = run("check", new, "--baseline", base, "--metric", "step", "--format", "json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["regressed"] == ["step"] and data["too_few_steps"] is None
    assert data["metrics"][0]["significant"] is True and "too few" not in result.stderr
    diffed = json.loads(run("diff", base, new, "--no-findings", "--format", "json").stdout)
    assert diffed["totals"][0]["verdict"] == "outside noise"


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
