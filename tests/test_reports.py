"""Reports: grouping of repeated findings, and the four outputs (text, JSON, Markdown,
SARIF 2.1.0) rendered from one analysis of a real trace.

The real traces: Qwen1.5-0.5B prefill on an H100 (AMD-AGI/TraceLens test data, MIT;
skipped when `../shared/traces` is absent), with findings of several rules repeated
across its 24 decoder layers; and the sampled rank of a 128-rank training job bundled in
fixtures/gpu (HolisticTraceAnalysis test data, MIT), with ~100 findings of six rules and
no device properties, so the outputs are tested on every machine.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import read_json

from traceq.analyze import analysis
from traceq.reports import FORMATS, build_report, group_findings, render
from traceq.reports.model import Report
from traceq.reports.sarif import document
from traceq.rules.finding import Finding

QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
SAMPLED = "hta/tests/data/timeline_analysis/sampled_rank-0.json.gz"  # bundled in fixtures/gpu
REAL = [QWEN, SAMPLED]
# a rule with no finding on each trace
QUIET = {QWEN: "TQ203", SAMPLED: "TQ301"}


def finding(module: str | None, saving: float, step: int = 1, rule: str = "TQ102") -> Finding:
    return Finding(
        rule=rule,
        name="split-gemm-activation",
        severity="warning",
        message=f"split in {module}",
        step=step,
        module=module,
        ops=[1, 2],
        shapes=[[8, 768]],
        time_us=2 * saving,
        est_saving_us=saving,
        saving_model="model",
        fix="fix",
        zoo=["gemm_bias_act"],
        evidence={"op_names": ["aten::linear", "aten::gelu"]},
    )


@pytest.fixture(scope="module", params=REAL, ids=["qwen", "sampled_rank-0"])
def real(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def report(real: str, load_shared) -> Report:
    trace = load_shared(real)
    return build_report(analysis(trace), trace)


@pytest.fixture(scope="module")
def raw_device_name(real: str, shared_trace) -> str | None:
    """The GPU's name as the trace file records it (None without device properties)."""
    properties = read_json(shared_trace(real)).get("deviceProperties") or []
    return properties[0]["name"] if properties else None


# -- grouping -----------------------------------------------------------------------------


def test_repeated_layers_group_under_a_module_pattern() -> None:
    items = [finding(f"encoder.layer.{i}.mlp", 1.0 + i, step=i % 2) for i in range(24)]
    (group,) = group_findings(items)
    assert group.count == 24
    assert group.where == "×24 in `encoder.layer.*.mlp`"
    assert group.est_saving_us == pytest.approx(sum(1.0 + i for i in range(24)))
    assert group.first.module == "encoder.layer.23.mlp"  # the largest occurrence speaks
    assert group.steps == [0, 1]


def test_one_module_keeps_its_name_and_one_occurrence_has_no_count() -> None:
    same = group_findings([finding("enc.mlp", 1.0), finding("enc.mlp", 2.0, step=2)])
    assert same[0].where == "×2 in `enc.mlp`"
    assert group_findings([finding(None, 1.0)])[0].where == ""


def test_groups_sort_by_total_saving() -> None:
    items = [finding("a.0", 5.0), finding("b", 3.0), finding("b", 3.5), finding("c", 0.5)]
    groups = group_findings(items)
    assert [g.est_saving_us for g in groups] == [6.5, 5.0, 0.5]


# -- outputs of a real analysis -----------------------------------------------------------


def test_json_lists_every_occurrence_with_its_group_key(
    report: Report, raw_device_name: str | None
) -> None:
    data = json.loads(render(report, "json"))
    assert len(data["findings"]) == len(report.findings) > 0
    keys = {g["key"] for g in data["groups"]}
    assert {f["key"] for f in data["findings"]} == keys
    for item in data["findings"]:
        assert Finding.from_dict(item).key() == item["key"]
    summary = data["summary"]
    assert summary["findings"] == len(report.findings)
    assert summary["est_saving_us_sum"] == pytest.approx(
        sum(f.est_saving_us for f in report.findings)
    )
    # each µs once: never more than the findings' own estimates, per finding and in all
    assert summary["est_saving_us"] <= summary["est_saving_us_sum"] + 1e-6
    assert summary["est_saving_us"] == pytest.approx(
        sum(f["counted_saving_us"] for f in data["findings"])
    )
    for item in data["findings"]:
        assert 0 <= item["counted_saving_us"] <= item["est_saving_us"] + 1e-6
    for code, entry in summary["by_rule"].items():
        assert entry["count"] == sum(1 for f in report.findings if f.rule == code)
    assert summary["trace"]["events"] == report.trace["events"]
    assert summary["device"]["name"] == (raw_device_name or "unknown GPU")


