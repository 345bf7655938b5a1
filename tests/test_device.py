"""The device model behind savings: datasheet figures matched from `deviceProperties`,
fallbacks by compute capability, and launch/dispatch costs measured on the trace.

Real traces: HTA test data (MIT) and TraceLens test data (MIT) from `../shared/traces`.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import traceq
from traceq.perf.device import cpu_model, device_model, gpu_model

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def props(name: str, major: int, minor: int, mem_gb: float, warp: int = 32) -> dict:
    return {
        "id": 0,
        "name": name,
        "computeMajor": major,
        "computeMinor": minor,
        "totalGlobalMem": int(mem_gb * 1e9),
        "warpSize": warp,
        "numSms": 108,
    }


@pytest.mark.parametrize(
    ("entry", "bandwidth", "tf32", "tensor"),
    [
        (props("NVIDIA H100 80GB HBM3", 9, 0, 85), 3350, 495, True),
        (props("NVIDIA A100-PG509-200", 8, 0, 42), 1555, 156, True),
        (props("NVIDIA A100-SXM4-80GB", 8, 0, 85), 2039, 156, True),
        (props("Tesla V100-SXM2-32GB", 7, 0, 34), 900, None, True),
        (props("AMD Radeon Graphics", 9, 0, 68.7, warp=64), 1638, None, True),  # MI250 GCD
        (props("AMD Instinct MI300X", 9, 4, 206, warp=64), 5300, 653.7, True),
    ],
)
def test_known_gpus_get_datasheet_figures(entry, bandwidth, tf32, tensor) -> None:
    model = gpu_model(entry)
    assert model.memory_bandwidth_gbs == bandwidth
    assert model.tf32_tflops == tf32 and model.tensor_cores is tensor
    assert "datasheet" in model.source and model.num_sms == 108


@pytest.mark.parametrize(
    ("cc", "tensor", "tf32"), [((6, 1), False, None), ((7, 5), True, None), ((8, 9), True, 80)]
)
def test_unknown_gpus_are_assumed_by_compute_capability(cc, tensor, tf32) -> None:
    model = gpu_model(props("Some Future GPU", *cc, 16))
    assert model.tensor_cores is tensor and model.tf32_tflops == tf32
    assert model.source.startswith("assumed from compute capability")


def test_launch_overhead_is_the_median_launch_call_of_the_trace(load_shared) -> None:
    trace = load_shared("tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    model = device_model(trace)
    launches = trace.runtime.filter(
        pl.col("name").is_in(["cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel"])
    )["dur_ns"]
    assert model.launch_overhead_us == pytest.approx(launches.median() / 1000)
    assert model.name == "NVIDIA H100 80GB HBM3"


def test_cpu_only_traces_get_the_cpu_model() -> None:
    trace = traceq.load(FIXTURES / "linear-eager.pt.trace.json.gz")
    model = device_model(trace)
    assert model.kind == "cpu" and model.memory_bandwidth_gbs == 50.0
    assert model.transfer_us(50e3) == pytest.approx(1.0)  # 50 kB at 50 GB/s


def test_cpu_dispatch_cost_ignores_ops_traced_during_compilation() -> None:
    # Every view-like op of the cold-compile trace outside compilation is a real dispatch;
    # the ones inside run on fake tensors and take far longer.
    trace = traceq.load(FIXTURES / "geglu_mlp-compiled_cold.pt.trace.json.gz")
    model = cpu_model(trace)
    views = trace.ops.filter(pl.col("name").is_in(["aten::view", "aten::t", "aten::reshape"]))
    assert views.height >= 20
    assert model.launch_overhead_us < views["dur_ns"].median() / 1000
