"""fixtures/record.py still records what the committed fixture traces hold.

Re-records the smallest eager fixture (`linear-eager`) into a temp dir and reads it back
with json and gzip only: traceq's own loader is not used, so a loader bug cannot hide a
recording bug.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NAME = "linear-eager"

pytestmark = pytest.mark.slow


def _load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _aten_ops_per_step(trace: dict[str, Any]) -> list[Counter[str]]:
    """How many times each aten op runs inside each ProfilerStep#N, in step order."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = sorted(
        (e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    return [
        Counter(
            e["name"]
            for e in events
            if e.get("cat") == "cpu_op"
            and e["name"].startswith("aten::")
            and step["ts"] <= e["ts"] < step["ts"] + step["dur"]
        )
        for step in steps
    ]


@pytest.fixture(scope="module")
def record() -> ModuleType:
    pytest.importorskip("torch")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(FIXTURES))  # record.py imports its sibling models.py
        return importlib.import_module("record")


@pytest.fixture(scope="module")
def recorded(record: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    out = tmp_path_factory.mktemp("fixtures")
    entry = record.record_trace("linear", "eager", out)
    return entry, _load(out / f"{NAME}.pt.trace.json.gz")


def test_trace_is_a_chrome_trace_with_three_profiler_steps(recorded: tuple[dict, dict]) -> None:
    _, trace = recorded
    assert trace["schemaVersion"] == 1
    steps = [e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]


def test_each_step_runs_the_linear_as_one_addmm_with_recorded_shapes(
    recorded: tuple[dict, dict],
) -> None:
    _, trace = recorded
    addmm = [e for e in trace["traceEvents"] if e["name"] == "aten::addmm"]
    assert len(addmm) == 3
    # bias [128], x [32, 64], weight.t() [64, 128]: Input Dims are there (record_shapes)
    assert {tuple(map(tuple, e["args"]["Input Dims"][:3])) for e in addmm} == {
        ((128,), (32, 64), (64, 128))
    }
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"])  # with_stack


def test_rerecording_matches_the_committed_fixture(recorded: tuple[dict, dict]) -> None:
    entry, trace = recorded
    committed = _load(FIXTURES / f"{NAME}.pt.trace.json.gz")
    assert _aten_ops_per_step(trace) == _aten_ops_per_step(committed)
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    promised = manifest["traces"][f"{NAME}.pt.trace.json.gz"]
    assert entry["expected_dataflow"] == promised["expected_dataflow"]
    assert entry["step_ops"] == promised["step_ops"] == ["aten::linear"]


def test_check_rejects_a_trace_without_the_promised_ops(
    record: ModuleType, recorded: tuple[dict, dict]
) -> None:
    _, trace = recorded
    wrong = record.Dataflow((), {"act": ("aten::gelu",)})
    with pytest.raises(record.FixtureMismatch, match="aten::gelu"):
        record.check_trace(trace, wrong, cold=False)
