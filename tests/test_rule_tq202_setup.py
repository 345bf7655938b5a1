"""TQ202 host-sync judged on the steady state only, with fixes that name the real cause.

- Syncs inside CUDA-graph capture, compilation, an engine's warm-up or the profiler's own
  stop are setup: the real vLLM and SGLang capture traces (TraceLens, MIT, bundled in
  `fixtures/serving/`) each hold `hipDeviceSynchronize` / `hipEventSynchronize` calls under
  `capture_32_*` ranges and `torch/cuda/graphs.py` frames, found here in the raw JSON; none
  is a finding.
- ROCm's blocking `hipMemcpyWithStream` is a sync like the CUDA ones.
- `if t:` on a tensor runs `aten::is_nonzero`: its fix names the Python branch, not
  `torch.cuda.synchronize()`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, gpu_fixture, write_json

import traceq

SERVING = FIXTURES / "serving"
CAPTURES = [
    next((SERVING / "vllm_decode_full/capture_traces").glob("*.pt.trace.json.gz")),
    SERVING / "sglang_decode/capture_traces/bs_32_rank0.json.gz",
]


def raw_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def syncs_under_capture(events: list[dict[str, Any]]) -> int:
    """Sync calls (raw JSON) enclosed, on their thread, by a capture range or a
    `torch/cuda/graphs.py` / profiler frame: what a person reading the trace calls setup."""
    spans = [
        e
        for e in events
        if e.get("ph") == "X"
        and (
            str(e.get("name", "")).startswith(("capture_", "torch/cuda/graphs.py("))
            or str(e.get("name", "")).startswith("torch/profiler/profiler.py(")
        )
    ]
    count = 0
    for e in events:
        if e.get("cat") == "cuda_runtime" and "Synchronize" in str(e.get("name")):
            start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            if any(
                s["tid"] == e["tid"]
                and float(s["ts"]) <= start
                and end <= float(s["ts"]) + float(s["dur"])
                for s in spans
            ):
                count += 1
    return count


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.parts[-3])
def test_syncs_during_graph_capture_are_setup_not_findings(path: Path) -> None:
    events = raw_events(path)
    assert syncs_under_capture(events) >= 2  # the trace does hold them
    findings = traceq.analyze(traceq.load(path, cache=False), select=["TQ202"])
    assert findings == []


def test_hip_memcpy_with_stream_is_a_sync(tmp_path: Path) -> None:
    """The same trace with its blocking calls renamed to ROCm's `hipMemcpyWithStream`
    gives the same host-sync findings (same waits, same bubbles)."""
    source = gpu_fixture("hta-alexnet-a100")
    original = traceq.analyze(traceq.load(source, cache=False), select=["TQ202"])
    explicit = [f for f in original if f.evidence["sync_call"] == "cudaDeviceSynchronize"]
    assert explicit
    with gzip.open(source, "rt") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        if e.get("name") == "cudaDeviceSynchronize":
            e["name"] = "hipMemcpyWithStream"
    renamed = traceq.analyze(
        traceq.load(write_json(doc, tmp_path / "rocm.json"), cache=False), select=["TQ202"]
    )
    as_hip = [f for f in renamed if f.evidence["sync_call"] == "hipMemcpyWithStream"]
    assert [(f.est_saving_us, f.step) for f in as_hip] == [
        (f.est_saving_us, f.step) for f in explicit
    ]


def _cpu_branch_trace(path: Path) -> Path:
    """One step of a CPU trace as the profiler records `if t:` on a tensor:
    `aten::is_nonzero` running `aten::item` running `aten::_local_scalar_dense`."""

    def op(name: str, ts: int, dur: int) -> dict[str, Any]:
        where = {"pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {"External id": ts}}
        return {"ph": "X", "cat": "cpu_op", "name": name} | where

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1"}
        | {"pid": 1, "tid": 1, "ts": 0, "dur": 100},
        op("aten::is_nonzero", 10, 30),
        op("aten::item", 12, 25),
        op("aten::_local_scalar_dense", 14, 20),
    ]
    return write_json({"schemaVersion": 1, "traceEvents": events}, path)


def test_a_python_branch_on_a_tensor_is_named_with_its_fix(tmp_path: Path) -> None:
    trace = traceq.load(_cpu_branch_trace(tmp_path / "branch.json"), cache=False)
    (finding,) = traceq.analyze(trace, select=["TQ202"])
    assert finding.message.startswith("aten::is_nonzero reads a tensor value")
    assert "`if`" in finding.fix and "synchronize()" not in finding.fix
