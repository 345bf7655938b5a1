"""The regression gate end to end on bundled traces, so it is tested on every machine.

Copies of real traces are written with a **monotonic time warp**: time runs slower inside
chosen intervals (every timestamp `t` becomes `t + Σ extra slope × the part of those
intervals before t`). Durations inside grow, everything after shifts, and since the map
is monotonic, every op still nests in its parents (which grow too) and every kernel stays
after its launch.

- `hta-sampled_rank-0` (fixtures/gpu; HolisticTraceAnalysis test data, MIT): 2 steps of a
  128-rank NCCL training job. One op, `aten::bmm` (2 % of the GPU time, outermost and at
  any depth), is made 30 % slower by warping the intervals of the kernels it launched: the
  gate fails and names it. A copy with each step warped by a random factor in ±1 % passes.
- `hta-alexnet-a100` (fixtures/gpu): `--fail-on-new-findings`, with a baseline in which the
  pageable input copies were pinned.
- `mlp_gelu-eager` (fixtures/, recorded by this project, with modules): `diff --by module`
  on a copy with module `Linear_1` (fc2) 30 % slower.

Which kernels an op launched, and which ops a module holds, is computed here from the raw
JSON (correlation ids and time containment on the launching thread), not by traceq.
"""

from __future__ import annotations

import bisect
import copy
import json
import random
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import FIXTURES, gpu_fixture, read_json, write_json
from traceq.cli.main import main

import traceq
from traceq.regression.check import check
from traceq.regression.diff import diff
from traceq.regression.summary import summarize

SAMPLED = gpu_fixture("hta-sampled_rank-0")
ALEXNET = gpu_fixture("hta-alexnet-a100")
MLP = FIXTURES / "mlp_gelu-eager.pt.trace.json.gz"
TARGET = "aten::bmm"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def ns(value: Any) -> int:
    return int(Decimal(str(value)) * 1000)


def warp(document: dict[str, Any], slow: Iterable[tuple[int, int, Decimal]]) -> dict[str, Any]:
    """A copy of `document` in which time inside each [start, end) ns interval runs
    `1 + extra` times as slow (intervals must not overlap). Whole ns: monotonic, exact."""
    spans = sorted(slow)
    starts = [s for s, _, _ in spans]
    before = [Decimal(0)]  # extra time added by the intervals before each one
    for s, e, extra in spans:
        before.append(before[-1] + (e - s) * extra)

    def f(t: int) -> int:
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return t
        s, e, extra = spans[i]
        return t + int(before[i] + (min(t, e) - s) * extra)

    doc = copy.deepcopy(document)
    for event in doc["traceEvents"]:
        if "ts" not in event:
            continue
        start = ns(event["ts"])
        event["ts"] = Decimal(f(start)) / 1000
        if "dur" in event:
            event["dur"] = Decimal(f(start + ns(event["dur"])) - f(start)) / 1000
    return doc


def union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def kernels_launched_under(document: dict[str, Any], op_name: str) -> list[int]:
    """GPU activities whose launch call ran inside an op named `op_name` (at any depth)
    on the launching thread, matched by correlation id."""
    events = document["traceEvents"]
    ops_by_tid: dict[Any, list[tuple[int, int]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e.get("name") == op_name:
            ops_by_tid.setdefault(e["tid"], []).append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    calls = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    found = []
    for i, e in enumerate(events):
        call = calls.get(e.get("args", {}).get("correlation")) if e.get("cat") in GPU_CATS else None
        if call is None:
            continue
        t = ns(call["ts"])
        if any(s <= t <= end for s, end in ops_by_tid.get(call["tid"], [])):
            found.append(i)
    return found


@pytest.fixture(scope="module")
def sampled_document() -> dict[str, Any]:
    return read_json(SAMPLED, parse_float=Decimal)


@pytest.fixture(scope="module")
def gate_files(tmp_path_factory: pytest.TempPathFactory, sampled_document) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gate")
    events = sampled_document["traceEvents"]
    target = kernels_launched_under(sampled_document, TARGET)
    assert len(target) >= 20
    slow = union((ns(events[k]["ts"]), ns(events[k]["ts"]) + ns(events[k]["dur"])) for k in target)
    rng = random.Random(11)
    steps = [
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), Decimal(str(round(rng.uniform(-0.01, 0.01), 4))))
        for e in events
        if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")
    ]
    assert len(steps) == 2
    return {
        "base": SAMPLED,
        "slow": write_json(
            warp(sampled_document, [(s, e, Decimal("0.3")) for s, e in slow]), folder / "slow.json"
        ),
        "jitter": write_json(warp(sampled_document, steps), folder / "jitter.json"),
        "target": target,  # type: ignore[dict-item]
    }


