"""The `Trace` API beyond the frames: where a trace can come from, and the questions asked
most (kernels of an op or module, time per step, top kernels, GPU busy and idle time).

Every number is checked against the file read with the stdlib and computed in plain
Python. Sources and licenses (../shared/traces/INDEX.md): HolisticTraceAnalysis test data
(facebookresearch/HolisticTraceAnalysis, MIT), TraceLens test traces (AMD-AGI/TraceLens,
MIT); fixtures are this project's own recordings.
"""

from __future__ import annotations

import bisect
import gzip
import io
import re
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import traceq

SAMPLED = "hta/tests/data/timeline_analysis/sampled_rank-0.json.gz"  # 2 steps, 5 streams
MTIA = "hta/tests/data/mtia_inference_trace/mtia_inference_rank_0.json.gz"  # 12 streams
QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"  # with_modules
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "mtia_runtime"}
STEP = re.compile(r"^ProfilerStep#(\d+)$")

Loader = Callable[[str], traceq.Trace]
Reader = Callable[..., Any]


def ns(value: Any) -> int:
    return int(Decimal(value) * 1000)


@pytest.fixture(scope="module")
def stdlib(shared_trace: Callable[[str], Path], read_json: Reader) -> Callable[[str], Any]:
    cache: dict[str, Any] = {}

    def read(relpath: str) -> list[dict[str, Any]]:
        if relpath not in cache:
            cache[relpath] = read_json(shared_trace(relpath), parse_float=Decimal)["traceEvents"]
        return cache[relpath]

    return read


def gpu_events(raw: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, e) for i, e in enumerate(raw) if e.get("ph") == "X" and e.get("cat") in GPU_CATS]


# -- where a trace comes from -----------------------------------------------------------


def test_binary_file_objects_load_like_paths(fixture_traces: list[Path]) -> None:
    path = fixture_traces[0]
    expected = traceq.load(path).events
    with path.open("rb") as f:
        from_file = traceq.load(f)
    assert from_file.source == str(path)
    assert_frame_equal(from_file.events, expected)
    plain = io.BytesIO(gzip.decompress(path.read_bytes()))
    assert_frame_equal(traceq.load(plain).events, expected)
    assert traceq.load(io.BytesIO(path.read_bytes())).source == "<stream>"


def test_pt_trace_json_names_load_gzipped_or_not(fixture_traces: list[Path], tmp_path) -> None:
    path = fixture_traces[0]
    expected = traceq.load(path).events
    plain = tmp_path / "worker0.1623143089861.pt.trace.json"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    assert_frame_equal(traceq.load(plain).events, expected)
    mislabelled = tmp_path / "gzipped-but-named.json"  # gzip is known by its bytes, not name
    mislabelled.write_bytes(path.read_bytes())
    assert_frame_equal(traceq.load(str(mislabelled)).events, expected)


# -- questions ----------------------------------------------------------------------------


def test_gpu_busy_is_the_union_of_activity_intervals(load_shared: Loader, stdlib) -> None:
    for relpath in (SAMPLED, MTIA):
        by_device: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for _, e in gpu_events(stdlib(relpath)):
            device = (e.get("args") or {}).get("device", e["pid"])
            by_device[int(device)].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
        expected = {}
        for device, spans in by_device.items():
            busy, reach = 0, None
            for start, end in sorted(spans):
                if reach is None or start > reach:
                    busy, reach = busy + end - start, end
                elif end > reach:
                    busy, reach = busy + end - reach, end
            span = max(e for _, e in spans) - min(s for s, _ in spans)
            expected[device] = (busy, span, span - busy)
        found = load_shared(relpath).gpu_busy()
        got = {r["device"]: (r["busy_ns"], r["span_ns"], r["idle_ns"]) for r in found.to_dicts()}
        assert got == expected
        total = sum(e - s for spans in by_device.values() for s, e in spans)
        assert sum(b for b, _, _ in expected.values()) < total  # streams overlap: not a sum


