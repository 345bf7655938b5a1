"""The critical path (`traceq.relations.critical_path`), side by side with Holistic Trace Analysis.

HTA's own critical path (`hta.analyzers.critical_path_analysis`) is not a traceq
dependency. `benchmarks/hta_reference.py`, run with HTA's separate environment
(/work/venv-hta), wrote its numbers to `fixtures/gpu/hta_critical_path.json` with each
trace's checksum; every run compares traceq with those numbers, and where HTA's
environment exists, a live HTA run checks that they are still HTA's. Traces:
facebookresearch/HolisticTraceAnalysis tests/data (MIT) - critical_path/{alexnet,
cuda_event_sync} and timeline_analysis/sampled_rank-0 bundled in fixtures/gpu/;
critical_path/{simple_add, cuda_event_sync_multi_stream}, ns_resolution_trace and
df_index_resolver from ../shared/traces (skipped when absent) - and the project's own
fixtures.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import GPU_FIXTURES, REPO_ROOT, SHARED_TRACES, read_json
from traceq.cli.main import main

import traceq
from traceq.relations.critical_path import CAUSES, critical_path

SOURCES = GPU_FIXTURES / "sources.json"
HTA_PYTHON = Path(os.environ.get("TRACEQ_HTA_PYTHON", "/work/venv-hta/bin/python"))
HTA_SCRIPT = REPO_ROOT / "benchmarks" / "hta_reference.py"
# HTA's numbers, committed by benchmarks/hta_reference.py (run in HTA's own environment)
COMMITTED = json.loads((REPO_ROOT / "fixtures" / "gpu" / "hta_critical_path.json").read_text())
CASES = COMMITTED["cases"]
DATA = "hta/tests/data"
ALEXNET_ANNOTATION = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
HTA_BOUND_BY = {
    "cpu_bound": "cpu_bound",
    "gpu_compute_bound": "gpu_compute",
    "gpu_communication_bound": "gpu_communication",
    "gpu_kernel_launch_overhead": "launch_overhead",
    "gpu_kernel_kernel_overhead": "kernel_to_kernel_overhead",
}
WEIGHTED = list(HTA_BOUND_BY.values())
SAME_PATH = ["alexnet", "alexnet_first", "event_sync", "simple_add", "multi_stream"]


def case_file(name: str) -> Path:
    """The case's trace (bundled in fixtures/gpu, or in ../shared: skip when absent),
    checked to be the very file HTA's committed numbers were computed on."""
    case = CASES[name]
    path = (REPO_ROOT if case["where"] == "repo" else SHARED_TRACES) / case["path"]
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == case["sha256"], path
    return path


def _ours(name: str) -> traceq.relations.critical_path.CriticalPath:
    case = CASES[name]
    trace = traceq.load(case_file(name))
    region = (case["annotation"], case["instance"]) if case["annotation"] else None
    return critical_path(trace, region)


