"""Graph-replayed kernels get the ops that launched them during capture, on the two bundled
serving traces (`fixtures/serving/`: vLLM FULL graphs and SGLang decode, both MI300X).

Every expected number is recomputed from the raw JSON with the stdlib: the replayed kernels
are those sharing a `hipGraphLaunch`'s correlation; the captured launches are the launch
calls between `hipStreamBeginCapture` and `hipStreamEndCapture`, in time order; each
launch's op is the innermost `cpu_op` on its thread that encloses it.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

import traceq
from traceq.relations.inference import inference_steps

SERVING = Path(__file__).resolve().parent.parent / "fixtures" / "serving"
CASES = {
    "vllm_decode_full": "graph_execution.json.gz",
    "sglang_decode": "sglang_Qwen3-8B_decode.json.gz",
}


def raw_events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def raw_replayed(events: list[dict]) -> list[dict]:
    """Kernels a graph launch replayed, in time order."""
    graph = {
        e["args"]["correlation"]
        for e in events
        if e.get("cat") == "cuda_runtime" and e["name"].endswith("GraphLaunch")
    }
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted((e for e in gpu if e["args"].get("correlation") in graph), key=lambda e: e["ts"])


def raw_captured(events: list[dict]) -> list[tuple[str, list[str]]]:
    """Per captured launch, in time order: its kernel name and the names of the ops that
    enclose it, innermost first."""
    begin = next(e for e in events if e.get("name", "").endswith("StreamBeginCapture"))
    end = next(e for e in events if e.get("name", "").endswith("StreamEndCapture"))
    launches = sorted(
        (
            e
            for e in events
            if e.get("cat") == "cuda_runtime"
            and "Launch" in e["name"]
            and begin["ts"] <= e["ts"] <= end["ts"]
        ),
        key=lambda e: e["ts"],
    )
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["tid"] == begin["tid"]]
    found = []
    for launch in launches:
        around = [o for o in ops if o["ts"] <= launch["ts"] and launch["ts"] < o["ts"] + o["dur"]]
        around.sort(key=lambda o: o["dur"])
        found.append((launch["args"].get("kernel"), [o["name"] for o in around]))
    return found


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    folder = SERVING / request.param
    replay = folder / CASES[request.param]
    trace = traceq.load(replay)
    events = raw_events(replay)
    capture = next((folder / "capture_traces").glob("*.json.gz"))
    return request.param, trace, raw_replayed(events), raw_captured(raw_events(capture))


def test_replayed_kernel_time_is_attributed_from_the_capture(case):
    _, trace, replayed, _ = case
    kernels = trace.kernels
    ids = {e["args"]["correlation"] for e in replayed}
    rows = kernels.filter(kernels["correlation"].is_in(list(ids)))
    assert rows.height == len(replayed)
    total = sum(e["dur"] for e in replayed)
    paired = rows.filter(rows["replay_method"] != "launch")
    attributed_us = paired["dur_ns"].sum() / 1000
    assert attributed_us >= 0.99 * total
    assert set(paired["replay_method"]) == {"capture-order"}


def test_each_replayed_kernel_has_the_op_that_launched_it_in_capture(case):
    _, trace, replayed, captured = case
    assert [name for name, _ in captured] == [e["name"] for e in replayed]  # the data's premise
    rows = trace.kernels.filter(trace.kernels["replay_method"].is_not_null()).sort("ts_ns")
    assert rows["name"].to_list() == [e["name"] for e in replayed]
    expected = [chain[0] if chain else None for _, chain in captured]
    assert rows["op_name"].to_list() == expected
    assert rows["module"].null_count() == 0


def test_info_reports_the_graph_share_and_its_attribution(case):
    from traceq.reports.summary import summary

    _, trace, replayed, _ = case
    graphs = summary(trace)["graphs"]
    assert graphs["graph_launches"] == 1
    assert graphs["replayed_kernels"] == len(replayed)
    assert graphs["replayed_us"] == pytest.approx(sum(e["dur"] for e in replayed), abs=0.01)
    assert graphs["attributed_share"] >= 0.99
    assert graphs["captures"][0]["batch_size"] == 32


def _tracelens_ops(name: str) -> dict[str, set[str]]:
    """Kernel name -> the ops TraceLens's perf CSV names for it (its pseudo and synthetic
    ops, which no trace records, left out)."""
    ops: dict[str, set[str]] = defaultdict(set)
    path = SERVING / name / "perf_csvs" / "unified_perf_summary.csv"
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["name"].startswith("pseudo_op::") or "(Synthetic Op)" in row["name"]:
                continue
            for kernel in re.findall(
                r"'name': '((?:[^'\\]|\\.)*)', 'stream'", row["kernel_details_summary"]
            ):
                ops[kernel].add(row["name"])
    return ops


def _normal(op: str) -> str:
    return re.sub(r"_\d+$", "", op)  # SGLang's profiler ops carry a layer suffix


def test_attribution_agrees_with_tracelens_where_it_names_the_op(case):
    """TraceLens names the op of a kernel at the level it models (`vllm::rocm_unquantized_gemm`
    around our `aten::addmm`): it must be our op or one around it."""
    name, _, replayed, captured = case
    ops = _tracelens_ops(name)
    checked = 0
    for kernel, (_, chain) in zip(replayed, captured, strict=True):
        named = ops.get(kernel["name"])
        if not named or not chain:
            continue
        checked += 1
        assert {_normal(o) for o in named} & {_normal(o) for o in chain}, kernel["name"]
    assert checked >= 0.5 * len(replayed)


def test_inference_step_is_a_decode_of_32(case):
    _, trace, replayed, _ = case
    steps = inference_steps(trace)
    assert steps.height == 1
    step = steps.row(0, named=True)
    assert (step["phase"], step["batch_size"], step["tokens"]) == ("decode", 32, 32)
    assert step["graph_launches"] == 1
    assert step["replayed_kernels"] == len(replayed)
    assert step["setup_phase"] is None


def test_without_capture_kernels_keep_the_launch_and_say_so():
    replay = SERVING / "sglang_decode" / CASES["sglang_decode"]
    trace = traceq.load(replay, capture=False)
    assert "replay_method" not in trace.kernels.columns
    from traceq.relations.graph_replay import replay_summary

    graphs = replay_summary(trace)
    assert graphs["attributed_share"] == 0.0
    assert set(graphs["by_method"]) == {"launch"}


def test_tq201_names_cuda_graphs_for_an_eager_decode_step():
    import polars as pl

    from traceq.rules.tq201_launch_bound import _fix

    steps = pl.DataFrame({"ts_ns": [100], "end_ns": [200]})
    assert "decode step" in _fix(steps, 150) and "--enforce-eager" in _fix(steps, 150)
    assert "decode step" not in _fix(steps, 250)
