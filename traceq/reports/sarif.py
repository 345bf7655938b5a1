"""SARIF 2.1.0 for code-scanning tools: one result per finding group.

Rules carry their documentation (`help`), and a fingerprint from the finding key lets
tools follow a result across runs. A result points at the source line that issued its ops
(`Finding.source`, from a trace recorded `with_stack=True`): its file relative to the
source root (`--source-root`, the repository checkout; default the working directory) and
its start line, so code scanning annotates that line of a pull request. Without stacks it
points at the trace file, with the module and ops as logical locations, and the run says
once, as a notification, how to get lines.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from traceq.reports.json import clean
from traceq.reports.model import FindingGroup, Report, format_fix_check

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {"info": "note", "warning": "warning", "error": "error"}
INFO_URI = "https://github.com/traceq/traceq"


NO_STACKS = (
    "the trace has no Python stacks, so results point at the trace file, not at source "
    "lines; record with `with_stack=True` (`traceq.profile` does) for file and line"
)


def render(report: Report, *, source_root: str | Path | None = None) -> str:
    return json.dumps(clean(document(report, source_root=source_root)), indent=2)


def document(report: Report, *, source_root: str | Path | None = None) -> dict[str, Any]:
    rules = list(report.rules)
    known = {r.code for r in rules}
    index = {r.code: i for i, r in enumerate(rules)}
    uri = _uri(report.source)
    root = Path(source_root) if source_root is not None else Path.cwd()
    results = [_result(g, index, uri, root) for g in report.groups if g.rule in known]
    stackless = bool(results) and not any(g.first.source for g in report.groups)
    notes = [
        {"level": "note", "message": {"text": n}}
        for n in report.notices
        # said below, for SARIF; a job's says how many ranks: "4 of 4 ranks: no Python stacks"
        if not (stackless and "no Python stacks:" in n)
    ]
    if stackless:
        notes.append({"level": "note", "message": {"text": NO_STACKS}})
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
                            *(
                                {"level": "warning", "message": {"text": p}}
                                for p in report.problems
                            ),
                            *notes,
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


def _result(group: FindingGroup, index: dict[str, int], uri: str, root: Path) -> dict[str, Any]:
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
    location: dict[str, Any] = {"physicalLocation": _physical(first.source, uri, root)}
    if first.source:
        properties["source"] = first.source
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


def _physical(source: dict[str, Any] | None, trace_uri: str, root: Path) -> dict[str, Any]:
    """The source line that issued a finding's ops, or the trace file without one."""
    if not source or not source.get("file"):
        return {"artifactLocation": {"uri": trace_uri}}
    physical: dict[str, Any] = {"artifactLocation": {"uri": _source_uri(source["file"], root)}}
    line = source.get("line")
    if isinstance(line, int) and line > 0:
        physical["region"] = {"startLine": line}
    return physical


@functools.lru_cache(maxsize=256)
def _source_uri(file: str, root: Path) -> str:
    """A frame's file relative to the source root, as code scanning matches a repository's
    paths: an absolute path under the root made relative; a path the profiler shortened
    (`model.py`, `pkg/model.py`: relative to a `sys.path` entry) found under the root as it
    is, else by its name at any depth of the root; else as it was recorded."""
    path = Path(file)
    root = root.resolve()
    if path.is_absolute():
        try:
            return path.resolve().relative_to(root).as_posix()
        except ValueError:
            return path.as_posix()
    if (root / path).is_file():
        return path.as_posix()
    matches = sorted(root.glob(f"**/{path.as_posix()}"))[:2] if root.is_dir() else []
    if len(matches) == 1:  # one file of that path under the root: that one
        return matches[0].relative_to(root).as_posix()
    return path.as_posix()


def _uri(source: str) -> str:
    path = Path(source)
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.resolve().as_uri() if path.is_absolute() or path.exists() else source


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(p.capitalize() for p in rest)
