"""TQ206 unfused-optimizer with Adam's per-tensor loop, on a trace this project records.

`fixtures/mlp_gelu-train_adam.pt.trace.json.gz` (fixtures/record.py): the MlpGelu training
step with `torch.optim.Adam(foreach=False)`, recorded on the CPU. Per parameter tensor
(fc1/fc2 weight and bias: 4), Adam's `_single_tensor_adam` runs `add_` (the step count),
`lerp_`, `mul_`, `addcmul_`, `sqrt`, `div`, `add_` (eps) and `addcdiv_`: 8 ops, 32 in all.

A CPU-only trace has no launches to batch, so TQ206 is silent there. Judged for a GPU
(`analyze(..., device=...)` with the A100's properties from the bundled AlexNet trace),
the same loop is what TQ206 reports. Expected values come from the raw JSON.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from conftest import FIXTURES, gpu_fixture, read_json, write_json

import traceq
from traceq.analyze import analyze
from traceq.perf.device import gpu_model

ADAM = FIXTURES / "mlp_gelu-train_adam.pt.trace.json.gz"
WINDOW = "Optimizer.step#Adam.step"
UPDATES = {
    "aten::add_",
    "aten::lerp_",
    "aten::mul_",
    "aten::addcmul_",
    "aten::sqrt",
    "aten::div",
    "aten::addcdiv_",
}


def ns(value: Any) -> int:
    return int(Decimal(str(value)) * 1000)


@pytest.fixture(scope="module")
def raw() -> list[dict[str, Any]]:
    return read_json(ADAM, parse_float=Decimal)["traceEvents"]


@pytest.fixture(scope="module")
def a100() -> traceq.perf.device.DeviceModel:
    return gpu_model(read_json(gpu_fixture("hta-alexnet-a100"))["deviceProperties"][0])


def test_tq206_is_silent_on_the_cpu_trace() -> None:
    assert analyze(traceq.load(ADAM), select="TQ206") == []


def test_tq206_reports_adams_per_tensor_loop_for_a_gpu(raw, a100) -> None:
    windows = sorted(
        (i for i, e in enumerate(raw) if e.get("ph") == "X" and e.get("name") == WINDOW),
        key=lambda i: ns(raw[i]["ts"]),
    )
    assert len(windows) == 3  # one per active step
    findings = sorted(
        analyze(traceq.load(ADAM), select="TQ206", device=a100), key=lambda f: f.ops[0]
    )
    assert [f.ops[0] for f in findings] == windows
    for finding, window in zip(findings, windows, strict=True):
        start, end = ns(raw[window]["ts"]), ns(raw[window]["ts"]) + ns(raw[window]["dur"])
        tid = raw[window]["tid"]
        updates = sorted(
            (
                i
                for i, e in enumerate(raw)
                if e.get("ph") == "X"
                and e.get("cat") == "cpu_op"
                and e.get("tid") == tid
                and e["name"] in UPDATES
                and start <= ns(e["ts"]) < end
            ),
            key=lambda i: ns(raw[i]["ts"]),
        )
        tensors = sum(raw[i]["name"] == "aten::addcdiv_" for i in updates)
        assert tensors == 4 and len(updates) == 32
        assert finding.ops == [window, *updates]
        assert finding.evidence["optimizer"] == "Adam"
        assert finding.evidence["tensors"] == tensors
        assert finding.evidence["ops_per_tensor"] == 8
        assert finding.evidence["gpu_busy_us"] == 0  # recorded on the CPU: no kernels
        assert finding.time_us == pytest.approx((end - start) / 1000)
        assert finding.est_saving_us == pytest.approx((end - start) * (1 - 8 / 32) / 1000)
        assert "torch.optim.Adam(..., fused=True)" in finding.fix


def test_tq206_leaves_adam_alone_once_it_is_batched(raw, a100, tmp_path) -> None:
    """One `_foreach_` op in each step (what `foreach=True` records): nothing to report."""
    document = read_json(ADAM, parse_float=Decimal)
    events = document["traceEvents"]
    for window in (e for e in events if e.get("name") == WINDOW):
        start, end = ns(window["ts"]), ns(window["ts"]) + ns(window["dur"])
        first = next(
            e for e in events if e.get("name") == "aten::lerp_" and start <= ns(e["ts"]) < end
        )
        first["name"] = "aten::_foreach_lerp_"
    path = write_json(document, tmp_path / "foreach.json")
    assert analyze(traceq.load(path), select="TQ206", device=a100) == []
