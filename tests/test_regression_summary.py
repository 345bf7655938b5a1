"""Per-step group samples (`summarize`) against computations that do not share its code:
the stdlib `json` over the raw events, and the loader's own `Trace.kernels_of`.

Real traces: `trace_compare/base` and `trace_diff/control` from
facebookresearch/HolisticTraceAnalysis (MIT), under ../shared/traces/hta/tests/data/.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceq
from traceq.regression.summary import summarize

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def raw_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rb") as f:
        return json.load(f, parse_float=Decimal)["traceEvents"]


def ns(value: Any) -> int:
    return int(Decimal(str(value)) * 1000)


def stdlib_top_level_op_time(path: Path) -> dict[int, int]:
    """Per ProfilerStep: the summed duration of `cpu_op` events no other `cpu_op` on the same
    thread encloses — the CPU time of the step's ops, counted once (quadratic: tiny traces)."""
    events = raw_events(path)
    steps = {
        int(e["name"].split("#")[1]): (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    }
    ops = [
        (i, e["tid"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for i, e in enumerate(events)
        if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    ]

    def encloses(a: tuple[int, Any, int, int], b: tuple[int, Any, int, int]) -> bool:
        if a[0] == b[0] or a[1] != b[1] or not (a[2] <= b[2] and b[3] <= a[3]):
            return False
        return (a[2], -a[3], a[0]) < (b[2], -b[3], b[0])  # identical spans: the first encloses

    top = [b for b in ops if not any(encloses(a, b) for a in ops)]
    out: dict[int, int] = defaultdict(int)
    for _, _, start, end in top:
        for step, (s, e) in steps.items():
            if s <= start < e:
                out[step] += end - start
    return dict(out)


def test_cpu_op_time_per_step_matches_the_stdlib() -> None:
    path = FIXTURES / "mlp_gelu-eager.pt.trace.json.gz"
    summary = summarize(traceq.load(path), findings=False)
    expected = stdlib_top_level_op_time(path)
    assert summary.basis == "cpu"
    assert dict(zip(summary.steps, summary.step_time_ns, strict=True)) == expected
    # Op groups split that time without double counting: they add up to it, step by step.
    names = summary.group_names("op")
    per_step = summary.samples("op", names).sum(axis=0)
    assert per_step.tolist() == [float(expected[s]) for s in summary.steps]


def test_step_wall_time_is_the_profiler_step_duration() -> None:
    path = FIXTURES / "mlp_gelu-eager.pt.trace.json.gz"
    summary = summarize(traceq.load(path), findings=False)
    steps = {
        int(e["name"].split("#")[1]): ns(e["dur"])
        for e in raw_events(path)
        if str(e.get("name", "")).startswith("ProfilerStep#")
    }
    assert dict(zip(summary.steps, summary.step_wall_ns, strict=True)) == steps


def test_an_op_group_holds_the_op_called_with_everything_beneath_it() -> None:
    trace = traceq.load(FIXTURES / "mlp_gelu-eager.pt.trace.json.gz")
    summary = summarize(trace, findings=False)
    linear = trace.ops.filter(pl.col("name") == "aten::linear")
    expected = linear.group_by("step").agg(pl.col("dur_ns").sum()).sort("step")
    samples = summary.samples("op", ["aten::linear"])[0]
    assert samples.tolist() == [float(v) for v in expected["dur_ns"]]
    assert "aten::addmm" not in summary.group_names("op")  # it runs inside aten::linear


def test_kernel_groups_match_the_stdlib_count_and_duration(shared_trace: Any) -> None:
    path = shared_trace("hta/tests/data/trace_compare/base/base.json.gz")
    summary = summarize(traceq.load(path), findings=False)
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in raw_events(path):
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS:
            expected[e["name"]][0] += 1
            expected[e["name"]][1] += ns(e["dur"])
    totals = summary.totals("kernel")
    got = {g: [c, t] for g, c, t in totals.iter_rows()}
    assert got == dict(expected)
    assert summary.basis == "gpu"
    assert summary.total_time_ns == sum(t for _, t in expected.values())


@pytest.mark.slow
def test_gpu_time_of_an_op_group_is_the_time_of_the_kernels_it_launched(load_shared: Any) -> None:
    trace = load_shared("hta/tests/data/trace_diff/control/control.json.gz")
    summary = summarize(trace, findings=False)
    totals = dict(summary.totals("op").select("group", "time_ns").iter_rows())
    for op in ("aten::linear", "aten::layer_norm", "aten::mul"):
        assert totals[op] == trace.kernels_of(op)["dur_ns"].sum(), op
    # Per step, the kernel groups add up to the loader's own per-step GPU time.
    kernels = summary.samples("kernel", summary.group_names("kernel")).sum(axis=0)
    assert kernels.tolist() == [float(v) for v in trace.step_times()["gpu_ns"]]


def test_a_compiled_module_path_matches_its_eager_path() -> None:
    eager = summarize(traceq.load(FIXTURES / "matmul_add-eager.pt.trace.json.gz"), findings=False)
    compiled = summarize(
        traceq.load(FIXTURES / "matmul_add-compiled.pt.trace.json.gz"), findings=False
    )
    assert eager.group_names("module") == ["MatmulAdd_0"]
    assert compiled.group_names("module") == ["MatmulAdd_0"]  # OptimizedModule_0. dropped


def test_metadata_keeps_device_and_versions_only() -> None:
    trace = traceq.load(FIXTURES / "matmul_add-eager.pt.trace.json.gz")
    assert "host_name" in trace.metadata  # the trace has one ...
    metadata = summarize(trace, findings=False).metadata
    assert set(metadata) == {"vendor", "devices", "dtype", "versions", "world_size"}
    assert trace.metadata["host_name"] not in json.dumps(metadata)  # ... the summary does not
    assert metadata["vendor"] == "cpu" and metadata["dtype"] == "float"
