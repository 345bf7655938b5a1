"""traceq finds what PyTorch's own anti-pattern matcher (`torch/profiler/_pattern_matcher.py`)
finds, from the saved trace alone.

`fixtures/patterns/` (`fixtures/record_patterns.py`) holds small CPU profiles, each with a
case the matcher flags and a negative twin beside it; right after recording, the matcher
class ran on the same profile object and `<name>.matcher.json` lists what it matched (name
and ordinal among the trace's events of that name). Each test maps those events to trace
event ids through the raw JSON and asserts traceq's findings cover exactly them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, read_json

import traceq
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.finding import Finding

PATTERNS = FIXTURES / "patterns"


def _case(name: str) -> tuple[Path, dict[str, Any]]:
    trace = PATTERNS / f"{name}.pt.trace.json.gz"
    matcher = json.loads((PATTERNS / f"{name}.matcher.json").read_text())
    return trace, matcher


def _matched_ids(path: Path, matcher: dict[str, Any]) -> set[int]:
    """Trace event ids of the matcher's events: the n-th complete event of that name."""
    raw = read_json(path)["traceEvents"]
    by_name: dict[str, list[int]] = {}
    for i, e in enumerate(raw):
        if e.get("ph") == "X":
            by_name.setdefault(e["name"], []).append(i)
    for ids in by_name.values():
        ids.sort(key=lambda i: (raw[i]["ts"], i))
    return {by_name[m["name"]][m["ordinal"]] for m in matcher["events"]}


def _findings(path: Path, code: str) -> list[Finding]:
    return run(traceq.load(path), Config(select=[code])).findings


def test_conv_bias_followed_by_batchnorm() -> None:
    path, matcher = _case("conv_bias_bn")
    assert matcher["count"] == 2  # conv1 -> bn1 in both steps; not conv2 (no bias), conv3 (no bn)
    findings = _findings(path, "TQ110")
    assert {f.evidence["conv"] for f in findings} == _matched_ids(path, matcher)
    assert all("bias=False" in f.fix for f in findings)


def test_half_gemm_dims_not_multiple_of_8() -> None:
    path, matcher = _case("gemm_unaligned")
    assert matcher["count"] == 6  # mm, addmm, bmm per step; not the aligned mm, not fp32
    findings = _findings(path, "TQ303")
    assert {e for f in findings for e in f.ops} == _matched_ids(path, matcher)
    raw = read_json(path)["traceEvents"]
    for f in findings:
        for e in f.ops:  # independently: some input's last two dims are not multiples of 8
            dims = raw[e]["args"]["Input Dims"]
            assert any(d % 8 for shape in dims for d in shape[-2:])
            assert raw[e]["args"]["Input type"][0] in ("c10::BFloat16", "c10::Half")


def test_python_loop_indexing() -> None:
    path, matcher = _case("loop_indexing")
    assert matcher["count"] == 2  # the 32-iteration loop in each step; not the 4 row reads
    findings = _findings(path, "TQ208")
    assert {f.evidence["first_select"] for f in findings} == _matched_ids(path, matcher)
    for f in findings:
        period = f.evidence["period"]  # `t[i] = i`: the scalar is lifted to a tensor
        assert period[0] == "aten::select" and "aten::fill_" in period
        assert f.evidence["repeats"] >= 31
        assert 0 < f.est_saving_us <= f.time_us


def test_synchronized_dataloader() -> None:
    path, matcher = _case("dataloader_sync")
    assert matcher["count"] == 2  # one `__iter__` per step
    findings = _findings(path, "TQ209")
    iters = {e for f in findings for e in f.evidence["iter_events"]}
    assert iters == _matched_ids(path, matcher)
    raw = read_json(path)["traceEvents"]
    nexts = [
        e
        for e in raw
        if e.get("name") == "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    ]
    assert sum(f.evidence["batches"] for f in findings) == len(nexts) == 10  # 4 + stop, x2
    assert sum(f.est_saving_us for f in findings) == pytest.approx(
        sum(e["dur"] for e in nexts), rel=1e-3
    )


@pytest.mark.parametrize("code", ["TQ110", "TQ208", "TQ209", "TQ303"])
def test_silent_on_a_trace_without_the_pattern(code: str) -> None:
    path = FIXTURES / "mlp_gelu-eager.pt.trace.json.gz"
    assert _findings(path, code) == []