def test_json_is_strict_json(report: Report) -> None:
    text = render(report, "json")
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_text_shows_groups_by_impact_with_repeats(report: Report) -> None:
    text = render(report, "text", max_groups=None)
    savings = [g.est_saving_us for g in report.groups]
    assert savings == sorted(savings, reverse=True)
    headers = re.findall(r"^\d+\. (TQ\d+) ", text, re.M)
    assert headers == [g.rule for g in report.groups]
    repeated = [g for g in report.groups if g.count > 1]
    assert repeated and all(g.where in text for g in repeated)
    assert "by rule" in text


def test_markdown_has_a_row_and_a_section_per_group(report: Report) -> None:
    text = render(report, "markdown", max_groups=None)
    rows = [line for line in text.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert len(rows) == len(report.groups)
    assert text.count("<details>") == len(report.groups)
    for row in rows:  # message pipes are escaped: every row has the table's 8 separators
        assert len(re.findall(r"(?<!\\)\|", row)) == 8


def test_sarif_is_structurally_valid_2_1_0(report: Report) -> None:
    doc = json.loads(render(report, "sarif"))
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    (run,) = doc["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "traceq"
    ids = [r["id"] for r in driver["rules"]]
    assert ids == [r.code for r in report.rules] and len(set(ids)) == len(ids)
    for rule in driver["rules"]:
        assert rule["help"]["text"].startswith("## What it does")
        assert rule["shortDescription"]["text"]
        assert rule["defaultConfiguration"]["level"] in ("note", "warning", "error")
    assert len(run["results"]) == len(report.groups)
    uri = run["artifacts"][0]["location"]["uri"]
    for result, group in zip(run["results"], report.groups, strict=True):
        assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("none", "note", "warning", "error")
        assert result["message"]["text"]
        (location,) = result["locations"]
        source = group.first.source  # the line that issued the ops, else the trace file
        physical = location["physicalLocation"]
        assert physical["artifactLocation"]["uri"] == (source["file"] if source else uri)
        if source:
            assert physical["region"]["startLine"] == source["line"] >= 1
        for logical in location.get("logicalLocations", []):
            assert logical["kind"] in ("module", "function")
        assert re.fullmatch(r"[0-9a-f]{32}", result["partialFingerprints"]["traceqKey/v1"])


def test_sarif_points_at_module_and_op_as_logical_locations(load_shared) -> None:
    """Qwen's findings carry module paths (recorded with `with_modules`)."""
    trace = load_shared(QWEN)
    report = build_report(analysis(trace), trace)
    doc = document(report)
    located = [
        (r, report.groups[i])
        for i, r in enumerate(doc["runs"][0]["results"])
        if report.groups[i].module
    ]
    assert located
    for result, group in located:
        logical = result["locations"][0]["logicalLocations"]
        assert logical[0] == {"fullyQualifiedName": group.module, "kind": "module"}


@pytest.mark.parametrize("relpath", REAL, ids=["qwen", "sampled_rank-0"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_attached_fix_check_shows_in_every_format(fmt: str, relpath: str, load_shared) -> None:
    trace = load_shared(relpath)
    fresh = build_report(analysis(trace), trace)
    group = fresh.groups[0]
    fresh.attach_fix_check(group.key, {"summary": "fused kernel 1.8x faster, max err 2e-3"})
    text = render(fresh, fmt, **({"max_groups": None} if fmt in ("text", "markdown") else {}))
    assert "fused kernel 1.8x faster, max err 2e-3" in text
    with pytest.raises(KeyError):
        fresh.attach_fix_check("no such key", {})


@pytest.mark.parametrize("relpath", REAL, ids=["qwen", "sampled_rank-0"])
def test_a_report_without_findings_says_so(relpath: str, load_shared) -> None:
    trace = load_shared(relpath)
    empty = build_report(analysis(trace, select=QUIET[relpath]), trace)
    assert empty.findings == []
    assert "No findings." in render(empty, "text")
    assert "No findings." in render(empty, "markdown")
    assert json.loads(render(empty, "sarif"))["runs"][0]["results"] == []
    assert json.loads(render(empty, "json"))["findings"] == []
