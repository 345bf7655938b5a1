"""Device peaks and the throughput a time implies."""

from __future__ import annotations

import pytest
from traceq.zoo.device import DevicePeak, peak_for_name
from traceq.zoo.timing import throughput


@pytest.mark.parametrize(
    ("name", "bf16", "gbps"),
    [
        ("NVIDIA H200", 989.5, 4800.0),
        ("NVIDIA H100 80GB HBM3", 989.5, 3350.0),
        ("NVIDIA H100 PCIe", 756.0, 2000.0),
        ("NVIDIA A100-SXM4-80GB", 312.0, 2039.0),
        ("NVIDIA A100-SXM4-40GB", 312.0, 1555.0),
        ("NVIDIA L4", 121.0, 300.0),
    ],
)
def test_known_cards_get_their_datasheet_peaks(name: str, bf16: float, gbps: float) -> None:
    peak = peak_for_name(name)
    assert peak is not None
    assert peak.tflops["bfloat16"] == bf16 and peak.gbps == gbps


def test_unknown_cards_get_no_made_up_peak() -> None:
    assert peak_for_name("NVIDIA GeForce GTX 1080") is None


def test_throughput_divides_work_by_time_and_by_the_peak() -> None:
    peak = DevicePeak("card", {"bfloat16": 1000.0}, 4000.0)
    timing = throughput(2.0, "do_bench median", 4 * 10**12, 4 * 10**9, "bfloat16", peak)
    assert timing.tflops == pytest.approx(2000.0)
    assert timing.gbps == pytest.approx(2000.0)
    assert timing.peak_tflops_fraction == pytest.approx(2.0)
    assert timing.peak_gbps_fraction == pytest.approx(0.5)
    pointwise = throughput(1.0, "m", None, 10**9, "float32", peak)
    assert pointwise.tflops is None and pointwise.peak_tflops_fraction is None
