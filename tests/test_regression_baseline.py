"""Baselines: what a saved file holds, what it must never hold, and how bad files fail.

Real trace: `trace_compare/base` from facebookresearch/HolisticTraceAnalysis (MIT), under
../shared/traces/hta/tests/data/; fixtures: fixtures/README.md.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceq
from traceq.regression.baseline import (
    VERSION,
    VERSION_KEY,
    load_baseline,
    load_summary,
    save_baseline,
)
from traceq.regression.diff import diff
from traceq.regression.errors import BaselineError
from traceq.regression.summary import Summary, summarize

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GEGLU = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"


def sorted_groups(summary: Summary) -> pl.DataFrame:
    return summary.groups.sort("dim", "group", "step", nulls_last=True)


def assert_same_summary(saved: Summary, original: Summary) -> None:
    assert saved.basis == original.basis
    assert saved.steps == original.steps
    assert saved.step_wall_ns == original.step_wall_ns
    assert saved.step_time_ns == original.step_time_ns
    assert saved.total_wall_ns == original.total_wall_ns
    assert saved.metadata == original.metadata
    assert sorted_groups(saved).equals(sorted_groups(original))
    assert saved.dispatch.sort("op", "shapes", "call").equals(
        original.dispatch.sort("op", "shapes", "call")
    )


@pytest.mark.parametrize("name", ["geglu.json", "geglu.json.gz"])
def test_a_cpu_baseline_reads_back_as_the_summary_it_was_written_from(
    tmp_path: Path, name: str
) -> None:
    original = summarize(traceq.load(GEGLU), findings=False)
    path = tmp_path / name
    save_baseline(original, path)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    assert_same_summary(load_baseline(path), original)
    assert_same_summary(load_summary(path), original)  # recognised as a baseline, not a trace


@pytest.mark.shared
def test_a_gpu_baseline_keeps_the_time_outside_steps(tmp_path: Path, shared_trace: Any) -> None:
    trace = traceq.load(shared_trace("hta/tests/data/trace_compare/base/base.json.gz"))
    original = summarize(trace, findings=False)
    assert original.groups["step"].null_count() > 0  # kernels launched after the last step
    path = tmp_path / "base.json"
    save_baseline(original, path)
    saved = load_baseline(path)
    assert_same_summary(saved, original)
    assert saved.total_time_ns == trace.kernels["dur_ns"].sum()


def test_a_trace_diffed_against_its_own_baseline_shows_no_change(tmp_path: Path) -> None:
    trace = traceq.load(GEGLU)
    path = tmp_path / "geglu.json"
    save_baseline(trace, path, findings=False)
    result = diff(load_baseline(path), trace, findings=False)
    assert result.groups["delta_ns"].abs().max() == 0
    assert set(result.groups["status"]) == {"same"}
    assert result.dispatch.height == 0
    assert all(t.change.rel == 0 for t in result.totals)


def test_a_baseline_stores_nothing_private(tmp_path: Path) -> None:
    """Host, user, environment and job names the profiler (or a user) put in the trace,
    and the host name in the profiler's default file name, never reach the baseline."""
    with gzip.open(GEGLU, "rt") as f:
        document = json.load(f)
    secrets = {
        "host_name": "build-host-7f3a",
        "username": "alice.secret",
        "environment": {"AWS_SECRET_ACCESS_KEY": "hunter2-key"},
        "mast_job_name": "torchx-private-job-99",
        "packages": ["private-pkg==1.2.3"],
    }
    document.update(secrets)
    trace_path = tmp_path / "build-host-7f3a_4711.1700000000.pt.trace.json"
    trace_path.write_text(json.dumps(document))
    out = tmp_path / "baseline.json"
    save_baseline(traceq.load(trace_path), out, findings=False)
    text = out.read_text()
    for needle in ("build-host-7f3a", "alice.secret", "hunter2-key", "private-job", "private-pkg"):
        assert needle not in text
    data = json.loads(text)  # plain JSON (never a pickle), versioned
    assert data[VERSION_KEY] == VERSION
    assert set(data["metadata"]) == {"vendor", "devices", "dtype", "versions", "world_size"}


def test_a_baseline_has_one_line_per_group(tmp_path: Path) -> None:
    summary = summarize(traceq.load(GEGLU), findings=False)
    path = tmp_path / "geglu.json"
    save_baseline(summary, path)
    lines = path.read_text().splitlines()
    # Once among the outermost ops, once among the ops at any depth (`op_total`).
    for name in summary.group_names("op"):
        assert sum(line.strip().startswith(json.dumps(name) + ": {") for line in lines) == 2


@pytest.fixture
def saved(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "geglu.json"
    save_baseline(traceq.load(GEGLU), path, findings=False)
    return json.loads(path.read_text())


def write(tmp_path: Path, data: Any, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_an_unknown_version_is_refused(tmp_path: Path, saved: dict[str, Any]) -> None:
    saved[VERSION_KEY] = VERSION + 1
    newer = rf"version {VERSION + 1} is not supported.*newer traceq"
    with pytest.raises(BaselineError, match=newer):
        load_baseline(write(tmp_path, saved))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d.pop("steps"), "missing field 'steps'"),
        (lambda d: d.update(basis="tpu"), "basis must be one of"),
        (lambda d: d["steps"]["wall_ns"].pop(), "differ in length"),
        (lambda d: d["groups"]["op"]["aten::gelu"]["time_ns"].pop(), "one value per step"),
        (lambda d: d["groups"]["op"]["aten::gelu"].update(count="3"), "array of integers"),
        (lambda d: d["dispatch"]["ops"][0].update(impl=[99]), "indices into names"),
        (lambda d: d.update(findings={"rule": "TQ103"}), "findings must be null or an array"),
    ],
)
def test_a_damaged_baseline_names_what_is_wrong(
    tmp_path: Path, saved: dict[str, Any], damage: Any, message: str
) -> None:
    damage(saved)
    with pytest.raises(BaselineError, match=message) as error:
        load_baseline(write(tmp_path, saved))
    assert isinstance(error.value, traceq.TraceError)  # the CLI turns it into exit 2
    assert "bad.json" in str(error.value)


def test_files_that_are_not_baselines_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="not JSON"):
        load_baseline(write(tmp_path, '{"traceq_baseline": 1, "basis": '))
    with pytest.raises(BaselineError, match="not a traceq baseline"):
        load_baseline(write(tmp_path, {"traceEvents": []}))
    with pytest.raises(BaselineError, match="cannot read"):
        load_baseline(tmp_path / "missing.json")


def test_load_summary_takes_a_baseline_or_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "geglu.json"
    original = save_baseline(traceq.load(GEGLU), path, findings=False)
    from_baseline = load_summary(path)
    from_trace = load_summary(GEGLU, findings=False)
    assert from_baseline.source == str(path)
    assert_same_summary(from_baseline, original)
    assert_same_summary(from_trace, original)
