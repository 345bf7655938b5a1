"""TQ212 cpu-fill-then-copy: what PyTorch's `ExtraCUDACopyPattern` finds, from a saved trace.

The matcher needs a live profile; traceq reads the saved one. Two halves are tested:

- the structure (`fill_then_copy`: an op that is, or ends by its last children in, a
  `fill_` / `zero_` / `normal_` / `uniform_`, right before a same-dtype `to` / `copy_`) on a
  CPU profile the matcher runs on in the test itself. The matcher does not check that the
  copy goes to the GPU, so `.to("cpu", copy=True)` (a real `_to_copy` → `copy_`) stands in
  for `.to("cuda")` here; the rule itself needs the `Memcpy HtoD` and stays silent on a
  CPU-only trace.
- the rule on real GPU traces (`fixtures/gpu/hta-*`, HTA's A100 recordings, pageable host →
  device copies): AlexNet's initialization (`uniform_` on the CPU) then `model.to("cuda")`,
  and a documented edit of that trace that puts a `torch.zeros(64)` (with shapes) right
  before the `to` of the 256-byte bias copy.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, read_json

import traceq
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.finding import Finding
from traceq.rules.tq212_cpu_fill_then_copy import fill_then_copy

ALEXNET = FIXTURES / "gpu" / "hta-alexnet-a100.json.gz"


def _findings(path: Path) -> list[Finding]:
    return run(traceq.load(path, cache=False), Config(select=["TQ212"])).findings


def _cpu_workload() -> None:
    import torch

    torch.zeros(64, 32).to("cpu", copy=True)  # filled, then copied: flagged
    torch.randn(16).to("cpu", copy=True)  # normal_, then copied: flagged
    ones = torch.ones(8, 8)
    ones.sum()  # ends in a fill_ of its [1, 1] result: the matcher flags the next copy
    ones.to("cpu", copy=True)
    torch.zeros(8).to(torch.float64)  # a conversion, not a move: neither flags it
    torch.ones(4).relu().to("cpu", copy=True)  # relu in between: neither flags it


def test_the_matcher_and_traceq_agree_on_the_same_cpu_profile(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._pattern_matcher import ExtraCUDACopyPattern

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True) as prof:
        _cpu_workload()
    pattern = ExtraCUDACopyPattern(prof)
    every_to = sorted(
        (e for e in pattern.eventTreeTraversal() if e.name == "aten::to"),
        key=lambda e: e.start_time_ns,
    )
    matched = {every_to.index(e) for e in pattern.matched_events()}
    path = tmp_path / "fill_copy.pt.trace.json"
    prof.export_chrome_trace(str(path))

    trace = traceq.load(path, cache=False)
    to_ops = trace.ops.filter(trace.ops["name"] == "aten::to").sort("ts_ns")["event"].to_list()
    assert len(to_ops) == len(every_to) == 5
    found = fill_then_copy(trace.ops)
    ours = {to_ops.index(e) for e in found["copy"].to_list()}
    # zeros -> to, randn -> to; and the matcher's third: `sum`'s last child fills its [1, 1]
    # result, not the [8, 8] tensor copied (the matcher's "check tensor identities" TODO)
    assert matched == {0, 1, 2}
    assert ours == {0, 1} and found["shapes_checked"].all()
    sum_fill = trace.ops.filter(trace.ops["name"] == "aten::fill_").sort("ts_ns")
    assert [1, 1] in sum_fill["shapes"].list.first().to_list()
    # no host -> device memcpy in a CPU-only trace: no finding
    assert run(trace, Config(select=["TQ212"])).findings == []
    del torch


def test_model_initialized_on_the_cpu_then_moved_is_found_in_a_real_gpu_trace() -> None:
    (finding,) = _findings(ALEXNET)
    assert finding.evidence["op_names"] == ["aten::uniform_", "aten::to"]
    assert finding.evidence["kernel_names"] == ["Memcpy HtoD (Pageable -> Device)"]
    assert finding.evidence["memcpy_bytes"] == 92928  # conv1's [64, 3, 11, 11] fp32 weight
    # recorded without shapes: the matcher's adjacency only, said so
    assert finding.evidence["shapes_checked"] is False
    # the host's time in cudaMemcpyAsync, not the to's 29.9 s of CUDA context set-up
    assert 0 < finding.est_saving_us < 100
    assert 'device="cuda"' in finding.fix and "with torch.device" in finding.fix


def _cpu_op(raw: list[dict[str, Any]], external_id: int) -> dict[str, Any]:
    return next(
        e
        for e in raw
        if e.get("cat") == "cpu_op" and e.get("args", {}).get("External id") == external_id
    )


def _edited_alexnet(tmp_path: Path, zeros_shape: list[int]) -> Path:
    """HTA's AlexNet trace with `torch.zeros(zeros_shape)` inserted right before the `to` of
    conv1's bias (External id 72, 256 bytes HtoD), shapes recorded on both: the `to` and its
    `copy_` (id 75) get `Input Dims` [64] and fp32 types, and `aten::zeros` (children
    `aten::empty`, `aten::zero_`) goes into the 49 µs gap after the last op before it."""
    document = copy.deepcopy(read_json(ALEXNET))
    raw = document["traceEvents"]
    before, to, copy_ = _cpu_op(raw, 71), _cpu_op(raw, 72), _cpu_op(raw, 75)
    to["args"].update({"Input Dims": [[64], [], [], [], []], "Input type": ["float"] + [""] * 4})
    copy_["args"].update({"Input Dims": [[64], [64], []], "Input type": ["float", "float", ""]})
    start = before["ts"] + before["dur"] + 5
    assert start + 40 < to["ts"]

    def op(name: str, ts: float, dur: float, ext: int, dims: list, types: list) -> dict:
        args = {"External id": ext, "Input Dims": dims, "Input type": types}
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": to["pid"], "tid": to["tid"],
                "ts": ts, "dur": dur, "args": args}  # fmt: skip

    raw += [
        op("aten::zeros", start, 40, 90001, [[], [], [], [], []], ["ScalarList"] + [""] * 4),
        op("aten::empty", start + 2, 10, 90002, [[], [], [], [], []], ["ScalarList"] + [""] * 4),
        op("aten::zero_", start + 20, 15, 90003, [zeros_shape], ["float"]),
    ]
    path = tmp_path / f"alexnet-zeros{'x'.join(map(str, zeros_shape))}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(document, f)
    return path


def test_a_zeros_right_before_to_cuda_is_found_with_its_shape(tmp_path: Path) -> None:
    findings = _findings(_edited_alexnet(tmp_path, [64]))
    edited = [f for f in findings if f.evidence["init_name"] == "aten::zero_"]
    (finding,) = edited
    assert finding.evidence["op_names"] == ["aten::zeros", "aten::zero_", "aten::to"]
    assert finding.evidence["shapes_checked"] is True and finding.shapes == [[64]]
    assert finding.evidence["memcpy_bytes"] == 256
    assert len(findings) == 2  # and the uniform_ -> to of the unedited trace


def test_a_filled_tensor_of_another_shape_is_not_the_one_copied(tmp_path: Path) -> None:
    findings = _findings(_edited_alexnet(tmp_path, [32]))
    assert [f.evidence["init_name"] for f in findings] == ["aten::uniform_"]


def test_an_op_that_merely_ends_in_a_scalar_zero_is_not_a_fill() -> None:
    # fbgemm::permute_2D_sparse_data's last child zeroes a 0-dim tensor; the next `to`
    # copies [128]: the matcher's adjacency alone would flag it
    assert _findings(FIXTURES / "gpu" / "hta-sampled_rank-0.json.gz") == []
