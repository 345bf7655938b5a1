"""`traceq annotate`: a copy of the trace with the critical path and findings marked.

Checked with the stdlib `json` (numbers kept exact as `Decimal`): the original events are
all there and unchanged but for the added `args`, the flows bind to the events they join,
and markers sit on the ops a finding names. Traces: the project's fixtures and
facebookresearch/HolisticTraceAnalysis tests/data/critical_path/alexnet (MIT).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq
from traceq.relations.critical_path import critical_path
from traceq.reports.annotate import FINDING_CATEGORY, PATH_CATEGORY, annotate

ALEXNET = "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
ADDED_ARGS = ("critical", "traceq_findings")


@dataclass
class Finding:
    rule: str
    name: str
    message: str
    ops: list[int] = field(default_factory=list)
    kernels: list[int] = field(default_factory=list)


def _document(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return json.load(f, parse_float=Decimal)


def _fixture(repo_root: Path) -> Path:
    path = repo_root / "fixtures" / "mlp_gelu-eager.pt.trace.json.gz"
    if not path.is_file():
        pytest.skip("fixture not recorded")
    return path


def _without_added(event: dict) -> dict:
    """The event with the args annotate may add taken out (no args = empty args)."""
    rest = {k: v for k, v in event.items() if k != "args"}
    args = {k: v for k, v in event.get("args", {}).items() if k not in ADDED_ARGS}
    return {**rest, "args": args}


def _check_copy(original: dict, copy: dict) -> list[dict]:
    """The copy holds every original event, equal but for the added args; returns the
    events appended after them."""
    before, after = original["traceEvents"], copy["traceEvents"]
    assert {k: v for k, v in copy.items() if k != "traceEvents"} == {
        k: v for k, v in original.items() if k != "traceEvents"
    }
    for old, new in zip(before, after, strict=False):
        assert _without_added(new) == _without_added(old)
    return after[len(before) :]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_critical_path_copy(repo_root: Path, tmp_path: Path, suffix: str) -> None:
    source = _fixture(repo_root)
    trace = traceq.load(source)
    out = annotate(trace, tmp_path / f"out{suffix}", region=3)
    original, copy = _document(source), _document(out)
    added = _check_copy(original, copy)
    path = critical_path(trace, 3)
    marked = [i for i, e in enumerate(copy["traceEvents"][: len(original["traceEvents"])])
              if e.get("args", {}).get("critical") is True]  # fmt: skip
    assert sorted(marked) == sorted(path.critical_events)
    flows = [e for e in added if e.get("cat") == PATH_CATEGORY]
    crossing = path.edges.filter(path.edges["src_event"] != path.edges["dst_event"])
    assert len(flows) == 2 * crossing.height
    events = original["traceEvents"]
    for start, end in zip(flows[::2], flows[1::2], strict=True):
        assert (start["ph"], end["ph"], end["bp"]) == ("s", "f", "e")
        assert start["id"] == end["id"]
        for point in (start, end):  # each point lies inside an event on its thread
            assert any(
                e.get("ph") == "X"
                and e["pid"] == point["pid"]
                and e["tid"] == point["tid"]
                and e["ts"] <= point["ts"] < e["ts"] + e["dur"]
                for e in events
            ), point
    # ns-resolution times are written exactly, not rounded through a float
    assert all(f["ts"] == f["ts"].quantize(Decimal("0.001")) for f in flows)


def test_nothing_asked_nothing_changed(repo_root: Path, tmp_path: Path) -> None:
    source = _fixture(repo_root)
    out = annotate(traceq.load(source), tmp_path / "same.json", critical_path=False)
    assert _document(out) == _document(source)


def test_findings_mark_their_events_and_add_a_marker(load_shared, tmp_path: Path) -> None:
    trace = load_shared(ALEXNET)
    relu = trace.ops.filter(trace.ops["name"] == "aten::relu_")["event"].to_list()[:2]
    kernel = trace.kernels["event"].to_list()[0]
    findings = [
        Finding("TQ102", "split-gemm-activation", "linear then relu", ops=relu, kernels=[kernel]),
        Finding("TQ202", "host-sync", "a sync", ops=[relu[0]]),
    ]
    out = annotate(trace, tmp_path / "f.json", critical_path=False, findings=findings)
    copy = _document(out)
    events = copy["traceEvents"]
    assert events[relu[0]]["args"]["traceq_findings"] == [
        "TQ102 split-gemm-activation",
        "TQ202 host-sync",
    ]
    assert events[kernel]["args"]["traceq_findings"] == ["TQ102 split-gemm-activation"]
    markers = [e for e in events if e.get("cat") == FINDING_CATEGORY]
    assert [m["name"] for m in markers] == ["TQ102 split-gemm-activation", "TQ202 host-sync"]
    first = events[relu[0]]
    assert (markers[0]["ph"], markers[0]["pid"], markers[0]["tid"], markers[0]["ts"]) == (
        "i",
        first["pid"],
        first["tid"],
        first["ts"],
    )
    assert markers[0]["args"]["ops"] == relu
    with pytest.raises(traceq.TraceError):
        annotate(trace, tmp_path / "g.json", findings=[Finding("TQ1", "x", "y", ops=[10**9])])


def test_cli_writes_a_trace_traceq_reads_back(repo_root: Path, tmp_path: Path) -> None:
    source = _fixture(repo_root)
    out = tmp_path / "annotated.json.gz"
    done = CliRunner().invoke(main, ["annotate", str(source), "-o", str(out), "--step", "4"])
    assert done.exit_code == 0, done.output
    again = traceq.load(out)
    path = critical_path(traceq.load(source), 4)
    crossing = path.edges.filter(path.edges["src_event"] != path.edges["dst_event"])
    flows = again.flows.filter(again.flows["cat"] == PATH_CATEGORY)
    assert flows.height == crossing.height > 0
    assert flows["start_event"].null_count() == flows["end_event"].null_count() == 0
    assert again.ops.height == traceq.load(source).ops.height