def test_top_kernels_rank_names_by_total_gpu_time(load_shared: Loader, stdlib) -> None:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for _, e in gpu_events(stdlib(SAMPLED)):
        totals[e["name"]][0] += 1
        totals[e["name"]][1] += ns(e["dur"])
    grand = sum(t for _, t in totals.values())
    top = load_shared(SAMPLED).top_kernels(5)
    assert top.height == 5
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])
    assert top["name"].to_list() == [name for name, _ in ranked[:5]]
    for row in top.to_dicts():
        count, total = totals[row["name"]]
        assert (row["count"], row["total_ns"]) == (count, total)
        assert row["pct"] == pytest.approx(100 * total / grand)


def test_step_times_sum_what_each_step_launched(load_shared: Loader, stdlib) -> None:
    raw = stdlib(SAMPLED)
    windows = sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), int(m.group(1)))
        for e in raw
        if e.get("ph") == "X" and (m := STEP.match(str(e.get("name"))))
    )
    launch_ts = {
        e["args"]["correlation"]: ns(e["ts"])
        for e in raw
        if e.get("ph") == "X" and e.get("cat") in RUNTIME_CATS and "correlation" in e["args"]
    }
    gpu: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for _, e in gpu_events(raw):
        ts = launch_ts.get(e["args"].get("correlation"), ns(e["ts"]))
        at = bisect.bisect_right([w[0] for w in windows], ts) - 1
        if at >= 0 and ts < windows[at][1]:
            gpu[windows[at][2]][0] += ns(e["dur"])
            gpu[windows[at][2]][1] += 1
    expected = [
        {"step": step, "cpu_ns": end - start, "gpu_ns": gpu[step][0], "kernels": gpu[step][1]}
        for start, end, step in sorted(windows, key=lambda w: w[2])
    ]
    assert len(expected) == 2 and all(row["kernels"] > 0 for row in expected)
    assert load_shared(SAMPLED).step_times().to_dicts() == expected


def launched_within(raw: list[dict[str, Any]], windows: list[tuple[Any, int, int]]) -> set[int]:
    """GPU activities whose launching runtime call lies in one of the (thread, start, end)
    windows: what `kernels_of` should return for the op or module calls behind them."""
    runtime = {
        e["args"]["correlation"]: ((e["pid"], e["tid"]), ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in raw
        if e.get("ph") == "X" and e.get("cat") in RUNTIME_CATS and "correlation" in e["args"]
    }
    found = set()
    for i, e in gpu_events(raw):
        call = runtime.get((e.get("args") or {}).get("correlation"))
        if call and any(t == call[0] and s <= call[1] and call[2] <= end for t, s, end in windows):
            found.add(i)
    return found


def test_kernels_of_an_op_name_are_those_launched_inside_its_calls(
    load_shared: Loader, stdlib
) -> None:
    raw = stdlib(SAMPLED)
    name = "aten::linear"
    calls = [
        ((e["pid"], e["tid"]), ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in raw
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e.get("name") == name
    ]
    expected = launched_within(raw, calls)
    assert len(calls) > 1 and len(expected) >= len(calls)
    trace = load_shared(SAMPLED)
    assert set(trace.kernels_of(name)["event"].to_list()) == expected
    one = trace.ops.filter(pl.col("name") == name).row(0, named=True)
    first = launched_within(raw, [((one["pid"], one["tid"]), one["ts_ns"], one["end_ns"])])
    assert set(trace.kernels_of(one["event"])["event"].to_list()) == first


def test_kernels_of_a_module_path_include_its_submodules(load_shared: Loader, stdlib) -> None:
    raw = stdlib(QWEN)
    trace = load_shared(QWEN)
    layer = trace.modules.filter(pl.col("path").str.ends_with("Qwen2DecoderLayer_1")).row(
        0, named=True
    )
    calls = trace.modules.filter(pl.col("path") == layer["path"])
    windows = [((r["pid"], r["tid"]), r["ts_ns"], r["end_ns"]) for r in calls.to_dicts()]
    expected = launched_within(raw, windows)
    assert expected
    found = trace.kernels_of(layer["path"])
    assert set(found["event"].to_list()) == expected
    assert found["ts_ns"].is_sorted()
    root = layer["path"].split(".")[0]
    assert set(trace.kernels_of(root)["event"]) > set(found["event"])
