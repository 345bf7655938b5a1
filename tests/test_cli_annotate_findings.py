"""`traceq annotate` marks the findings of `traceq analyze` so they show in Perfetto."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from traceq.cli.main import main

import traceq

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mlp_gelu-eager.pt.trace.json.gz"


def _annotated(tmp_path: Path, *extra: str) -> list[dict]:
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["annotate", str(FIXTURE), "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())["traceEvents"]


def test_every_finding_event_is_marked_with_its_rule(tmp_path: Path) -> None:
    findings = traceq.analyze(traceq.load(FIXTURE), select=["TQ102"])
    assert len(findings) == 3  # one split Linear+GELU per profiled step
    events = _annotated(tmp_path, "--select", "TQ102")
    for finding in findings:
        for event in [*finding.ops, *finding.kernels]:
            marks = events[event].get("args", {}).get("traceq_findings", [])
            assert "TQ102 split-gemm-activation" in marks
    markers = [e for e in events if e.get("cat") == "traceq_finding"]
    assert len(markers) == len(findings)


def test_no_findings_leaves_only_the_critical_path(tmp_path: Path) -> None:
    events = _annotated(tmp_path, "--no-findings")
    assert not [e for e in events if "traceq_findings" in e.get("args", {})]
    assert [e for e in events if e.get("cat") == "critical_path"]


def test_select_takes_comma_separated_codes_as_analyze_does(tmp_path: Path) -> None:
    findings = traceq.analyze(traceq.load(FIXTURE), select=["TQ102", "TQ204"])
    events = _annotated(tmp_path, "--select", "TQ102,TQ204")
    markers = [e for e in events if e.get("cat") == "traceq_finding"]
    assert len(markers) == len(findings) == 3  # read as two codes, not one unknown selector
