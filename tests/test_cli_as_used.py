"""The command line as people use it: in pipes and CI logs, with typos, with rule names.

Each test is one behaviour a user sees, on the project's own fixtures, run through click's
runner (stdout is not a terminal there, as in a pipe).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EAGER = FIXTURES / "mlp_gelu-eager.pt.trace.json.gz"  # TQ102 ×3 (warning), CPU trace
GEGLU = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"  # TQ103, TQ105, TQ204: 3 groups
TRAIN = FIXTURES / "mlp_gelu-train.pt.trace.json.gz"
JOB = FIXTURES / "jobs" / "ddp_gloo_slow2"


def invoke(*args: str | Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_tables_in_a_pipe_keep_every_column_whole() -> None:
    code, out, _ = invoke("info", JOB, "--engine", "serial", env={"COLUMNS": ""})
    assert code == 0
    header = next(line for line in out.splitlines() if "rank" in line and "offset" in line)
    for column in ("compute", "comm", "exposed", "memcpy", "idle", "offset"):
        assert column in header
    assert "…" not in out
    rows = [line for line in out.splitlines() if "distributedInfo" in line]
    assert [line.split("│")[1].strip() for line in rows] == ["0", "1", "2", "3"]


def test_fail_on_says_on_stderr_why_it_exits_1() -> None:
    code, _, err = invoke("analyze", EAGER, "--no-config", "--fail-on", "warning")
    assert code == 1
    assert "traceq: 3 findings at or above warning (TQ102 ×3): exit 1" in err


def test_top_limits_the_groups_shown() -> None:
    code, out, _ = invoke("analyze", GEGLU, "--no-config", "--top", "1")
    assert code == 0
    assert "\n1. " in out and "\n2. " not in out
    assert "more groups (--top N shows more" in out


def test_select_and_ignore_take_rule_names_as_explain_does() -> None:
    code, out, err = invoke("analyze", EAGER, "--no-config", "--select", "split-gemm-activation")
    assert code == 0, err
    assert "TQ102 split-gemm-activation" in out
    code, out, _ = invoke("analyze", EAGER, "--no-config", "--ignore", "split-gemm-activation")
    assert code == 0 and "TQ102" not in out.split("by rule")[0]


def test_a_mistyped_rule_name_gets_did_you_mean() -> None:
    code, _, err = invoke("analyze", EAGER, "--no-config", "--select", "split-gemm-activaton")
    assert code == 2
    assert "unknown rule 'split-gemm-activaton'; did you mean 'split-gemm-activation'" in err


def test_a_mistyped_command_gets_did_you_mean() -> None:
    code, _, err = invoke("analyse", EAGER)
    assert code == 2
    assert err.strip() == "traceq: error: no command 'analyse'; did you mean 'analyze'?"


def test_a_saving_comes_with_its_share_of_the_step_and_of_the_trace() -> None:
    code, out, _ = invoke("analyze", EAGER, "--no-config")
    assert code == 0
    head = next(line for line in out.splitlines() if line.startswith("1. TQ102"))
    assert re.search(
        r"saves ~[\d.]+ µs of [\d.]+ µs \([\d.]+% of the step, [\d.]+% of the trace\)", head
    )
    _, out, _ = invoke("analyze", EAGER, "--no-config", "--format", "markdown")
    assert "% of the step, " in out and "% of the trace)" in out


def test_one_finding_in_one_group_is_singular() -> None:
    code, out, _ = invoke("analyze", GEGLU, "--no-config", "--select", "TQ204")
    assert code == 0
    assert "1 finding in 1 group;" in out


def test_dtypes_read_as_bf16_fp32_not_the_profilers_spelling() -> None:
    _, out, _ = invoke("analyze", EAGER, "--no-config")
    assert "dtype fp32" in out and "dtype float" not in out
    _, out, _ = invoke("analyze", EAGER, "--no-config", "--format", "json")
    finding = json.loads(out)["findings"][0]
    assert finding["dtype"] == "float" and finding["dtype_name"] == "fp32"


def test_every_command_spells_microseconds_the_same() -> None:
    for args in (("critical-path", EAGER), ("info", EAGER), ("info", JOB, "--engine", "serial")):
        code, out, _ = invoke(*args)
        assert code == 0
        assert not re.search(r"\d us\b|\bus\b|\(us\)", out), args
        assert "µs" in out


def test_explain_prints_each_section_once() -> None:
    code, out, _ = invoke("explain", "TQ102")
    assert code == 0
    headings = [line for line in out.splitlines() if line.startswith("## ")]
    assert len(headings) == len(set(headings))
    assert "--option TQ102." in out


def test_the_critical_paths_heaviest_are_aggregated_by_name() -> None:
    code, out, _ = invoke("critical-path", EAGER)
    assert code == 0
    table = out.split("heaviest on the path")[1]
    names = [line.split("│")[2].strip() for line in table.splitlines() if line.startswith("│")]
    assert "aten::gelu" in names and len(names) == len(set(names))


def test_markdown_shows_template_kernel_names_as_text() -> None:
    from traceq.reports import markdown
    from traceq.reports.model import Report, group_findings
    from traceq.rules.finding import Finding

    finding = Finding(
        rule="TQ104", name="pointwise-chain", severity="info",
        message="kernel<float> then vectorized_elementwise_kernel<4, float>", module="m<T>",
        est_saving_us=5.0, time_us=10.0,
    )  # fmt: skip
    report = Report(
        source="t", trace={"events": 1, "duration_us": 100.0, "steps_us": 50.0},
        device={"name": "d"}, findings=[finding], groups=group_findings([finding]), rules=[],
    )  # fmt: skip
    out = markdown.render(report)
    assert "kernel&lt;float&gt;" in out and "<float>" not in out


def test_a_baseline_keeps_finding_identities_and_numbers_not_evidence(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    code, _, err = invoke("baseline", "save", GEGLU, "-o", path)
    assert code == 0, err
    findings = json.loads(path.read_text())["findings"]
    assert findings and all("identity" in f and "est_saving_us" in f for f in findings)
    assert not any({"evidence", "message", "fix", "saving_model"} & set(f) for f in findings)
    assert path.stat().st_size < 6_000  # 12.3 KB when findings were stored whole
    code, out, _ = invoke("check", GEGLU, "--baseline", path, "--fail-on-new-findings")
    assert code == 0, out


def test_an_older_baseline_with_whole_findings_still_reads(tmp_path: Path) -> None:
    from traceq.regression import baseline

    path = tmp_path / "base.json"
    invoke("baseline", "save", GEGLU, "-o", path)
    document = json.loads(path.read_text())
    _, full, _ = invoke("analyze", GEGLU, "--no-config", "--format", "json")
    document["findings"] = [
        {k: v for k, v in f.items() if k not in ("key", "counted_saving_us", "dtype_name")}
        for f in json.loads(full)["findings"]
    ]
    document[baseline.VERSION_KEY] = 2
    path.write_text(json.dumps(document))
    code, out, _ = invoke("check", GEGLU, "--baseline", path, "--fail-on-new-findings")
    assert code == 0, out
    assert "new finding" not in out


def test_diff_with_too_few_steps_says_so_instead_of_outside_noise() -> None:
    compiled = FIXTURES / "geglu_mlp-compiled.pt.trace.json.gz"
    code, out, _ = invoke("diff", GEGLU, compiled, "--no-findings")
    assert code == 0
    totals = out.split("Totals")[1].split("\n\n")[0]
    assert "outside noise" not in totals
    assert "too few steps to judge (n=3; need ≥ 4)" in totals


def test_a_job_rule_on_one_trace_says_it_needs_a_job() -> None:
    code, out, _ = invoke("analyze", EAGER, "--no-config", "--select", "TQ401")
    assert code == 0
    assert "note: TQ401 needs a job (a folder of rank traces" in out
    assert "No findings" not in out


def test_check_fixes_without_a_gpu_says_what_it_proved_and_records_quietly() -> None:
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    args = [GEGLU, "--no-config", "--check-fixes", "--select", "TQ103"]
    result = subprocess.run(
        [sys.executable, "-c", "from traceq.cli.main import main; main()", "analyze", *args],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    check = next(line for line in result.stdout.splitlines() if "fix check:" in line)
    assert "TQ103 gone" in check and "re-profiled, TQ103 3→0 findings" in check
    assert "numbers match float64" in check and "(the finding's shape" in check
    assert "speed not measured" in check and "→ " not in check.split("findings")[1]
    assert "USDT" not in result.stderr