@pytest.fixture(scope="module")
def live_hta() -> dict:
    """HTA run now, on every case whose file is here (one subprocess: its import takes
    seconds); skipped where HTA's environment is absent."""
    if not HTA_PYTHON.is_file():
        pytest.skip(f"HTA's environment {HTA_PYTHON} is absent")
    done = subprocess.run(
        [str(HTA_PYTHON), str(HTA_SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if "No module named 'hta'" in done.stderr:
        pytest.skip("HTA is not installed in its environment")
    return {"returncode": done.returncode, "output": done.stdout + done.stderr[-2000:]}


def test_committed_numbers_are_htas_numbers_today(live_hta: dict) -> None:
    """HTA, run live on the same files, gives exactly the committed numbers."""
    assert live_hta["returncode"] == 0, live_hta["output"]
    assert "differ from the committed numbers: none" in live_hta["output"]


def test_committed_numbers_cover_the_bundled_traces() -> None:
    """Every bundled trace with a GPU side (HTA's critical path is built from kernels: on
    `hta-rank_non_gpu`, whose GPU events were removed upstream, HTA 0.5 raises a
    TypeError in `_construct_graph_from_kernels`)."""
    bundled = {c["path"] for c in CASES.values() if c["where"] == "repo"}
    sources = json.loads(SOURCES.read_text())["traces"]
    with_gpu = {name for name, entry in sources.items() if entry.get("gpu_events", True)}
    assert bundled == {f"fixtures/gpu/{name}" for name in with_gpu}
    assert all(c["hta"]["ok"] for c in CASES.values())


@pytest.mark.parametrize("name", SAME_PATH)
def test_breakdown_equals_htas(name: str) -> None:
    """Same graph model, same path: every weighted cause to the microsecond, the same time
    on the path for every event (including the cuda_event_sync and multi-stream cases).
    Where paths of equal weight meet through weightless edges, the two pick different
    ones (networkx keeps the first predecessor it sees, Dijkstra the first it settles):
    only events without time on the path may differ."""
    hta = CASES[name]["hta"]
    ours = _ours(name)
    expected = {HTA_BOUND_BY[k]: us * 1000 for k, us in hta["bound_by_us"].items() if k}
    for cause in WEIGHTED:
        assert ours.breakdown_ns[cause] == expected.get(cause, 0), cause
    assert ours.weight_ns == sum(expected.values())
    assert _per_event_us(ours) == hta["event_us"]
    assert set(map(int, hta["event_us"])) <= set(ours.critical_events)
    assert len(set(ours.critical_events) ^ set(hta["events"])) <= 2
    assert ours.graph_size["nodes"] == hta["nodes"]


def _per_event_us(path: traceq.relations.critical_path.CriticalPath) -> dict[str, int]:
    timed = path.edges.filter((pl.col("weight_ns") > 0) & pl.col("event").is_not_null())
    per_event = timed.group_by("event").agg(pl.col("weight_ns").sum())
    return {str(e): ns // 1000 for e, ns in per_event.iter_rows()}


def test_sampled_rank_differs_from_hta_only_by_the_synchronous_copies() -> None:
    """The sampled NCCL trace (2023, no `cuda_sync` events) has four device->pageable
    copies. Such a copy is synchronous: its `cudaMemcpyAsync` returns only when the copy
    is done. traceq models that wait; HTA 0.5 only knows the waits that `cuda_sync` events
    record. So traceq's path runs through the four copies (GPU time plus the launch
    overhead before each), HTA's does not; everything else agrees to the microsecond, and
    HTA's time on a user annotation is on the op that holds it in traceq (which keeps
    annotations out of the graph)."""
    hta = CASES["sampled_rank0"]["hta"]
    ours = _ours("sampled_rank0")
    raw = read_json(case_file("sampled_rank0"))["traceEvents"]
    extra = set(ours.critical_events) - set(hta["events"])
    assert extra and {raw[e]["name"] for e in extra} == {"Memcpy DtoH (Device -> Pageable)"}
    assert not set(hta["events"]) - set(ours.critical_events)
    copy_ns = sum(round(float(raw[e]["dur"]) * 1000) for e in extra)
    into_copies = ours.edges.filter(
        pl.col("dst_event").is_in(list(extra)) & (pl.col("cause") == "launch_overhead")
    )["weight_ns"].sum()
    expected = {HTA_BOUND_BY[k]: us * 1000 for k, us in hta["bound_by_us"].items()}
    expected["gpu_compute"] += copy_ns
    expected["launch_overhead"] += into_copies
    for cause in WEIGHTED:
        assert ours.breakdown_ns[cause] == expected.get(cause, 0), cause
    assert ours.graph_size["nodes"] == hta["nodes"]
    mine, theirs = _per_event_us(ours), hta["event_us"]
    moved = {e for e in set(mine) | set(theirs) if mine.get(e) != theirs.get(e)}
    assert moved - {str(e) for e in extra} == {"1381", "1382"}
    assert raw[1382]["cat"] == "user_annotation" and raw[1381]["cat"] == "cpu_op"
    assert mine["1381"] == theirs["1381"] + theirs["1382"]


def test_ns_resolution_differs_only_by_htas_rounding() -> None:
    """HTA keeps whole microseconds and drops events that round to 0 us (`dur > 0`), so on
    a ns-resolution trace its graph has fewer points; the split by cause still agrees
    within 2 percentage points."""
    hta = CASES["ns_resolution"]["hta"]
    ours = _ours("ns_resolution")
    assert ours.graph_size["nodes"] > hta["nodes"]
    hta_total = sum(v for k, v in hta["bound_by_us"].items() if k)
    ours_total = ours.weight_ns / 1000
    for hta_key, cause in HTA_BOUND_BY.items():
        theirs = 100 * hta["bound_by_us"].get(hta_key, 0) / hta_total
        mine = 100 * ours.breakdown_ns[cause] / 1000 / ours_total
        assert abs(theirs - mine) < 2.0, cause


def _gpu_union_ns(path: traceq.relations.critical_path.CriticalPath, raw: list[dict]) -> int:
    """Busy time of the path's GPU activities: the union of their intervals (raw JSON)."""
    spans = sorted(
        (float(raw[e]["ts"]), float(raw[e]["ts"]) + float(raw[e]["dur"]))
        for e in path.critical_events
        if raw[e].get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    busy, reach = 0.0, float("-inf")
    for start, end in spans:
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return round(busy * 1000)


REGIONS = [
    ("alexnet", None),
    ("alexnet", (ALEXNET_ANNOTATION, 0)),
    ("event_sync", 100),
    ("multi_stream", None),
    ("sampled_rank0", 551),
    ("ns_resolution", 103),
]


@pytest.mark.parametrize(("name", "region"), REGIONS)
def test_length_lies_between_gpu_busy_time_and_the_region(name: str, region: object) -> None:
    path = case_file(name)
    trace = traceq.load(path)
    found = critical_path(trace, region)
    start, end = found.region
    assert 0 < found.length_ns <= end - start
    assert found.length_ns >= _gpu_union_ns(found, read_json(path)["traceEvents"])
    assert found.weight_ns <= found.length_ns
    assert sum(found.breakdown_ns.values()) == found.length_ns
    assert set(found.breakdown_pct) == set(CAUSES)
    # a path: each edge starts where the previous one ended, and time never runs back
    edges = found.edges
    assert edges["src_event"][1:].to_list() == edges["dst_event"][:-1].to_list()
    assert edges["src_start"][1:].to_list() == edges["dst_start"][:-1].to_list()
    assert found.nodes["ts_ns"].is_sorted()
    assert (edges["wall_ns"] >= 0).all()


def test_fixture_steps(repo_root: Path) -> None:
    """A CPU-only trace: the path is CPU time and the gaps between ops, step by step."""
    path = repo_root / "fixtures" / "mlp_gelu-eager.pt.trace.json.gz"
    if not path.is_file():
        pytest.skip("fixture not recorded")
    trace = traceq.load(path)
    for step, start, end in trace.steps.select("step", "ts_ns", "end_ns").iter_rows():
        found = critical_path(trace, step)
        assert found.region == (start, end)
        assert found.length_ns <= end - start
        assert found.breakdown_ns["gpu_compute"] == 0
        top = found.top(3)
        assert top["name"].to_list()[0].startswith("aten::")
        ops = trace.ops.filter(pl.col("step") == step)
        assert set(found.critical_events) <= set(ops["event"].cast(pl.Int64))


def test_bad_regions_are_trace_errors(repo_root: Path) -> None:
    path = repo_root / "fixtures" / "mlp_gelu-eager.pt.trace.json.gz"
    if not path.is_file():
        pytest.skip("fixture not recorded")
    trace = traceq.load(path)
    for region in (99, ("no such annotation", 0), ("ProfilerStep#3", 5), (10, 5)):
        with pytest.raises(traceq.TraceError):
            critical_path(trace, region)


def test_cli_json_and_errors(repo_root: Path) -> None:
    path = repo_root / "fixtures" / "mlp_gelu-eager.pt.trace.json.gz"
    if not path.is_file():
        pytest.skip("fixture not recorded")
    runner = CliRunner()
    done = runner.invoke(main, ["critical-path", str(path), "--step", "3", "--format", "json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    expected = critical_path(traceq.load(path), 3)
    assert data["length_us"] == expected.length_us
    assert set(data["breakdown_pct"]) == set(CAUSES)
    assert abs(sum(data["breakdown_pct"].values()) - 100) < 1e-9
    assert [t["event"] for t in data["top"]] == expected.top(10)["event"].to_list()
    text = runner.invoke(main, ["critical-path", str(path), "--annotation", "ProfilerStep#3"])
    assert text.exit_code == 0 and "CPU-bound" in text.output
    bad = runner.invoke(main, ["critical-path", str(path), "--step", "42"])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [
        "traceq: error: no ProfilerStep#42 in the trace (steps: 2, 3, 4)"
    ]
    both = runner.invoke(main, ["critical-path", str(path), "--step", "3", "--annotation", "x"])
    assert both.exit_code == 2


@pytest.mark.slow
def test_216k_event_trace_matches_hta_and_is_fast() -> None:
    """HTA's committed numbers for ProfilerStep#2 of df_index_resolver (45,084 graph
    nodes): 238,893 us CPU-bound and nothing else weighted; HTA needs 1.1-1.7 s (5 s on
    this loaded 2-core machine) for the path alone."""
    hta = CASES["df_index_resolver"]["hta"]
    trace = traceq.load(case_file("df_index_resolver"))
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        found = critical_path(trace, ("ProfilerStep", 0))
        timings.append(time.perf_counter() - started)
    assert found.graph_size["nodes"] == hta["nodes"] == 45_084
    expected = {HTA_BOUND_BY[k]: us * 1000 for k, us in hta["bound_by_us"].items()}
    assert expected == {"cpu_bound": 238_893_000}
    for cause in WEIGHTED:
        assert found.breakdown_ns[cause] == expected.get(cause, 0), cause
    assert min(timings) < 1.0, timings  # 0.12-0.25 s measured here
    print(
        f"critical path of df_index_resolver ProfilerStep#2: {min(timings):.3f} s", file=sys.stderr
    )
