"""SARIF 2.1.0 for code-scanning tools: one result per finding group.

Rules carry their documentation (`help`), results point at the trace file as the artifact
and at the module and op as logical locations (a trace has no source lines), and a
fingerprint from the finding key lets tools follow a result across runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from traceq.reports.json import clean
from traceq.reports.model import FindingGroup, Report, format_fix_check

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {"info": "note", "warning": "warning", "error": "error"}
INFO_URI = "https://github.com/traceq/traceq"


def render(report: Report) -> str:
    return json.dumps(clean(document(report)), indent=2)


def document(report: Report) -> dict[str, Any]:
    rules = list(report.rules)
    known = {r.code for r in rules}
    index = {r.code: i for i, r in enumerate(rules)}
    uri = _uri(report.source)
    results = [_result(g, index, uri) for g in report.groups if g.rule in known]
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "traceq",
                        "version": report.version,
                        "informationUri": INFO_URI,
                        "rules": [_rule(r) for r in rules],
                    }
                },
                "artifacts": [{"location": {"uri": uri}}],
                "invocations": [
                    {
                        "executionSuccessful": True,
                        "toolExecutionNotifications": [
                            {"level": "warning", "message": {"text": p}} for p in report.problems
                        ],
                    }
                ],
                "results": results,
                "properties": {"summary": _summary(report)},
            }
        ],
    }


def _rule(rule: Any) -> dict[str, Any]:
    return {
        "id": rule.code,
        "name": _camel(rule.name),
        "shortDescription": {"text": rule.summary or rule.name},
        "fullDescription": {"text": rule.summary or rule.name},
        "help": {"text": rule.doc, "markdown": rule.doc},
        "defaultConfiguration": {"level": LEVEL[rule.severity]},
        "properties": {
            "tags": ["performance"],
            "kebabName": rule.name,
            "options": dict(rule.defaults),
            "zoo": list(rule.zoo),
        },
    }


def _result(group: FindingGroup, index: dict[str, int], uri: str) -> dict[str, Any]:
    first = group.first
    logical = []
    if group.module:
        logical.append({"fullyQualifiedName": group.module, "kind": "module"})
    names = list(dict.fromkeys(first.evidence.get("op_names") or []))
    for name in names[:4]:
        logical.append({"name": name, "kind": "function"})
    text = first.message
    if group.count > 1:
        text += f" ({group.where}; estimated saving {group.est_saving_us:,.1f} µs in all)"
    properties: dict[str, Any] = {
        "occurrences": group.count,
        "steps": group.steps,
        "time_us": group.time_us,
        "est_saving_us": group.est_saving_us,
        "saving_model": first.saving_model,
        "fix": first.fix,
        "zoo": first.zoo,
        "shapes": first.shapes,
        "dtype": first.dtype,
        "ops": first.ops[:50],
        "kernels": first.kernels[:50],
    }
    if group.fix_check:
        properties["fix_check"] = group.fix_check
        text += f" Fix check: {format_fix_check(group.fix_check)}"
    location: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": uri}}}
    if logical:
        location["logicalLocations"] = logical
    return {
        "ruleId": group.rule,
        "ruleIndex": index[group.rule],
        "level": LEVEL[group.severity],
        "message": {"text": text},
        "locations": [location],
        "partialFingerprints": {
            "traceqKey/v1": hashlib.sha256(group.key.encode()).hexdigest()[:32]
        },
        "properties": properties,
    }


def _summary(report: Report) -> dict[str, Any]:
    summary = report.summary()
    return {k: summary[k] for k in ("findings", "groups", "est_saving_us", "by_rule")}


def _uri(source: str) -> str:
    path = Path(source)
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.resolve().as_uri() if path.is_absolute() or path.exists() else source


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(p.capitalize() for p in rest)
