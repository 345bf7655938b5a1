"""`traceq analyze`, `traceq rules`, `traceq explain`: options, formats, exit status.

Exit status is the CLI's contract with CI: 0 (no finding at or above --fail-on), 1 (one
is), 2 (bad input or usage, one line on stderr). Traces are the project's own fixtures
(`fixtures/`, recorded by `fixtures/record.py`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

from traceq.rules.catalogue import RULES

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
COLD = FIXTURES / "geglu_mlp-compiled_cold.pt.trace.json.gz"  # TQ205 warning fires
EAGER = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"  # TQ204 info fires


def invoke(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def json_of(*args: str | Path) -> dict:
    code, out, err = invoke("analyze", *args, "--format", "json", "--no-config")
    assert code == 0, err
    return json.loads(out)


def test_analyze_reports_findings_and_exits_0_by_default() -> None:
    code, out, _ = invoke("analyze", COLD, "--select", "TQ205", "--no-config")
    assert code == 0
    assert "TQ205 compile-overhead" in out and "compilation inside step" in out


@pytest.mark.parametrize(("fail_on", "expected"), [("info", 1), ("warning", 1), ("error", 0)])
def test_fail_on_sets_exit_1_at_or_above_the_severity(fail_on: str, expected: int) -> None:
    code, _, _ = invoke("analyze", COLD, "--select", "TQ205", "--fail-on", fail_on, "--no-config")
    assert code == expected


def test_info_findings_fail_only_at_info() -> None:
    args = ("analyze", EAGER, "--select", "TQ204", "--no-config", "--fail-on")
    assert invoke(*args, "info")[0] == 1
    assert invoke(*args, "warning")[0] == 0


def test_select_and_ignore_accept_commas_and_repeats() -> None:
    both = json_of(EAGER, "--select", "TQ204,TQ205", "--select", "TQ3")
    third = [r.code for r in RULES if r.code.startswith("TQ3")]
    assert both["summary"]["rules_run"] == ["TQ204", "TQ205", *third]
    fewer = json_of(EAGER, "--select", "TQ2", "--ignore", "TQ201,TQ202", "--ignore", "TQ203")
    second = [r.code for r in RULES if r.code.startswith("TQ2")]
    assert fewer["summary"]["rules_run"] == [c for c in second if c >= "TQ204"]


def test_option_overrides_a_threshold() -> None:
    found = json_of(EAGER, "--select", "TQ204")
    assert found["findings"]
    share = max(f["evidence"]["share"] for f in found["findings"])
    none = json_of(EAGER, "--select", "TQ204", "--option", f"TQ204.min_share={share + 0.01:.4f}")
    assert none["findings"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--select", "TQ9"), "unknown rule code or prefix 'TQ9'"),
        (("--option", "TQ201.nope=1"), "TQ201 (launch-bound) has no option 'nope'"),
        (("--option", "TQ201"), "must look like CODE.option=value"),
        (("--option", "TQ201.window=fast"), "TQ201.window must be an integer"),
    ],
)
def test_bad_rules_and_options_are_one_line_errors_with_exit_2(args, message) -> None:
    code, out, err = invoke("analyze", EAGER, "--no-config", *args)
    assert code == 2 and out == ""
    assert err.strip() == f"traceq: error: {err.strip().removeprefix('traceq: error: ')}"
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_trace_is_exit_2(tmp_path: Path) -> None:
    code, _, err = invoke("analyze", tmp_path / "nope.json", "--no-config")
    assert code == 2 and err.startswith("traceq: error:")


def test_bad_format_is_a_usage_error_with_exit_2() -> None:
    assert invoke("analyze", EAGER, "--format", "html")[0] == 2


def test_output_file_gets_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report.sarif"
    code, stdout, _ = invoke(
        "analyze", COLD, "--select", "TQ205", "--format", "sarif", "-o", out, "--no-config"
    )
    assert code == 0 and stdout == ""
    doc = json.loads(out.read_text())
    assert doc["version"] == "2.1.0"
    assert [r["ruleId"] for r in doc["runs"][0]["results"]] == ["TQ205"]


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "sarif"])
def test_every_format_renders(fmt: str) -> None:
    code, out, _ = invoke("analyze", EAGER, "--format", fmt, "--no-config")
    assert code == 0 and out.strip()


def test_config_next_to_the_trace_is_found_and_the_command_line_wins(tmp_path: Path) -> None:
    trace = tmp_path / "runs" / EAGER.name
    trace.parent.mkdir()
    shutil.copy(EAGER, trace)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.traceq]\nselect = ["TQ204"]\nfail-on = "info"\n'
    )
    code, out, _ = invoke("analyze", trace, "--format", "json")
    assert code == 1  # fail-on from the file
    assert json.loads(out)["summary"]["rules_run"] == ["TQ204"]
    code, out, _ = invoke("analyze", trace, "--format", "json", "--select", "TQ205")
    assert code == 0 and json.loads(out)["summary"]["rules_run"] == ["TQ205"]
    code, out, _ = invoke("analyze", trace, "--format", "json", "--no-config")
    trace_rules = [r for r in RULES if r.scope == "trace"]  # job rules (TQ4xx) need a job
    assert code == 0 and len(json.loads(out)["summary"]["rules_run"]) == len(trace_rules)


def test_explicit_config_file(tmp_path: Path) -> None:
    config = tmp_path / "traceq.toml"
    config.write_text('select = ["TQ2"]\n[rules.TQ204]\nmin_share = 0.99\n')
    code, out, _ = invoke("analyze", EAGER, "--format", "json", "--config", config)
    assert code == 0 and json.loads(out)["findings"] == []
    code, _, err = invoke("analyze", EAGER, "--config", tmp_path / "missing.toml")
    assert code == 2 and "configuration file not found" in err


def test_rules_lists_the_catalogue() -> None:
    code, out, _ = invoke("rules", "--format", "json")
    assert code == 0
    listed = json.loads(out)["rules"]
    assert [r["code"] for r in listed] == [r.code for r in RULES]
    tq201 = next(r for r in listed if r["code"] == "TQ201")
    assert tq201["options"]["min_gap_us"] == 1.0 and tq201["origin"] == "builtin"
    code, out, _ = invoke("rules")
    assert code == 0 and all(r.code in out for r in RULES)


def test_explain_prints_the_rule_doc_and_options() -> None:
    code, out, _ = invoke("explain", "TQ201")
    assert code == 0
    assert out.startswith("# TQ201 launch-bound (warning)")
    assert "## Why is this bad?" in out and "--option TQ201.min_gap_us=1.0" in out
    assert invoke("explain", "launch-bound")[1] == out


def test_explain_unknown_code_is_exit_2() -> None:
    code, _, err = invoke("explain", "TQ999")
    assert code == 2 and "unknown rule 'TQ999'" in err