def test_the_warp_keeps_nesting_and_stretches_only_the_targets_kernels(
    gate_files, sampled_document
) -> None:
    """Each of the op's kernels is 30 % longer (to the ns); the loader sees the same ops,
    nested the same way, and the step that holds them is longer."""
    base, slow = traceq.load(gate_files["base"]), traceq.load(gate_files["slow"])
    warped = read_json(gate_files["slow"], parse_float=Decimal)["traceEvents"]
    for k in gate_files["target"]:
        before = ns(sampled_document["traceEvents"][k]["dur"])
        assert abs(ns(warped[k]["dur"]) - before * 13 // 10) <= 1
    assert slow.ops["parent"].to_list() == base.ops["parent"].to_list()
    assert slow.unlinked == base.unlinked
    assert (slow.steps["dur_ns"] > base.steps["dur_ns"]).all()


def test_an_op_made_30_percent_slower_fails_the_gate_and_is_named(gate_files) -> None:
    result = check(gate_files["slow"], gate_files["base"], max_regress="5%")
    assert result.failed
    regressed = {m.spec: m for m in result.regressions}
    metric = regressed[f"op:{TARGET}"]
    assert metric.change.rel == pytest.approx(0.30, abs=2e-3)
    assert metric.change.ci_low > 0
    # the named op is the only outermost-op group that grew by the full 30 %
    full = [s for s, m in regressed.items() if s.startswith("op:") and m.change.rel > 0.25]
    assert full == [f"op:{TARGET}"]


def test_per_step_jitter_of_1_percent_passes(gate_files) -> None:
    result = check(gate_files["jitter"], gate_files["base"], max_regress="5%")
    assert not result.failed, [m.spec for m in result.regressions]
    checked = [m for m in result.metrics if m.change.rel is not None]
    assert len(checked) > 10  # step, gpu and the groups over 1 %
    assert max(abs(m.change.rel) for m in checked) <= 0.01 + 1e-6


def run(*args: str) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_gate_fails_on_the_slow_op_and_passes_the_jitter(gate_files, tmp_path: Path) -> None:
    baseline = tmp_path / "base.json"
    saved = run("baseline", "save", gate_files["base"], "-o", baseline, "--no-findings")
    assert saved.exit_code == 0, saved.output
    slow = run("check", gate_files["slow"], "--baseline", baseline, "--format", "json")
    assert slow.exit_code == 1, slow.output
    assert f"op:{TARGET}" in json.loads(slow.stdout)["regressed"]
    text = run("check", gate_files["slow"], "--baseline", baseline)
    assert text.exit_code == 1 and "FAIL" in text.output and TARGET in text.output
    jitter = run("check", gate_files["jitter"], "--baseline", baseline)
    assert jitter.exit_code == 0, jitter.output
    assert "PASS" in jitter.output


# -- --fail-on-new-findings ---------------------------------------------------------------


def test_fail_on_new_findings_fails_when_a_finding_appears(tmp_path: Path) -> None:
    """Baseline: AlexNet with its five explicit `cudaDeviceSynchronize` calls replaced by
    non-blocking `cudaEventQuery` polls. New: the real trace, which synchronizes. Same
    timings: no metric regresses, so only the flag fails the gate, and the report names
    the findings that appeared: TQ202's explicit syncs."""
    document = read_json(ALEXNET, parse_float=Decimal)
    polled = copy.deepcopy(document)
    syncs = [e for e in polled["traceEvents"] if e.get("name") == "cudaDeviceSynchronize"]
    assert len(syncs) == 5  # three of them with GPU work after them: TQ202 reports those
    for event in syncs:
        event["name"] = "cudaEventQuery"
    base = write_json(polled, tmp_path / "polled.json")
    assert run("check", ALEXNET, "--baseline", base).exit_code == 0
    flagged = run(
        "check", ALEXNET, "--baseline", base, "--fail-on-new-findings", "--format", "json"
    )
    assert flagged.exit_code == 1, flagged.output
    data = json.loads(flagged.stdout)
    assert data["regressed"] == [] and data["failed"] is True
    appeared = data["new_findings"]
    assert {f["rule"] for f in appeared} == {"TQ202"}
    assert all("cudaDeviceSynchronize" in f["message"] for f in appeared)
    text = run("check", ALEXNET, "--baseline", base, "--fail-on-new-findings")
    assert text.exit_code == 1 and "TQ202" in text.output
    same = run("check", ALEXNET, "--baseline", ALEXNET, "--fail-on-new-findings")
    assert same.exit_code == 0, same.output


# -- diff --by module ---------------------------------------------------------------------


def _module_spans(document: dict[str, Any], module: str) -> list[tuple[int, int]]:
    return [
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in document["traceEvents"]
        if e.get("ph") == "X" and e.get("name") == f"nn.Module: {module}"
    ]


def _outermost_op_time_per_step(document: dict[str, Any], spans: list[tuple[int, int]]) -> float:
    """Mean per ProfilerStep of the time of the outermost ops inside `spans` (a CPU-only
    trace: a module's time is the CPU time of the ops it holds)."""
    ops = [
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in document["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    ]
    inside = [o for o in ops if any(s <= o[0] and o[1] <= e for s, e in spans)]
    outer = [o for o in inside if not any(p != o and p[0] <= o[0] and o[1] <= p[1] for p in inside)]
    steps = [e for e in document["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#")]
    return sum(e - s for s, e in outer) / len(steps)


def test_diff_by_module_shows_the_slower_module(tmp_path: Path) -> None:
    document = read_json(MLP, parse_float=Decimal)
    spans = _module_spans(document, "Linear_1")
    assert len(spans) == 3  # one forward per step
    slow = write_json(
        warp(document, [(s, e, Decimal("0.3")) for s, e in spans]), tmp_path / "s.json"
    )
    done = run("diff", MLP, slow, "--by", "module", "--format", "json")
    assert done.exit_code == 0, done.output
    rows = {g["group"]: g for g in json.loads(done.stdout)["groups"]}
    fc2 = rows["MlpGelu_0.Linear_1"]
    assert fc2["base_ns"] == pytest.approx(_outermost_op_time_per_step(document, spans))
    assert fc2["rel"] == pytest.approx(0.30, abs=1e-4)
    for name in ("MlpGelu_0.Linear_0", "MlpGelu_0.GELU_0"):
        assert rows[name]["rel"] == 0, name
    text = run("diff", MLP, slow, "--by", "module")
    assert text.exit_code == 0 and "MlpGelu_0.Linear_1" in text.output
    # the same comparison through the Python API, on the same groups
    result = diff(traceq.load(MLP), traceq.load(slow), by="module")
    assert set(result.groups["group"]) == set(rows)


def test_the_gate_reads_module_metrics_too(tmp_path: Path) -> None:
    document = read_json(MLP, parse_float=Decimal)
    spans = _module_spans(document, "Linear_1")
    slow = write_json(
        warp(document, [(s, e, Decimal("0.3")) for s, e in spans]), tmp_path / "s.json"
    )
    result = check(
        slow, summarize(traceq.load(MLP), findings=False), metrics=["module:MlpGelu_0.Linear_1"]
    )
    (metric,) = result.metrics
    assert metric.change.rel == pytest.approx(0.30, abs=1e-4)
