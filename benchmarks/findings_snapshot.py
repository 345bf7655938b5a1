"""Findings of `traceq analyze --format json` on every fixture and every trace in ../shared,
one JSON file per trace, and a comparison of two such snapshots.

Why: a refactor that moves modules (the house issue) must not change what any rule finds.
Take a snapshot on the code before, another on the code after, and compare them:

    python benchmarks/findings_snapshot.py write /tmp/before     # on the old commit
    python benchmarks/findings_snapshot.py write /tmp/after      # on the new one
    python benchmarks/findings_snapshot.py compare /tmp/before /tmp/after

Per-rule timings are left out (they are wall-clock); everything else must be equal.
`compare` also writes `results/findings_compare.json`: the two commits (`BEFORE_REV`,
`AFTER_REV` in the environment, as the snapshots were taken), how many traces, which differ
(and why, `NOTE`), and a SHA-256 of each trace's findings, so that a later snapshot can
be checked against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
RESULTS = Path(__file__).resolve().parent / "results"


def traces() -> list[Path]:
    """Every Kineto trace here: the fixtures (single traces, job folders' ranks one by one
    and each job folder as a job) and ../shared/traces, without Execution Traces or
    engines' metadata."""
    found: list[Path] = []
    for base in (ROOT / "fixtures", SHARED):
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.json*")):
            name = path.name
            if not (name.endswith(".json") or name.endswith(".json.gz")):
                continue
            if ".et." in name or name in {"manifest.json", "corpus.json", "sources.json"}:
                continue
            if name.endswith("execution_details.json") or "_perf_report" in str(path):
                continue
            found.append(path)
    jobs = ROOT / "fixtures" / "jobs"
    found += sorted(p for p in jobs.iterdir() if p.is_dir()) if jobs.is_dir() else []
    return found


def snapshot(path: Path) -> dict:
    """The JSON report of one trace, or the one-line error traceq gives for it."""
    from click.testing import CliRunner
    from traceq.cli.main import main as cli

    result = CliRunner().invoke(cli, ["analyze", str(path), "--format", "json", "--no-config"])
    if result.exit_code not in (0, 1):
        return {"exit": result.exit_code, "error": (result.output or "").strip()[-500:]}
    report = json.loads(result.output)
    report.pop("timings", None)
    for key in ("rule_timings", "timing"):
        report.pop(key, None)
    return {"exit": result.exit_code, "report": _portable(without_timings(report))}


def without_timings(value: object) -> object:
    """The report without its wall-clock keys (per-rule timings)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if "timing" not in k}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def _portable(value: object) -> object:
    """Paths of traces relative to their checkout (`fixtures/...`, `traces/...`): two
    snapshots taken in two worktrees compare equal."""
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"/[^\s'\"]*?/(?=(fixtures|traces)/)", "", value)
    return value


def key(path: Path) -> str:
    for base in (ROOT, SHARED.parent):
        if path.is_relative_to(base):
            return str(path.relative_to(base)).replace("/", "__")
    return path.name


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in traces():
        (out / f"{key(path)}.json").write_text(json.dumps(snapshot(path), indent=1, sort_keys=True))
        print(key(path), flush=True)


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    differ = []
    digests = {}
    for name in names:
        a, b = before / name, after / name
        if not (a.exists() and b.exists()):
            print(f"only in one snapshot: {name}")
            differ.append(name)
            continue
        found = _portable(json.loads(b.read_text()))
        digests[name.removesuffix(".json")] = _digest(found)
        if _portable(json.loads(a.read_text())) != found:
            print(f"differs: {name}")
            differ.append(name)
    print(f"{len(names)} traces, {len(differ)} differ")
    RESULTS.mkdir(exist_ok=True)
    record = {
        "before": os.environ.get("BEFORE_REV", str(before)),
        "after": os.environ.get("AFTER_REV", str(after)),
        "traces": len(names),
        "differ": differ,
        "note": os.environ.get("NOTE", ""),
        "sha256": digests,
    }
    (RESULTS / "findings_compare.json").write_text(json.dumps(record, indent=1) + "\n")
    return 1 if differ else 0


def _digest(found: object) -> str:
    return hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
