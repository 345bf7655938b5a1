"""The dependency graph (`traceq.relations.graph`): edges against the raw JSON, syncs, replays.

Independent counts come from the trace documents decoded by the stdlib `json`, grouped
with plain dicts. Real traces (skipped when ../shared/traces is absent), all from
facebookresearch/HolisticTraceAnalysis (MIT), tests/data/:
- critical_path/alexnet, critical_path/cuda_event_sync, critical_path/cuda_event_sync_multi_stream
  (A100, with `cuda_sync` events; the expected sync edges are the ones HTA's own
  tests/test_critical_path_analysis.py asserts);
- trace_diff/test/test.json.gz (V100, CUDA graph replays via cudaGraphLaunch);
- df_index_resolver/df_index_resolver.json.gz (V100, 216k events, no `cuda_sync`).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import networkx as nx
import polars as pl
import pytest
from conftest import read_json

import traceq
from traceq.relations.graph import build_graph, graph_edges, host_waits, stream_waits, unlinked

ALEXNET = "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
EVENT_SYNC = "hta/tests/data/critical_path/cuda_event_sync/event_sync_trace.json.gz"
MULTI_STREAM = "hta/tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz"
GRAPH_REPLAY = "hta/tests/data/trace_diff/test/test.json.gz"
DF_INDEX = "hta/tests/data/df_index_resolver/df_index_resolver.json.gz"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
CPU_CATS = {"cpu_op", "cuda_runtime", "cuda_driver"}


def _raw(shared_trace: Callable[[str], Path], relpath: str) -> tuple[traceq.Trace, list[dict]]:
    path = shared_trace(relpath)
    return traceq.load(path), read_json(path)["traceEvents"]


def _expected_counts(raw: list[dict]) -> dict[str, int]:
    """Edges per kind, counted from the raw events: consecutive pairs per stream and per
    thread, and GPU activities whose correlation has a runtime call."""
    streams: Counter = Counter()
    threads: Counter = Counter()
    runtime_correlations = set()
    gpu = []
    for e in raw:
        if e.get("ph") != "X":
            continue
        cat = (e.get("cat") or "").lower()
        if cat in GPU_CATS:
            args = e.get("args", {})
            streams[(args.get("device", e["pid"]), args.get("stream", e["tid"]))] += 1
            gpu.append(args.get("correlation"))
        elif cat in CPU_CATS:
            threads[(e["pid"], e["tid"])] += 1
            if cat != "cpu_op" and "correlation" in e.get("args", {}):
                runtime_correlations.add(e["args"]["correlation"])
    return {
        "stream": sum(n - 1 for n in streams.values()),
        "cpu_order": sum(n - 1 for n in threads.values()),
        "launch": sum(1 for c in gpu if c in runtime_correlations),
    }


@pytest.mark.parametrize("relpath", [ALEXNET, EVENT_SYNC, MULTI_STREAM])
def test_edge_counts_match_the_raw_events(shared_trace, relpath: str) -> None:
    trace, raw = _raw(shared_trace, relpath)
    counts = dict(graph_edges(trace, "full")["kind"].value_counts().iter_rows())
    for kind, expected in _expected_counts(raw).items():
        assert counts.get(kind, 0) == expected, kind


def test_fixture_edge_counts_match_the_raw_events(repo_root: Path) -> None:
    path = repo_root / "fixtures" / "mlp_gelu-train.pt.trace.json.gz"
    if not path.is_file():
        pytest.skip("fixture not recorded")
    trace = traceq.load(path)
    raw = read_json(path)["traceEvents"]
    counts = dict(graph_edges(trace, "full")["kind"].value_counts().iter_rows())
    assert counts["cpu_order"] == _expected_counts(raw)["cpu_order"]
    flows = [e for e in raw if e.get("cat") == "fwdbwd" and e.get("ph") == "f"]
    assert counts["fwdbwd"] == len(flows) > 0
    assert "stream" not in counts and "launch" not in counts  # a CPU-only trace


def test_every_kernel_is_reachable_from_its_launch(shared_trace) -> None:
    trace, raw = _raw(shared_trace, ALEXNET)
    graph = build_graph(trace, level="kernel")
    by_correlation = {
        e["args"]["correlation"]: i
        for i, e in enumerate(raw)
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    launched = [
        (by_correlation[e["args"]["correlation"]], i)
        for i, e in enumerate(raw)
        if e.get("cat") in GPU_CATS and e.get("args", {}).get("correlation") in by_correlation
    ]
    assert len(launched) == 98
    for call, kernel in launched:
        assert graph.edges[call, kernel]["kind"] == "launch"
        assert nx.has_path(graph, call, kernel)
        assert graph.nodes[kernel]["kind"] in {"kernel", "memcpy", "memset"}


def test_host_syncs_follow_the_cuda_sync_events(shared_trace) -> None:
    """HTA's test: spin_kernel (33) -> cudaEventSynchronize (41) and
    cudaDeviceSynchronize (51); the memcpy (23) -> cudaStreamSynchronize (29)."""
    trace, raw = _raw(shared_trace, EVENT_SYNC)
    waits = set(host_waits(trace).select("src", "dst").iter_rows())
    assert {(33, 41), (33, 51), (23, 29)} <= waits
    syncs = [e for e in raw if e.get("cat") == "cuda_sync"]
    calls = {
        e["args"]["correlation"]: i
        for i, e in enumerate(raw)
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    waited = {dst for _, dst in waits}
    for sync in syncs:  # every sync the trace recorded has an edge into its call
        assert calls[sync["args"]["correlation"]] in waited, sync["name"]


def test_cross_stream_sync_edges(shared_trace) -> None:
    """HTA's tests: kernel 24 (stream 20) -> memset 84 (stream 24) in the multi-stream
    trace; fft kernel 1109 -> elementwise kernel 1161 in AlexNet."""
    trace, raw = _raw(shared_trace, MULTI_STREAM)
    edges = graph_edges(trace, "kernel")
    cross = edges.filter(pl.col("kind") == "cross_stream_sync")
    assert set(cross.select("src", "dst").iter_rows()) == {(24, 84)}
    assert raw[24]["args"]["stream"] != raw[84]["args"]["stream"]

    trace, raw = _raw(shared_trace, ALEXNET)
    found = set(stream_waits(trace).select("src", "dst").iter_rows())
    assert found == _stream_waits_by_hand(raw)
    assert (1109, 1161) in found
    for src, dst in found:
        assert raw[src]["args"]["stream"] != raw[dst]["args"]["stream"]
        assert raw[src]["ts"] + raw[src]["dur"] <= raw[dst]["ts"]  # dst waited for src


def _stream_waits_by_hand(raw: list[dict]) -> set[tuple[int, int]]:
    """Each recorded wait: the last activity launched onto the recorded stream before the
    cudaEventRecord -> the first one launched onto the waiting stream, from the same
    thread, after the cudaStreamWaitEvent (the last wait before a kernel wins)."""
    calls = {
        e["args"]["correlation"]: e
        for e in raw
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    activities = [
        (calls[e["args"]["correlation"]], i, e)
        for i, e in enumerate(raw)
        if e.get("cat") in GPU_CATS and e.get("args", {}).get("correlation") in calls
    ]
    waits = sorted(
        (e for e in raw if e.get("name") == "Stream Wait Event"),
        key=lambda e: calls[e["args"]["correlation"]]["ts"],
    )
    pairs: dict[int, int] = {}
    for wait in waits:
        args = wait["args"]
        record = calls.get(args.get("wait_on_cuda_event_record_corr_id", -1))
        call = calls[args["correlation"]]
        if record is None or args["wait_on_stream"] < 0:
            continue
        before = [
            (launch["ts"], i)
            for launch, i, e in activities
            if e["args"]["stream"] == args["wait_on_stream"] and launch["ts"] < record["ts"]
        ]
        after = [
            (launch["ts"], i)
            for launch, i, e in activities
            if e["args"]["stream"] == args["stream"]
            and launch["tid"] == call["tid"]
            and launch["ts"] > call["ts"]
        ]
        if before and after:
            pairs[min(after)[1]] = max(before)[1]
    return {(src, dst) for dst, src in pairs.items()}


def test_graph_replays_link_what_they_can_and_count_the_rest(shared_trace) -> None:
    trace, raw = _raw(shared_trace, GRAPH_REPLAY)
    calls = {
        e["args"]["correlation"]
        for e in raw
        if e.get("name") == "cudaGraphLaunch" and "correlation" in e.get("args", {})
    }
    replayed = [
        i
        for i, e in enumerate(raw)
        if e.get("cat") in GPU_CATS and e.get("args", {}).get("correlation") in calls
    ]
    counts = unlinked(trace)
    assert counts["graph_launches"] == len(calls) == 12
    assert counts["graph_kernels_linked"] == len(replayed)
    graph = build_graph(trace, level="kernel")
    assert graph.graph["unlinked"] == counts
    assert all(graph.in_degree(k) >= 1 for k in replayed)
    assert sum(
        1 for k in replayed for _, _, d in graph.in_edges(k, data=True) if d["kind"] == "launch"
    ) == len(replayed)


@pytest.mark.slow
def test_kernel_graph_of_a_216k_event_trace_is_small_and_quick(load_shared) -> None:
    """No `cuda_sync` events: device syncs come from call names; stream waits cannot be
    resolved and are counted, not dropped."""
    trace = load_shared(DF_INDEX)
    started = time.perf_counter()
    graph = build_graph(trace, level="kernel")
    elapsed = time.perf_counter() - started
    launching = trace.runtime.filter(pl.col("name").str.contains("Launch|Memcpy|Memset"))
    assert graph.number_of_nodes() <= trace.kernels.height + launching.height + 10
    assert graph.number_of_nodes() >= trace.kernels.height
    waits = trace.runtime.filter(pl.col("name") == "cudaStreamWaitEvent").height
    assert graph.graph["unlinked"]["stream_waits_unresolved"] == waits == 6060
    synced = trace.runtime.filter(pl.col("name") == "cudaDeviceSynchronize")["event"].to_list()
    kinds = defaultdict(set)
    for _src, dst, data in graph.edges(data=True):
        kinds[data["kind"]].add(dst)
    assert set(synced) <= kinds["host_sync"]
    assert elapsed < 10  # ~1.5 s here, networkx being most of it


@pytest.mark.parametrize("relpath", [ALEXNET, MULTI_STREAM])
def test_two_loads_give_the_same_rows_in_the_same_order(shared_trace, relpath: str) -> None:
    """Ties (flows starting together, activities starting together) are broken by event id,
    so frames and edges do not reorder between runs (a baseline diff would flicker)."""
    first, second = (traceq.load(shared_trace(relpath)) for _ in range(2))
    assert first.flows.equals(second.flows)
    assert host_waits(first).equals(host_waits(second))
    for level in ("op", "kernel"):
        assert graph_edges(first, level=level).equals(graph_edges(second, level=level))
